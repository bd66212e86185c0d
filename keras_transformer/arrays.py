"""Translating and scoring a packed workdir without TensorFlow: Keras on any backend and SentencePiece.

`keras-transformer pack` writes a workdir that trains on any Keras backend (`keras-transformer train-packed`,
`trainer.packed.train_arrays`). On that machine there may be no TensorFlow: `PackedTranslator` decodes its model
with the package's own searches (`keras_transformer.decoding`) and the SentencePiece vocabulary, and
`evaluate_arrays` scores it (`keras-transformer train-packed W --evaluate SOURCE REFERENCE`). The workdir also
serves every TensorFlow-side command unchanged: `keras-transformer evaluate --model W --average N ...`,
`export --workdir W`.

This module needs only keras, numpy, sentencepiece and the package itself: no TensorFlow.
"""

import json
import pathlib
import typing

import keras
import numpy as np

from keras_transformer import decoding, evaluation
from keras_transformer.attention_maps import attention_maps, strip_special
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import ConfigError
from keras_transformer.files import atomic_write
from keras_transformer.interface import TranslatorInterface, check_pairs
from keras_transformer.model import parts
from keras_transformer.workdir import load_models


class PackedTranslator(TranslatorInterface):
    """The translator of the packed path: Keras on any backend and SentencePiece, no TensorFlow.

    It does what `translation.Translator` does for the TensorFlow engine
    (`interface.TranslatorInterface`): sentences are tokenized (at most
    `max_length - 1` tokens, then eos), decoded longest first in batches whose
    width is rounded up to a multiple of 8 (few shapes) with the options'
    strategy (`keras_transformer.decoding`), and detokenized; blank lines give "".
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

    def __init__(self, model, processors, config, options=None, **settings):
        self.model, self.processors, self.config = model, tuple(processors), config
        self.options = (options or DecodeOptions()).replace(**settings)

    @classmethod
    def from_folder(cls, path, checkpoint=None, average=None, options=None, **settings):
        """The packed translator of a workdir or SavedModel export (`workdir.load_models`), with its
        SentencePiece vocabulary and, by default, its decoding options.

        Example:

        >>> translator = PackedTranslator.from_folder("saved_models/multi30k_en_de")  # doctest: +SKIP
        """
        loaded = load_models(path, checkpoint, average, require_vocabulary=True)
        if len(loaded.models) != 1:
            raise ConfigError(f"{path} holds an ensemble of {len(loaded.models)} models; the packed translator "
                              "decodes one.")
        return cls(loaded.models[0], sentencepiece_processors(loaded.vocab_dir), loaded.configs[0],
                   options or loaded.decoding, **{k: v for k, v in settings.items() if v is not None})

    def _source_ids(self, line):
        max_source = parts(self.model).source_position.max_length
        text = _text(line)
        return self.processors[0].encode(text)[:max_source - 1] + [self.config.eos_id] if text.strip() else []

    def _decode(self, lines, batch_size, num_return):
        """Per line, `num_return` `(token ids without specials, score)` pairs; blank lines give `[]`."""
        if isinstance(lines, (str, bytes)):
            raise TypeError(f"PackedTranslator takes a list of sentences, got one {type(lines).__name__}: "
                            f"{lines[:40]!r}.")
        config, options = self.config, self.options.replace(n_best=num_return)
        ids = [self._source_ids(line) for line in lines]
        order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: -len(ids[i]))
        results = [[] for _ in ids]
        max_source = parts(self.model).source_position.max_length
        for start in range(0, len(order), int(batch_size)):
            chunk = order[start:start + int(batch_size)]
            width = min(max_source, -(-len(ids[chunk[0]]) // 8) * 8)
            source = np.full((len(chunk), width), config.pad_id, np.int32)
            for row, index in enumerate(chunk):
                source[row, :len(ids[index])] = ids[index]
            tokens, scores = decoding.strategy(options.strategy)(
                [self.model], source, options, pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id)
            tokens, scores = keras.ops.convert_to_numpy(tokens), keras.ops.convert_to_numpy(scores)
            for row, index in enumerate(chunk):
                results[index] = [(strip_special(tokens[row, r], config.eos_id, config.pad_id, config.bos_id),
                                   float(scores[row, r])) for r in range(num_return)]
        return results

    def translate_lines(self, lines, batch_size=64):
        """One translation per line (`TranslatorInterface.translate_lines`)."""
        decode = self.processors[1].decode
        return [decode(hypotheses[0][0]) if hypotheses else "" for hypotheses in self._decode(lines, batch_size, 1)]

    def n_best_lines(self, lines, batch_size=64):
        """Per line, `options.returned()` `(translation, score)` pairs (`TranslatorInterface.n_best_lines`)."""
        returned, decode = self.options.returned(), self.processors[1].decode
        return [[(decode(ids), score) for ids, score in hypotheses] if hypotheses else [("", 0.0)] * returned
                for hypotheses in self._decode(lines, batch_size, returned)]

    def score_lines(self, sources, targets, batch_size=64):
        """Forced decoding (`decoding.score`; `TranslatorInterface.score_lines`)."""
        sources, targets = check_pairs("PackedTranslator.score_lines", sources, targets)
        config = self.config
        max_target = decoding.max_positions(self.model)
        alpha = self.options.alpha if self.options.strategy == "beam" else 0.0
        scores = []
        for start in range(0, len(sources), int(batch_size)):
            source_ids = [self._source_ids(s) or [config.eos_id] for s in sources[start:start + int(batch_size)]]
            target_ids = [self.processors[1].encode(_text(t))[:max_target - 1] + [config.eos_id]
                          for t in targets[start:start + int(batch_size)]]
            source = _padded(source_ids, config.pad_id)
            target = _padded(target_ids, config.pad_id)
            batch = decoding.score([self.model], source, target, alpha=alpha, pad_id=config.pad_id,
                                   bos_id=config.bos_id)
            scores += [float(x) for x in keras.ops.convert_to_numpy(batch)]
        return scores

    def attention(self, sentence, translation=None):
        """The `AttentionMaps` of `sentence` and its translation (or `translation`), as the TensorFlow engine's."""
        text = _text(sentence)
        if not text.strip():
            raise ValueError(f"PackedTranslator.attention needs a non-empty sentence, got {sentence!r}.")
        config = self.config
        if translation is None:
            target_ids = self._decode([text], 1, 1)[0][0][0]
        else:
            target_ids = self.processors[1].encode(_text(translation))
        target_ids = target_ids[: decoding.max_positions(self.model) - 1]
        source, target = self.processors

        def pieces(processor):
            return lambda ids: [processor.id_to_piece(int(i)) for i in ids]

        return attention_maps(self.model, self._source_ids(text), target_ids, (pieces(source), pieces(target)),
                              target.decode(target_ids), bos_id=config.bos_id, eos_id=config.eos_id,
                              pad_id=config.pad_id)


def _text(line):
    """A line as text: bytes as UTF-8 with bad bytes replaced, and Python's lone surrogates (undecodable bytes of
    arguments and stdin) as U+FFFD, as the TensorFlow engine reads them."""
    if isinstance(line, bytes):
        return line.decode("utf-8", "replace")
    if not isinstance(line, str):
        raise TypeError(f"PackedTranslator: sentences must be str (or UTF-8 bytes), got {type(line).__name__}.")
    return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if any(
        "\ud800" <= c <= "\udfff" for c in line) else line


def _padded(rows, pad_id):
    """Lists of ids as one int32 `(len(rows), longest)` array padded with `pad_id`."""
    array = np.full((len(rows), max(len(r) for r in rows)), pad_id, np.int32)
    for index, row in enumerate(rows):
        array[index, :len(row)] = row
    return array


# ------------------------------------------------------------------ scoring without TensorFlow
def sentencepiece_processors(vocab_dir):
    """`(source, target)` SentencePiece processors of a workdir's `data/vocab` (shared or separate), no TensorFlow."""
    import sentencepiece  # the TensorFlow-free tokenizer, needed only for scoring here

    vocab_dir = pathlib.Path(vocab_dir)
    folders = [vocab_dir] if (vocab_dir / "tokenizer.json").is_file() else [vocab_dir / "source", vocab_dir / "target"]
    processors = []
    for folder in folders:
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"No tokenizer at {folder}: expected tokenizer.json (keras-transformer pack "
                                    "writes data/vocab).")
        settings = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        if settings.get("model_type") not in ("bpe", "unigram"):
            raise NotImplementedError(f"Scoring without TensorFlow reads SentencePiece vocabularies (bpe, unigram); "
                                      f"{folder} is {settings.get('model_type')!r}: use keras-transformer evaluate.")
        processors.append(sentencepiece.SentencePieceProcessor(model_file=str(folder / settings["model_file"])))
    return processors[0], processors[-1]


def translate_lines(model, lines, source_processor, target_processor, *, options=None, batch_size=128, eos_id=3,
                    pad_id=0, bos_id=2, **settings):
    """Decodes raw sentences with SentencePiece processors, on any Keras backend (no TensorFlow).

    Does what `Translator.translate_lines` does: sentences are tokenized (at most
    `max_length - 1` tokens, then eos), decoded longest first in batches whose
    width is rounded up to a multiple of 8 (few shapes), and detokenized;
    blank lines translate to "".

    Args:
        model: a `build_model` model.
        lines: source sentences (str).
        source_processor, target_processor: `sentencepiece.SentencePieceProcessor`s.
        options: a `keras_transformer.decoding.DecodeOptions` (default: the paper's beam search);
            `settings` (`beam_size=5`, ...) replace its fields. With sampling, a sentence's draws
            depend on the seed and the sentence, as in `Translator`.
        batch_size: sentences per batch.
        eos_id, pad_id, bos_id: special ids.

    Returns:
        The translations, in the order of `lines`.
    """
    return PackedTranslator(model, (source_processor, target_processor), _SpecialIds(pad_id, bos_id, eos_id),
                            options, **settings).translate_lines(lines, batch_size=batch_size)


class _SpecialIds(typing.NamedTuple):
    """The special ids `PackedTranslator` reads from a config."""

    pad_id: int
    bos_id: int
    eos_id: int


def evaluate_arrays(workdir, checkpoint, source, reference, *, average=None, tokenized_reference=None, lang=None,
                    options=None, batch_size=128, output=None, **settings):
    """Translates `source` with a packed workdir's weights and scores it, without TensorFlow.

    The TensorFlow-free twin of `keras-transformer evaluate` for a machine that
    trains with `train_arrays` (a GPU machine with JAX): it reads the
    workdir as every loader does (`PackedTranslator.from_folder`), decodes with
    its options and scores with `evaluation.evaluate_translations`.
    Needs the `sentencepiece` package (and `sacremoses` for the Multi30k protocol).

    Args:
        workdir: a packed workdir (`keras-transformer pack`).
        checkpoint: a `.weights.h5` file (e.g. `averaged.weights.h5`); None: the last epoch checkpoint,
            or the mean of the last `average` ones.
        source, reference: text files, one sentence per line (plain or .gz).
        tokenized_reference, lang: optional `*.lc.norm.tok.*` references and
            the target language, for the published Multi30k protocol.
        options, **settings: the decoding (default: the workdir's model.yaml's options; `settings`
            replace fields, None values change nothing).
        batch_size: sentences decoded together.
        output: optional path to write the translations to.

    Returns:
        The dict of `evaluation.evaluate_translations` (cased and lowercased
        sacreBLEU, and `bleu_multi30k` with `tokenized_reference`).
    """

    translator = PackedTranslator.from_folder(workdir, checkpoint, average, options, **settings)
    lines = evaluation.read_lines(source)
    references = evaluation.read_lines(reference)
    hypotheses = translator.translate_lines(lines, batch_size=batch_size)
    hypotheses = [evaluation.one_line(h) for h in hypotheses]  # one line each in the output file, as scored
    if output:
        atomic_write(output, lambda path: pathlib.Path(path).write_text("".join(h + "\n" for h in hypotheses),
                                                                  encoding="utf-8"))
    tokenized = evaluation.read_lines(tokenized_reference) if tokenized_reference else None
    return evaluation.evaluate_translations(hypotheses, references, lang=lang, tokenized_references=tokenized)


if __name__ == "__main__":  # the module's command line before there was one command
    raise SystemExit("python -m keras_transformer.arrays is now `keras-transformer train-packed` (the same arguments).")
