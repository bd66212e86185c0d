"""`PackedTranslator`: the engine of the packed path, Keras on any backend and SentencePiece, no TensorFlow.

A machine that trains from packed arrays (`keras_transformer.packed.scoring`, JAX on a GPU) decodes and scores with it:
the model's own search (`keras_transformer.decoding`) over SentencePiece ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import keras
import numpy as np

from keras_transformer import decoding
from keras_transformer.attention.maps import AttentionMaps, attention_maps, strip_special
from keras_transformer.config import TransformerConfig
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.engines.details import Translation
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.lines import check_prefix_ids, clean_line, is_blank
from keras_transformer.errors import ConfigError
from keras_transformer.model import parts
from keras_transformer.workdir.checkpoints import load_models
from keras_transformer.workdir.layout import SENTENCEPIECE_MODELS, TOKENIZER_SETTINGS, tokenizer_folders


class PackedTranslator(TranslatorInterface):
    """The translator of the packed path: Keras on any backend and SentencePiece, no TensorFlow.

    It does what `engines.tensorflow.Translator` does for the TensorFlow engine, with the line handling of
    `interface.TranslatorInterface`: sentences are tokenized (at most `max_length - 1` tokens, then eos),
    decoded in batches whose width is rounded up to a multiple of 8 (few shapes) with the options' strategy
    (`keras_transformer.decoding`), and detokenized.
    `trainer.callbacks.BleuCallback` validates the packed trainer's model with it.

    Args:
        model: a `build_model` model.
        processors: `(source, target)` `sentencepiece.SentencePieceProcessor`s (`sentencepiece_processors`).
        config: the model's `TransformerConfig` (its special ids).
        options: a `keras_transformer.decoding.DecodeOptions` (default: the paper's beam search); `settings`
            (`beam_size=5`, ...) replace its fields.

    Example:

    >>> translator = PackedTranslator.from_folder("runs/packed", average=5)  # doctest: +SKIP
    >>> translator.translate_lines(["A dog runs."])  # doctest: +SKIP
    ['Ein Hund rennt.']
    """

    engine = "packed"
    strategies = tuple(STRATEGIES)  # every registered strategy: the search is `decoding.strategy(name)`

    def __init__(self, model: Any, processors: Iterable[Any], config: TransformerConfig | Any,
                 options: DecodeOptions | None = None, **settings: Any) -> None:
        self.model, self.processors, self.config = model, tuple(processors), config
        self.options = self.check_options((options or DecodeOptions()).replace(**settings))

    @classmethod
    def load(cls, paths: list[Any], checkpoint: Any = None, average: int | None = None,
             options: DecodeOptions | None = None, **settings: Any) -> PackedTranslator:
        """`from_folder` of the one folder in `paths` (`TranslatorInterface.load`): no ensembles."""
        if len(paths) > 1:
            raise ConfigError(f"The packed engine decodes one model, and {len(paths)} were given: decode an "
                              "ensemble with the TensorFlow engine.")
        return cls.from_folder(paths[0], checkpoint, average, options, checked=True, **settings)

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str], checkpoint: Any = None, average: int | None = None,
                    options: DecodeOptions | None = None, checked: bool = False, **settings: Any) -> PackedTranslator:
        """The packed translator of a workdir or SavedModel export (`workdir.load_models`, `checked` as there),
        with its SentencePiece vocabulary and, by default, its decoding options.

        Example:

        >>> translator = PackedTranslator.from_folder("saved_models/multi30k_en_de")  # doctest: +SKIP
        """
        loaded = load_models(path, checkpoint, average, require_vocabulary=True, checked=checked)
        if len(loaded.models) != 1:
            raise ConfigError(f"{path} holds an ensemble of {len(loaded.models)} models; the packed translator "
                              "decodes one.")
        assert loaded.vocab_dir is not None  # require_vocabulary
        return cls(loaded.models[0], sentencepiece_processors(loaded.vocab_dir), loaded.configs[0],
                   options or loaded.decoding, **{k: v for k, v in settings.items() if v is not None})

    def with_options(self, options: DecodeOptions) -> PackedTranslator:
        """A packed translator of the same model decoding with `options` (`TranslatorInterface.with_options`):
        the weights are shared; `self` when `options` are its own.

        Example:

        >>> greedy = translator.with_options(translator.options.replace(strategy="greedy"))  # doctest: +SKIP
        """
        if options == self.options:
            return self
        return PackedTranslator(self.model, self.processors, self.config, options)

    def _source_ids(self, text: str) -> list[int]:
        """A cleaned text's source ids: at most `max_length - 1` tokens, then eos."""
        max_source = parts(self.model).source_position.max_length
        return self.processors[0].encode(text)[:max_source - 1] + [self.config.eos_id]

    def target_prefix_ids(self, prefixes: list[str]) -> list[list[int]]:
        """Per prefix text, its forced target ids (SentencePiece, no eos), checked (`lines.check_prefix_ids`)."""
        target, limit = self.processors[1], decoding.max_positions(self.model)
        return [check_prefix_ids("PackedTranslator", text, target.encode(text), target.unk_id(), limit)
                for text in prefixes]

    def _decode(self, texts: list[str], num_return: int,
                prefixes: list[str] | None = None) -> list[list[tuple[list[int], float, int]]]:
        """Per text (cleaned, not blank), `num_return` `(token ids without specials, score, tokens generated)`:
        one search over the batch, its width rounded up to a multiple of 8 (few shapes); with `prefixes`, each
        output starts with its text's prefix (the prefix width rounded up likewise). The tokens generated are
        those the score counts: the prefix's and eos included."""
        config, options = self.config, self.options.replace(n_best=num_return)
        ids = [self._source_ids(text) for text in texts]
        max_source = parts(self.model).source_position.max_length
        width = min(max_source, -(-max(len(row) for row in ids) // 8) * 8)
        source = _padded(ids, config.pad_id, width)
        forced = {}
        if prefixes is not None:
            prefix_ids = self.target_prefix_ids(prefixes)
            forced["target_prefix"] = _padded(prefix_ids, config.pad_id, -(-max(map(len, prefix_ids)) // 8) * 8)
        tokens, scores = decoding.strategy(options.strategy)(
            [self.model], source, options, pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id,
            **forced)
        tokens, scores = keras.ops.convert_to_numpy(tokens), keras.ops.convert_to_numpy(scores)
        return [[(strip_special(tokens[row, r], config.eos_id, config.pad_id, config.bos_id), float(scores[row, r]),
                  int(np.sum(tokens[row, r] != config.pad_id))) for r in range(num_return)]
                for row in range(len(texts))]

    def translate_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[str]:
        """One translation per cleaned, non-blank text (`TranslatorInterface.translate_lines` calls it); with
        `prefixes`, each starting with its prefix."""
        decode = self.processors[1].decode
        return [decode(hypotheses[0][0]) for hypotheses in self._decode(texts, 1, prefixes)]

    def n_best_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[tuple[str, float]]]:
        """Per cleaned, non-blank text, `returned()` `(translation, score)` pairs (`n_best_lines` calls it); with
        `prefixes`, each starting with its text's prefix."""
        decode = self.processors[1].decode
        return [[(decode(ids), score) for ids, score, _ in hypotheses]
                for hypotheses in self._decode(texts, self.returned(), prefixes)]

    def details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[Translation]:
        """Per cleaned, non-blank text, its best translation as a `details.Translation` (`translate_detailed`)."""
        decode = self.processors[1].decode
        return [Translation.from_score(decode(ids), score, tokens, self.scoring_alpha)
                for (ids, score, tokens), *_ in self._decode(texts, 1, prefixes)]

    def n_best_details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[Translation]]:
        """Per cleaned, non-blank text, `returned()` translations as `details.Translation`s (`n_best_detailed`)."""
        decode = self.processors[1].decode
        return [[Translation.from_score(decode(ids), score, tokens, self.scoring_alpha) for ids, score, tokens in
                 hypotheses] for hypotheses in self._decode(texts, self.returned(), prefixes)]

    def count_source_tokens(self, text: str) -> int:
        """The source SentencePiece model's tokens of `text` (without eos), for `translate_document`'s budget."""
        return len(self.processors[0].encode(text))

    def score_batch(self, sources: list[str], targets: list[str]) -> list[float]:
        """Forced decoding of cleaned pairs (`decoding.score`; `score_lines` calls it)."""
        config = self.config
        max_target = decoding.max_positions(self.model)
        target_ids = [self.processors[1].encode(text)[:max_target - 1] + [config.eos_id] for text in targets]
        batch = decoding.score([self.model], _padded([self._source_ids(text) for text in sources], config.pad_id),
                               _padded(target_ids, config.pad_id), alpha=self.scoring_alpha, pad_id=config.pad_id,
                               bos_id=config.bos_id)
        return [float(x) for x in keras.ops.convert_to_numpy(batch)]

    def attention(self, sentence: str, translation: str | None = None) -> AttentionMaps:
        """The `AttentionMaps` of `sentence` and its translation (or `translation`), as the TensorFlow engine's."""
        text = clean_line(sentence, "PackedTranslator.attention")
        if is_blank(text):
            raise ValueError(f"PackedTranslator.attention needs a non-empty sentence, got {sentence!r}.")
        config = self.config
        if translation is None:
            target_ids = self._decode([text], 1)[0][0][0]
        else:
            target_ids = self.processors[1].encode(clean_line(translation, "PackedTranslator.attention"))
        target_ids = target_ids[: decoding.max_positions(self.model) - 1]
        source, target = self.processors

        def pieces(processor: Any) -> Callable[[Sequence[int]], list[str]]:
            return lambda ids: [processor.id_to_piece(int(i)) for i in ids]

        return attention_maps(self.model, self._source_ids(text), target_ids, (pieces(source), pieces(target)),
                              target.decode(target_ids), bos_id=config.bos_id, eos_id=config.eos_id,
                              pad_id=config.pad_id)


def _padded(rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> np.ndarray:
    """Lists of ids as one int32 `(len(rows), width)` array padded with `pad_id` (default width: the longest)."""
    array = np.full((len(rows), width or max(len(r) for r in rows)), pad_id, np.int32)
    for index, row in enumerate(rows):
        array[index, :len(row)] = row
    return array


def sentencepiece_processors(vocab_dir: str | os.PathLike[str]) -> tuple[Any, Any]:
    """`(source, target)` SentencePiece processors of a workdir's `data/vocab` (shared or separate), no TensorFlow."""
    import sentencepiece  # the TensorFlow-free tokenizer, needed only for scoring here

    processors = []
    for folder in tokenizer_folders(vocab_dir):
        if not (folder / TOKENIZER_SETTINGS).is_file():
            raise FileNotFoundError(f"No tokenizer at {folder}: expected {TOKENIZER_SETTINGS} (keras-transformer "
                                    "pack writes data/vocab).")
        settings = json.loads((folder / TOKENIZER_SETTINGS).read_text(encoding="utf-8"))
        if settings.get("model_type") not in SENTENCEPIECE_MODELS:
            raise NotImplementedError(f"Scoring without TensorFlow reads SentencePiece vocabularies (bpe, unigram); "
                                      f"{folder} is {settings.get('model_type')!r}: use keras-transformer evaluate.")
        processors.append(sentencepiece.SentencePieceProcessor(model_file=str(folder / settings["model_file"])))
    return processors[0], processors[-1]
