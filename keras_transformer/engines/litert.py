"""Serving a LiteRT (TensorFlow Lite) export: `LiteRTTranslator`, the search inside `model.tflite`, no TensorFlow.

A folder written by `exports.litert.export_litert` (`keras-transformer export --format litert`) holds one
`model.tflite` whose signatures run the whole cached search (greedy and beam search, with the key/value cache, the
length limit and the length penalty) on token ids, in LiteRT's built-in operators only. This engine tokenizes with
`sentencepiece`, calls a signature through the `ai-edge-litert` interpreter (the ``litert`` extra:
``pip install ".[litert]"``) and detokenizes: it imports neither Keras nor TensorFlow, so a phone, a laptop or a
small server needs only ``ai-edge-litert``, ``sentencepiece`` and ``numpy``.

The decoding the export records (beam size, alpha, max_extra, early exit) is part of the graph: this engine
decodes with those, or with the greedy signature, and refuses other values by name (export again to change them).
docs/litert.md describes the files and the signatures for an app that calls them itself.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import sys
from contextlib import nullcontext
from typing import Any

import numpy as np

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.ctranslate2_cpu import default_intra_threads
from keras_transformer.engines.details import Translation
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.lines import Lines, check_prefix_ids
from keras_transformer.engines.subwords import load_processors, mapped_pieces, mapped_text, source_end
from keras_transformer.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from keras_transformer.runtime.tensorflow_logs import tensorflow_logs_wanted, without_cpp_log_lines
from keras_transformer.workdir.layout import LITERT_METADATA, LITERT_MODEL

FORMAT = "keras_transformer.litert"
FORMAT_VERSION = 1
# `export --format litert --precision`: float32 weights; float16 weights (computed in float32, or in float16 where
# the delegate can); int8 dynamic-range weights (XNNPACK's int8 kernels, activations quantized on the fly).
PRECISIONS = ("float32", "float16", "int8")
# The signature of each strategy in `model.tflite`: source_ids int32 (N, S) -> tokens int32 (N, K, T), score float32
# (N, K), K = beam_size for "beam" and 1 for "greedy".
SEARCH_SIGNATURES = {"beam": "beam_search", "greedy": "greedy"}
SCORE_SIGNATURE = "score"  # source_ids int32 (N, S), target_ids int32 (N, T) -> log P(target) float32 (N,)
# The settings a search signature holds as constants: other values need another export.
BAKED = ("beam_size", "alpha", "max_extra", "early_exit")


def is_litert_model(path: str | os.PathLike[str]) -> bool:
    """True if `path` is a folder written by `export_litert` (``litert.json`` of this format beside ``model.tflite``).

    Example:

    >>> import tempfile
    >>> is_litert_model(tempfile.mkdtemp())
    False
    """
    path = pathlib.Path(path)
    if not ((path / LITERT_METADATA).is_file() and (path / LITERT_MODEL).is_file()):
        return False
    try:
        return json.loads((path / LITERT_METADATA).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_metadata(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``litert.json`` of a LiteRT export, checked.

    Raises:
        CheckpointNotFoundError: `directory` is not a LiteRT export (what it lacks named).
        CheckpointError: it was written by a newer version of the package.

    Example:

    >>> read_metadata("exports/en_de_litert")["precision"]  # doctest: +SKIP
    'int8'
    """
    if not is_litert_model(directory):
        raise CheckpointNotFoundError(f"{directory} is not a LiteRT export: {LITERT_METADATA} (format {FORMAT}) and "
                                      f"{LITERT_MODEL} are expected; write one with keras-transformer export --format "
                                      "litert.")
    metadata: dict[str, Any] = json.loads((pathlib.Path(directory) / LITERT_METADATA).read_text(encoding="utf-8"))
    if metadata.get("version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{directory} was written by a newer keras_transformer (LiteRT format version "
                              f"{metadata['version']} > {FORMAT_VERSION}); upgrade the package.")
    return metadata


def padded_ids(rows: list[list[int]], pad_id: int) -> np.ndarray:
    """Lists of ids as one int32 `(len(rows), longest)` array padded with `pad_id`.

    Example:

    >>> padded_ids([[5, 3], [7, 8, 3]], 0).tolist()
    [[5, 3, 0], [7, 8, 3]]
    """
    array = np.full((len(rows), max(len(row) for row in rows)), pad_id, np.int32)
    for index, row in enumerate(rows):
        array[index, :len(row)] = row
    return array


class LiteRTTranslator(TranslatorInterface):
    """Translates with a LiteRT export: SentencePiece, then the search signature of `model.tflite`, no TensorFlow.

    Strings in, strings out, with the line handling of `TranslatorInterface`: over-long sources keep their first
    ``max_length - 1`` pieces, and every input gives exactly one output. The search is the package's own
    (`keras_transformer.decoding`), converted: a float32 export gives the token ids and scores of the SavedModel.

    Args:
        directory: a folder written by `export_litert`.
        options: a `DecodeOptions` (default: those recorded at export); `settings` (`strategy="greedy"`, ...)
            replace its fields. Beam search decodes with the recorded beam size, alpha, max_extra and early
            exit (they are constants of the graph); greedy decoding with the recorded max_extra.
        intra_threads: the interpreter's threads (None or 0: `OMP_NUM_THREADS`, else every usable CPU).

    Raises:
        CheckpointNotFoundError: `directory` is not a LiteRT export.
        CheckpointError: `model.tflite` cannot be read (a truncated or changed file, named).
        ConfigError: options the export cannot decode with (the setting and the recorded value named).

    Example:

    >>> translator = LiteRTTranslator("exports/en_de_litert", intra_threads=2)  # doctest: +SKIP
    >>> translator(["A man rides a bike."])  # doctest: +SKIP
    ['Ein Mann fährt Fahrrad.']
    """

    engine = "litert"

    def __init__(self, directory: str | os.PathLike[str], options: DecodeOptions | None = None, *,
                 intra_threads: int | None = None, **settings: Any) -> None:
        self.directory = os.fspath(directory)
        self.metadata = read_metadata(self.directory)
        self.recorded = DecodeOptions.from_dict(self.metadata["decoding"], where=f"{self.directory}: decoding")
        self.strategies = tuple(strategy for strategy, name in SEARCH_SIGNATURES.items()
                                if name in self.metadata["signatures"])
        self.options = self.check_options((options or self.recorded).replace(**settings))
        self.intra_threads = int(intra_threads or default_intra_threads(1))
        special = self.metadata["special_ids"]
        self.pad_id, self.bos_id, self.eos_id = special["pad_id"], special["bos_id"], special["eos_id"]
        self.max_source_length: int = int(self.metadata["max_source_length"])
        self.max_target_length = int(self.metadata["max_target_length"])
        from ai_edge_litert.interpreter import Interpreter

        self.source_processor, self.target_processor = load_processors(self.directory, self.metadata["sentencepiece"])
        # An imported vocabulary ("mapped"): SentencePiece's pieces numbered by the export's vocabulary files
        self.mapped = self.metadata.get("tokenization") == "mapped"
        languages = self.metadata.get("languages") or {}
        self._languages = {side: tuple(languages.get(side, {}).get("languages", ())) for side in ("source", "target")}
        self._language = {side: languages.get(side, {}).get("language") for side in ("source", "target")}
        self._split = {side: tuple(languages.get(side, {}).get("split_tokens", ())) for side in ("source", "target")}
        self._language_last = {side: bool(languages.get(side, {}).get("language_last"))
                               for side in ("source", "target")}
        self._ids: dict[str, dict[str, int]] = {}
        self._dropped = {self.pad_id, self.bos_id}
        if self.mapped:
            self.target_tokens = self._vocabulary("target")
            self._ids = {"source": {token: i for i, token in enumerate(self._vocabulary("source"))},
                         "target": {token: i for i, token in enumerate(self.target_tokens)}}
            target = languages.get("target", {})
            self._dropped |= {self.metadata["special_ids"]["unk_id"]} | {
                self._ids["target"][token] for token in list(target.get("languages", [])) +
                list(target.get("special_tokens", [])) if token in self._ids["target"]}
        path = os.path.join(self.directory, LITERT_MODEL)
        try:
            with nullcontext() if tensorflow_logs_wanted() else without_cpp_log_lines():  # its INFO line at load
                self.interpreter = Interpreter(model_path=path, num_threads=self.intra_threads)
                self.interpreter.allocate_tensors()  # applies the XNNPACK delegate, which logs
        except (ValueError, RuntimeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CheckpointError(f"{path} cannot be read by LiteRT ({reason}): the file is truncated or not a LiteRT "
                                  "model. Copy the export again from a whole copy, or export it again.") from None

    @classmethod
    def load(cls, paths: list[Any], checkpoint: Any = None, average: int | None = None,
             options: DecodeOptions | None = None, **settings: Any) -> LiteRTTranslator:
        """The translator of the one LiteRT export in `paths` (`TranslatorInterface.load`; `engines.loader`
        refused ensembles and weights options already)."""
        return cls(paths[0], options, **settings)

    def check_options(self, options: DecodeOptions) -> DecodeOptions:
        """`TranslatorInterface.check_options`, and the settings that are constants of the graph must be the
        recorded ones (`BAKED`; greedy decoding only its max_extra)."""
        options = super().check_options(options)
        baked = BAKED if options.strategy == "beam" else ("max_extra",)
        for name in baked:
            if getattr(options, name) != getattr(self.recorded, name):
                raise ConfigError(f"{self.directory} is a LiteRT export whose search holds {name} "
                                  f"{getattr(self.recorded, name)} as a constant, not {getattr(options, name)}: "
                                  f"export it again with that setting to decode with it.")
        return options

    def with_options(self, options: DecodeOptions) -> LiteRTTranslator:
        """A translator of the same loaded model decoding with `options` (`TranslatorInterface.with_options`)."""
        if options == self.options:
            return self
        variant = copy.copy(self)
        variant.options = self.check_options(options)
        return variant

    def returned(self) -> int:
        """Hypotheses per sentence: all `beam_size` for beam search, 1 for greedy decoding."""
        return self.options.beam_size if self.options.strategy == "beam" else 1

    # ------------------------------------------------------------------ ids
    def _vocabulary(self, side: str) -> list[str]:
        """An imported vocabulary's tokens by id (the export's JSON list)."""
        path = os.path.join(self.directory, self.metadata["vocabulary"][side])
        with open(path, encoding="utf-8") as handle:
            return [str(token) for token in json.load(handle)]

    def encode(self, text: str, side: str = "source") -> list[int]:
        """The model's ids of `text` on `side` ("source" or "target"), without eos: SentencePiece's ids, or for an
        imported vocabulary its pieces' ids in that vocabulary (`subwords.mapped_pieces`: a leading language token
        or ``>>xx<<`` tag whole, the side's language first where the text opens with none; unk for a piece the
        vocabulary lacks).

        Example:

        >>> translator.encode("A man.")  # doctest: +SKIP
        [27, 241, 5]
        """
        processor = self.source_processor if side == "source" else self.target_processor
        if not self.mapped:
            return [int(i) for i in processor.encode(text)]
        ids, unk = self._ids[side], self.metadata["special_ids"]["unk_id"]
        tokens = mapped_pieces(processor, text, ids, self.metadata["special_tokens"]["unk"], self._languages[side],
                               self._language[side], self._split[side])
        return [ids.get(token, unk) for token in tokens]

    def source_ids(self, text: str) -> list[int]:
        """One cleaned sentence's source ids: at most `max_source_length - 1` of `encode`'s, then eos
        (`subwords.source_end`: mBART-large-cc25's language token after it).

        Example:

        >>> translator.source_ids("A man.")  # doctest: +SKIP
        [27, 241, 5, 3]
        """
        return source_end(self.encode(text), self.eos_id, self.max_source_length, self._language_last["source"])

    def target_prefix_ids(self, prefixes: list[str]) -> list[list[int]]:
        """Per prefix text, its forced target ids (`encode` of the target side, no eos), checked
        (`lines.check_prefix_ids`): `target_lang`'s language token is a prefix's first word."""
        unk = self.metadata["special_ids"]["unk_id"]
        return [check_prefix_ids("LiteRTTranslator", text, self.encode(text, "target"), unk, self.max_target_length)
                for text in prefixes]

    def search_ids(self, source: np.ndarray, prefix: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The search signature of `options.strategy` on int32 `(N, S)` source ids (padded with pad) and int32
        `(N, P)` forced target prefixes (padded with pad; None or a column of pad: nothing forced): tokens int32
        `(N, K, T)` (the prefix, then eos and pad after a hypothesis) and length-normalised scores float32
        `(N, K)`, best first."""
        runner = self.interpreter.get_signature_runner(SEARCH_SIGNATURES[self.options.strategy])
        inputs = {"source_ids": np.ascontiguousarray(source, dtype=np.int32)}
        if "target_prefix" in runner.get_input_details():
            if prefix is None or prefix.shape[1] == 0:
                prefix = np.full((len(source), 1), self.pad_id, np.int32)  # a column of pad: nothing forced
            inputs["target_prefix"] = np.ascontiguousarray(prefix, dtype=np.int32)
        elif prefix is not None:
            raise NotImplementedError(f"{self.directory} was exported without target prefixes; export it again "
                                      "to force the start of a translation.")
        outputs = runner(**inputs)
        return np.asarray(outputs["tokens"]), np.asarray(outputs["score"])

    @property
    def default_target_language(self) -> str | None:  # type: ignore[override]  # a property where the interface has a class default
        """A `language_last` target side's language (mBART-large-cc25's: the decoder starts from it when no target
        language is given, `TranslatorInterface.default_target_language`), else None."""
        return self._language["target"] if self._language_last["target"] else None

    def _hypotheses(self, texts: list[str], prefixes: list[str] | None) -> list[list[tuple[list[int], float, int]]]:
        """Per text, `(ids without specials, score, tokens generated with eos)` best first; with `prefixes`, each
        starting with its text's prefix."""
        if prefixes is None and self.default_target_language is not None:  # cc25: its decoder's start
            prefixes = [self.default_target_language] * len(texts)
        forced = None
        if prefixes is not None:
            forced = padded_ids([ids or [self.pad_id] for ids in self.target_prefix_ids(prefixes)], self.pad_id)
        tokens, scores = self.search_ids(padded_ids([self.source_ids(text) for text in texts], self.pad_id), forced)
        results = []
        for row in range(len(texts)):
            hypotheses = []
            for k in range(tokens.shape[1]):
                ids = tokens[row, k].tolist()
                generated = sum(token != self.pad_id for token in ids)
                end = ids.index(self.eos_id) if self.eos_id in ids else len(ids)
                kept = [token for token in ids[:end] if token not in self._dropped]
                hypotheses.append((kept, float(scores[row, k]), generated))
            results.append(hypotheses)
        return results

    def decode(self, ids: list[int]) -> str:
        """Target ids (specials already dropped) as text: SentencePiece's, or an imported vocabulary's pieces
        joined (`subwords.mapped_text`)."""
        if self.mapped:
            return mapped_text(self.target_tokens[i] for i in ids)
        return str(self.target_processor.decode(ids))

    @property
    def target_languages(self) -> tuple[str, ...]:  # type: ignore[override]  # a property where the interface has a class default
        """The language tokens of the export's target vocabulary (`TranslatorInterface.target_languages`)."""
        return self._languages["target"]

    @property
    def source_languages(self) -> tuple[str, ...]:  # type: ignore[override]  # a property where the interface has a class default
        """The language tokens of the export's source vocabulary (`TranslatorInterface.source_languages`)."""
        return self._languages["source"]

    @property
    def source_language(self) -> str | None:
        """The language a multilingual export translates from by default (its metadata's), else None."""
        return self._language["source"]

    # ------------------------------------------------------------------ strings
    def translate_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[str]:
        """The best translation per cleaned, non-blank text; with `prefixes`, each starting with its prefix."""
        return [self.decode(hypotheses[0][0]) for hypotheses in self._hypotheses(texts, prefixes)]

    def n_best_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[tuple[str, float]]]:
        """Per cleaned, non-blank text, `returned()` `(translation, score)` pairs, best first."""
        return [[(self.decode(ids), score) for ids, score, _ in hypotheses]
                for hypotheses in self._hypotheses(texts, prefixes)]

    def details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[Translation]:
        """Per cleaned, non-blank text, its best translation as a `details.Translation` (its tokens count a
        prefix and eos, as its score does)."""
        return [Translation.from_score(self.decode(ids), score, generated, self.scoring_alpha)
                for (ids, score, generated), *_ in self._hypotheses(texts, prefixes)]

    def n_best_details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[Translation]]:
        """Per cleaned, non-blank text, its hypotheses as `details.Translation`s, best first."""
        return [[Translation.from_score(self.decode(ids), score, generated, self.scoring_alpha)
                 for ids, score, generated in hypotheses] for hypotheses in self._hypotheses(texts, prefixes)]

    def score_batch(self, sources: list[str], targets: list[str]) -> list[float]:
        """Forced decoding of cleaned pairs with the ``score`` signature: log P(target and eos | source) divided by
        the GNMT penalty ((5 + n) / 6) ** alpha of `scoring_alpha` (n counting eos), as the other engines score."""
        target_ids = [self.encode(text, "target")[: self.max_target_length - 1] + [self.eos_id] for text in targets]
        runner = self.interpreter.get_signature_runner(SCORE_SIGNATURE)
        outputs = runner(source_ids=padded_ids([self.source_ids(text) for text in sources], self.pad_id),
                         target_ids=padded_ids(target_ids, self.pad_id))
        start = int(self._language_last["target"])  # cc25: the target language starts the decoder, unscored
        lengths = np.array([len(ids) - start for ids in target_ids], np.float64)
        penalties = np.power((5.0 + lengths) / 6.0, self.scoring_alpha)
        return [float(score) for score in np.asarray(outputs["score"], np.float64) / penalties]

    def count_source_tokens(self, text: str) -> int:
        """The source SentencePiece model's pieces of `text` (without eos), for `translate_document`'s budget."""
        return len(self.source_processor.encode(text))

    def translate(self, sentences: Lines) -> list[str]:
        """Translates a batch of sentences (`translate_lines` in one batch).

        Example:

        >>> translator.translate(["A man rides a bike.", ""])  # doctest: +SKIP
        ['Ein Mann fährt Fahrrad.', '']
        """
        return self.translate_lines(sentences, batch_size=sys.maxsize)


__all__ = ["FORMAT", "PRECISIONS", "LiteRTTranslator", "is_litert_model", "padded_ids", "read_metadata"]
