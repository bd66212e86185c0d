"""Serving a CTranslate2 export: `CTranslate2Translator`, with the package's length penalty and input handling.

A folder written by `exports.ctranslate2.export_ctranslate2` (or
`keras-transformer export --format ctranslate2`) is served by CTranslate2's C++
engine. This module needs numpy and, when a translator is built, the optional
`ctranslate2` and `sentencepiece` packages: neither Keras nor TensorFlow, so a
serving process imports only what decoding needs. It also names the export's format and the precisions
(compute types) CTranslate2 runs here; the CPU backend and threads are `engines.ctranslate2_cpu`'s.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.ctranslate2_cpu import cpu_model, default_intra_threads, select_cpu_backend
from keras_transformer.engines.details import Translation
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.lines import Lines, check_prefix_ids
from keras_transformer.engines.subwords import load_processors, mapped_pieces, mapped_text, source_end
from keras_transformer.errors import ConfigError
from keras_transformer.workdir.layout import CTRANSLATE2_METADATA

# Per sentence, the target tokens a search is forced to start with (CTranslate2's `target_prefix`).
Tokens: TypeAlias = Sequence[Sequence[str]]

FORMAT = "keras_transformer.ctranslate2"
FORMAT_VERSION = 1
# The compute types CTranslate2 can store and run (`export --format ctranslate2 --precision`; its converters'
# `quantization`): weights in the first part, activations in the second ("int8" alone: int8 weights, and what the
# device runs best around them).
PRECISIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")


def is_ctranslate2_model(path: str | os.PathLike[str]) -> bool:
    """True if `path` is a folder written by `export_ctranslate2` (it holds ``keras_transformer.json`` and
    ``model.bin``).

    Args:
        path: any path.

    Returns:
        bool.

    Example:

    >>> import tempfile
    >>> is_ctranslate2_model(tempfile.mkdtemp())
    False
    """
    path = os.fspath(path)
    metadata_file = os.path.join(path, CTRANSLATE2_METADATA)
    if not (os.path.isfile(metadata_file) and os.path.isfile(os.path.join(path, "model.bin"))):
        return False
    try:
        with open(metadata_file, encoding="utf-8") as handle:
            return json.load(handle).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_metadata(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``keras_transformer.json`` of a CTranslate2 export, checked.

    Example:

    >>> read_metadata("ct2/multi30k_en_de")["decoding"]  # doctest: +SKIP
    {'beam_size': 5, 'alpha': 1.0, 'max_extra': 50}
    """
    directory = os.fspath(directory)
    if not is_ctranslate2_model(directory):
        raise FileNotFoundError(f"No keras_transformer CTranslate2 export at {directory} ({CTRANSLATE2_METADATA} and "
                                "model.bin are expected; write one with export_ctranslate2).")
    with open(os.path.join(directory, CTRANSLATE2_METADATA), encoding="utf-8") as handle:
        metadata = json.load(handle)
    if metadata.get("version", 0) > FORMAT_VERSION:
        raise ValueError(f"{directory} was written by a newer keras_transformer (format version "
                         f"{metadata['version']} > {FORMAT_VERSION}); upgrade the package.")
    return metadata



# ---------------------------------------------------------------------- precisions


def supported_precisions(device: str = "cpu") -> tuple[str, ...]:
    """The compute types CTranslate2 runs on `device` in this process (`ctranslate2.get_supported_compute_types`),
    in the order of `PRECISIONS`. It imports `ctranslate2`, after `select_cpu_backend` has chosen its CPU backend.

    Example:

    >>> "float32" in supported_precisions()
    True
    """
    select_cpu_backend()  # before ctranslate2 is imported, if it is not yet
    import ctranslate2

    supported = set(ctranslate2.get_supported_compute_types(device))
    return tuple(precision for precision in PRECISIONS if precision in supported)


def check_precision(precision: str, device: str = "cpu", flag: str = "--precision") -> str:
    """Returns `precision` if CTranslate2 runs it on `device` here; else raises, naming it and what runs.

    Raises:
        ConfigError: a compute type CTranslate2 does not know, or one it cannot run on this machine's `device`
            (float16 on a CPU, int8_bfloat16 without AVX512_BF16, ...).

    Example:

    >>> check_precision("float32")
    'float32'
    >>> check_precision("int4")
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: --precision int4: CTranslate2 has no such compute type; ...
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"{flag} {precision}: CTranslate2 has no such compute type; it takes "
                          f"{', '.join(PRECISIONS)}.")
    supported = supported_precisions(device)
    if precision not in supported:
        import ctranslate2

        raise ConfigError(f"{flag} {precision}: CTranslate2 {ctranslate2.__version__} cannot run it on this "
                          f"{device.upper()} ({cpu_model() if device == 'cpu' else device}); it runs "
                          f"{', '.join(supported)}.")
    return precision


# ---------------------------------------------------------------------- decoding


def gnmt_length_penalty(length: Any, alpha: float) -> np.ndarray:
    """((5 + length) / 6) ** alpha, as `keras_transformer.decoding.length_penalty`, in numpy.

    Example:

    >>> float(gnmt_length_penalty(7, 1.0))
    2.0
    """
    return np.power((5.0 + np.asarray(length, dtype=np.float64)) / 6.0, float(alpha))


class CTranslate2Translator(TranslatorInterface):
    """Translates with a CTranslate2 export, ranking hypotheses as keras_transformer's beam search does.

    Strings in, strings out, like `keras_transformer.engines.tensorflow.Translator`
    (the line handling is `TranslatorInterface`'s): over-long sources keep their first
    ``max_length - 1`` pieces, and every input gives exactly one output.

    The search is CTranslate2's: its candidates and hypotheses are those of
    `keras_transformer.decoding.beam_search` step for step, with the same
    log-probabilities, and its n-best are reranked by the package's GNMT rule.
    Two differences remain. CTranslate2 stops once its best hypothesis has
    ended and `beam_size` have finished, where the package's exact rule goes on
    while a live hypothesis could still win under the length penalty, so the
    package sometimes finds a longer, better-scoring translation (1 sentence in
    100 on Multi30k with the shipped model); `early_exit` stops the package by
    CTranslate2's rule. And pad and bos, which the package never
    produces, can only be suppressed in CTranslate2 before its softmax; they
    are left in (and a sentence whose n-best contains one is searched again
    with both suppressed), which matters only where the model's distribution
    is nearly uniform (a tiny model, unknown input).

    Args:
        directory: a folder written by `export_ctranslate2`.
        options: a `DecodeOptions` (default: those recorded at export); `settings`
            (`beam_size=5`, `strategy="sample"`, `top_p=0.9`, ...) replace its fields.
            Sampling is CTranslate2's own (`sampling_topk`, `sampling_topp`,
            `sampling_temperature`, `ctranslate2.set_random_seed(seed)`): reproducible
            for one seed and request, not the draws of the TensorFlow engines.
        device: "cpu" or "cuda".
        compute_type: CTranslate2's compute type: "default" (the precision the export records, its
            `--precision`; where this device cannot run that one, CTranslate2's choice for the stored weights,
            with a warning), or "float32", "int8", "int8_float32", "float16", ... (`PRECISIONS`).
        intra_threads: threads inside one batch (None or 0: `default_intra_threads`,
            `OMP_NUM_THREADS`, else every usable CPU divided by `inter_threads`).
        inter_threads: batches run in parallel.
        cpu_backend: CTranslate2's CPU backend, "dnnl" (oneDNN) or "mkl"; None:
            the `CT2_USE_MKL` environment variable if set, else oneDNN
            (`select_cpu_backend`: chosen once per process, before `ctranslate2` is imported).
        exact_limits: decode each batch in groups of sentences with the same
            length limit, so each sentence stops at its own source length +
            `max_extra` tokens as in `keras_transformer.decoding` (True); or
            give the whole batch its longest sentence's limit (False: fewer,
            larger calls; a translation can then run past its own limit, which
            only happens to degenerate, repeating outputs).

    Example:

    >>> translator = CTranslate2Translator("ct2/multi30k_en_de", compute_type="int8")  # doctest: +SKIP
    >>> translator(["A man rides a bike."])  # doctest: +SKIP
    ['Ein Mann fährt Fahrrad.']
    """

    engine = "ctranslate2"
    strategies = ("beam", "greedy", "sample")  # what `_search_once` passes to CTranslate2

    def __init__(self, directory: str | os.PathLike[str], options: DecodeOptions | None = None, *, device: str = "cpu",
                 compute_type: str | None = "default", intra_threads: int | None = None, inter_threads: int = 1,
                 exact_limits: bool = True, cpu_backend: str | None = None, **settings: Any) -> None:
        self.cpu_backend = select_cpu_backend(cpu_backend)  # before ctranslate2 is imported
        self.intra_threads = int(intra_threads or default_intra_threads(inter_threads))
        import ctranslate2

        self.directory = os.fspath(directory)
        self.metadata = read_metadata(self.directory)
        if options is None:  # the export's; one from before the decoding options recorded only these three
            options = DecodeOptions.from_dict({**self.metadata["decoding"], "early_exit": True},
                                              where=f"{self.directory}: decoding")
        self.options = self.check_options(options.replace(**settings))
        self._ctranslate2 = ctranslate2
        self.exact_limits = bool(exact_limits)
        self.compute_type = self._compute_type(compute_type, device)
        self.max_source_length: int = int(self.metadata["max_source_length"])
        self.max_target_length = int(self.metadata["max_target_length"])
        special = self.metadata["special_ids"]
        self.pad_id, self.bos_id, self.eos_id = special["pad_id"], special["bos_id"], special["eos_id"]
        self.source_processor, self.target_processor = load_processors(self.directory, self.metadata["sentencepiece"])
        self.source_tokens = self._saved_vocabulary("source")
        self.target_tokens = self._saved_vocabulary("target")
        self._target_ids = {token: index for index, token in enumerate(self.target_tokens)}
        # An imported vocabulary ("mapped"): pieces go to CTranslate2 as tokens, numbered by its vocabulary
        self.mapped = self.metadata.get("tokenization") == "mapped"
        self._known = {"source": set(self.source_tokens), "target": set(self.target_tokens)}
        tokens = self.metadata["special_tokens"]
        self._unk_token = tokens["unk"]
        self._eos_token = tokens["eos"]
        # never produced: pad, and bos unless it is eos (a decoder that starts from eos); suppressed only where a
        # search produced them
        self._never = [[tokens["pad"]]] + ([[tokens["bos"]]] if tokens["bos"] != tokens["eos"] else [])
        self._never_ids = {self._target_ids[token] for (token,) in self._never}
        languages = self.metadata.get("languages") or {}
        self._languages = {side: set(languages.get(side, {}).get("languages", [])) for side in ("source", "target")}
        self._language = {side: languages.get(side, {}).get("language") for side in ("source", "target")}
        self._split = {side: tuple(languages.get(side, {}).get("split_tokens", ())) for side in ("source", "target")}
        # mBART-large-cc25: sources end with </s> [src_lang]; the decoder starts from the prefix's first token
        self._language_last = {side: bool(languages.get(side, {}).get("language_last"))
                               for side in ("source", "target")}
        target = languages.get("target", {})
        self._dropped = {self._target_ids[token] for token in
                         list(target.get("languages", [])) + list(target.get("special_tokens", []))}
        self.translator = ctranslate2.Translator(self.directory, device=device, compute_type=self.compute_type,
                                                 intra_threads=self.intra_threads, inter_threads=int(inter_threads))

    @classmethod
    def load(cls, paths: list[Any], checkpoint: Any = None, average: int | None = None,
             options: DecodeOptions | None = None, **settings: Any) -> CTranslate2Translator:
        """The translator of the one CTranslate2 export in `paths` (`TranslatorInterface.load`;
        `engines.loader` refused ensembles and weights options already)."""
        return cls(paths[0], options, **settings)

    def _compute_type(self, compute_type: str | None, device: str) -> str:
        """The compute type to load with: `compute_type`, or for "default" the precision the export records."""
        if compute_type not in (None, "default"):
            return compute_type
        recorded = self.metadata.get("precision")
        if recorded is None:  # an export from before precisions were recorded: its stored weights' type
            return "default"
        if recorded not in supported_precisions(device):
            logging.getLogger(__name__).warning(
                "%s was exported in %s, which CTranslate2 cannot run on this %s; it runs in CTranslate2's default "
                "compute type for the stored weights instead (compute_type= chooses one).", self.directory,
                recorded, device)
            return "default"
        return recorded

    def check_options(self, options: DecodeOptions) -> DecodeOptions:
        """`TranslatorInterface.check_options`, and a beam search must stop by CTranslate2's own rule."""
        options = super().check_options(options)
        if options.strategy == "beam" and not options.early_exit:
            raise ConfigError(f"{self.directory} is a CTranslate2 export, whose beam search always stops by its own "
                              "rule (early_exit): it has no exact stopping rule.")
        return options

    def with_options(self, options: DecodeOptions) -> CTranslate2Translator:
        """A translator of the same loaded CTranslate2 model decoding with `options`
        (`TranslatorInterface.with_options`); options are read at each call, so this costs nothing.

        Example:

        >>> greedy = translator.with_options(translator.options.replace(strategy="greedy"))  # doctest: +SKIP
        """
        if options == self.options:
            return self
        variant = copy.copy(self)
        variant.options = self.check_options(options)
        return variant

    @property
    def beam_size(self) -> int:
        """Beams per sentence (beam search; greedy decoding and sampling run one)."""
        return self.options.beam_size if self.options.strategy == "beam" else 1

    @property
    def max_extra(self) -> int:
        """A translation has at most its source's length (with eos) + this many tokens."""
        return self.options.max_extra

    def returned(self) -> int:
        """Hypotheses per sentence: all `beam_size` for beam search, else `options.returned()`."""
        return self.options.returned() if self.options.strategy != "beam" else self.beam_size

    def _saved_vocabulary(self, side: str) -> list[str]:
        for name in (f"{side}_vocabulary.json", "shared_vocabulary.json"):
            path = os.path.join(self.directory, name)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    return json.load(handle)
        raise FileNotFoundError(f"{self.directory} has no {side} vocabulary ({side}_vocabulary.json or "
                                "shared_vocabulary.json).")

    # ------------------------------------------------------------------ ids
    def encode_source(self, text: str) -> list[str]:
        """One sentence's source tokens as CTranslate2 takes them (pieces, without the eos it adds).

        Example:

        >>> translator.encode_source("A man.")  # doctest: +SKIP
        ['▁A', '▁man', '.']
        """
        if self.mapped and self._language_last["source"]:  # tokens </s> [src_lang]: CTranslate2 adds nothing
            return source_end(self._pieces(self.source_processor, text, "source"), self._eos_token,
                              self.max_source_length, language_last=True)
        if self.mapped:
            return self._pieces(self.source_processor, text, "source")[: self.max_source_length - 1]
        ids = self.source_processor.encode(text)[: self.max_source_length - 1]
        return [self.source_tokens[i] for i in ids]

    def _pieces(self, processor: Any, text: str, side: str) -> list[str]:
        """An imported vocabulary's tokens of `text`: a leading ``>>xx<<`` tag whole (or, with language tokens, a
        leading one of them, else the side's language), then SentencePiece's pieces, each one the vocabulary lacks
        read as unk (`keras_transformer.data.tokenizers.MappedTokenizer`)."""
        return mapped_pieces(processor, text, self._known[side], self._unk_token, self._languages[side],
                             self._language[side], self._split[side])

    def _limit(self, source_tokens: Sequence[str], prefix: Sequence[str] = ()) -> int:
        """Tokens a translation may have: source length with eos + max_extra, at least its target prefix and one
        more, capped by the position table."""
        ends = 0 if self._language_last["source"] else 1  # the eos CTranslate2 adds
        start = 1 if self._language_last["target"] else 0  # a prefix's first token starts the decoder, no output
        wanted = max(len(source_tokens) + ends + self.max_extra, len(prefix) - start + 1)
        return max(1, min(wanted, self.max_target_length))

    @property
    def target_languages(self) -> tuple[str, ...]:  # type: ignore[override]  # a property where the interface has a class default
        """The language codes of the export's target language tokens (`TranslatorInterface.target_languages`)."""
        return tuple(self.metadata.get("target_languages", ()))

    @property
    def source_languages(self) -> tuple[str, ...]:  # type: ignore[override]  # a property where the interface has a class default
        """The language codes of the export's source language tokens (`TranslatorInterface.source_languages`)."""
        return tuple((self.metadata.get("languages") or {}).get("source", {}).get("languages", ()))

    def target_prefix_ids(self, prefixes: list[str]) -> list[list[int]]:
        """Per prefix text, its forced target ids (no eos), checked (`lines.check_prefix_ids`): the target
        SentencePiece model's ids, or for an imported vocabulary the ids of its pieces in that vocabulary (a
        ``>>xx<<`` tag whole), which index `target_tokens` alike."""
        encode: Callable[[str], list[int]]
        if self.mapped:
            def mapped_ids(text: str) -> list[int]:
                return [self._target_ids[token] for token in self._pieces(self.target_processor, text, "target")]
            encode, unk = mapped_ids, self._target_ids[self._unk_token]
        else:
            encode, unk = self.target_processor.encode, self.target_processor.unk_id()
        return [check_prefix_ids("CTranslate2Translator", text, encode(text), unk, self.max_target_length)
                for text in prefixes]

    def _search(self, sources: list[list[str]], prefixes: Tokens | None = None) -> list[list[tuple[list[int], float]]]:
        """Beam search on token lists: per sentence, `[(ids, score)]` best first (rescored with the GNMT penalty).

        Pad and bos are never produced by `keras_transformer.decoding`, which
        sets their log-probabilities to -inf after the log-softmax, so the
        other tokens keep the model's own log-probabilities. CTranslate2 can
        only suppress tokens before its softmax, which renormalises every step
        (and on a small model can reorder near-tied hypotheses), so the search
        runs unsuppressed; the rare sentence whose n-best holds a pad or bos
        token is searched again with both suppressed.

        `prefixes` (target token lists, one per source) are CTranslate2's
        `target_prefix`: forced, then continued; the hypotheses and their
        scores include them, as `keras_transformer.decoding`'s do.
        """
        results = self._search_once(sources, list(range(len(sources))), suppress=False, prefixes=prefixes)
        again = [i for i, hypotheses in enumerate(results)
                 if any(self._never_ids.intersection(ids) for ids, _ in hypotheses)]
        if again:
            for i, hypotheses in zip(again, self._search_once(sources, again, suppress=True, prefixes=prefixes)):
                results[i] = hypotheses
        return results

    def _search_once(self, sources: list[list[str]], indices: list[int], suppress: bool,
                     prefixes: Tokens | None = None) -> list[list[tuple[list[int], float]]]:
        """`_search` for `sources[i]`, i in `indices`; returns their results in that order."""
        limits = {i: self._limit(sources[i], prefixes[i] if prefixes else ()) for i in indices}
        groups: dict[int, list[int]] = {}
        for i in indices:
            groups.setdefault(limits[i] if self.exact_limits else 0, []).append(i)
        results: dict[int, list[tuple[list[int], float]]] = {}
        sampling: dict[str, Any] = {}
        if self.options.sampling:  # CTranslate2's own sampling (its draws are not those of the package's search)
            sampling = dict(sampling_topk=self.options.top_k, sampling_topp=self.options.top_p,
                            sampling_temperature=self.options.temperature)
            self._ctranslate2.set_random_seed(self.options.seed)
        for key, members in groups.items():
            limit = key if self.exact_limits else max(limits[i] for i in members)
            forced = [prefixes[i] or None for i in members] if prefixes else None
            outputs = self.translator.translate_batch(
                [sources[i] for i in members], forced, beam_size=self.beam_size, num_hypotheses=self.returned(),
                length_penalty=0.0, return_scores=True, return_end_token=True, min_decoding_length=0,
                max_decoding_length=limit, max_input_length=0, suppress_sequences=self._never if suppress else None,
                **sampling)
            forced_log_probs = self._prefix_log_probs([sources[i] for i in members], forced)
            for i, output, prefix_log_prob in zip(members, outputs, forced_log_probs):
                hypotheses = [[self._target_ids[token] for token in tokens] for tokens in output.hypotheses]
                # |Y| counts eos, as decoding.beam_search does: return_end_token keeps it in the hypothesis.
                penalties = gnmt_length_penalty([len(ids) for ids in hypotheses], self.scoring_alpha)
                scored = [(ids, (float(score) + prefix_log_prob) / float(penalty))
                          for ids, score, penalty in zip(hypotheses, output.scores, penalties)]
                results[i] = sorted(scored, key=lambda pair: -pair[1])  # stable: ties keep CTranslate2's order
        return [results[i] for i in indices]

    def _prefix_log_probs(self, sources: list[list[str]],
                          prefixes: Sequence[Sequence[str] | None] | None) -> list[float]:
        """Per source, log P(its target prefix | source): CTranslate2's scores leave the forced tokens out, the
        package's count them (a hypothesis's score is the forced score of all of it). 0 without a prefix."""
        if not prefixes:
            return [0.0] * len(sources)
        given = [i for i, prefix in enumerate(prefixes) if prefix]
        totals = [0.0] * len(sources)
        if given:
            results = self.translator.score_batch([sources[i] for i in given], [prefixes[i] for i in given],
                                                  max_input_length=0)
            for i, result in zip(given, results):
                totals[i] = float(np.sum(result.log_probs[:-1]))  # the last is the eos score_batch appends
        return totals

    def _detokenize(self, ids: Iterable[int]) -> str:
        kept = []
        for token in ids:
            if token == self.eos_id:
                break
            if token not in (self.pad_id, self.bos_id) and token not in self._dropped:
                kept.append(token)
        if self.mapped:  # as MappedTokenizer.detokenize: the pieces joined, unk dropped, each ▁ a space
            return mapped_text(self.target_tokens[i] for i in kept if self.target_tokens[i] != self._unk_token)
        return self.target_processor.decode(kept)

    # ------------------------------------------------------------------ strings
    @property
    def default_target_language(self) -> str | None:  # type: ignore[override]  # a property where the interface has a class default
        """A `language_last` target side's language (mBART-large-cc25's: the decoder starts from it when no target
        language is given, `TranslatorInterface.default_target_language`), else None."""
        return self._language["target"] if self._language_last["target"] else None

    def _hypotheses(self, texts: list[str], prefixes: list[str] | None) -> list[list[tuple[list[int], float]]]:
        """`_search` of cleaned texts, each starting with its prefix text (checked) where `prefixes` are given."""
        if prefixes is None and self.default_target_language is not None:  # cc25: its decoder's start
            prefixes = [self.default_target_language] * len(texts)
        forced = None
        if prefixes is not None:
            forced = [[self.target_tokens[i] for i in ids] for ids in self.target_prefix_ids(prefixes)]
        if self._language_last["target"]:  # the decoder starts from each prefix's first token, else from bos
            forced = [prefix or [self.target_tokens[self.bos_id]] for prefix in forced or [[]] * len(texts)]
        return self._search([self.encode_source(text) for text in texts], forced)

    def n_best_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[tuple[str, float]]]:
        """Per text (cleaned, not blank: `TranslatorInterface`), `returned()` `(text, score)` pairs, best first;
        with `prefixes` (one text per text), each starting with its text's target prefix."""
        returned = self.returned()
        results = []
        for hypotheses in self._hypotheses(texts, prefixes):
            ranked = [(self._detokenize(ids), score) for ids, score in hypotheses]
            results.append((ranked + [("", float("-inf"))] * returned)[:returned])
        return results

    def details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[Translation]:
        """Per text, the best of `n_best_batch` as a `details.Translation`: its tokens are CTranslate2's
        hypothesis, the prefix and eos included, as its score counts them."""
        return [Translation.from_score(self._detokenize(ids), score, len(ids), self.scoring_alpha)
                for (ids, score), *_ in self._hypotheses(texts, prefixes)]

    def n_best_details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[Translation]]:
        """Per text, the hypotheses of `n_best_batch` as `details.Translation`s (as `details_batch`; a search
        that found fewer than `returned()` gives those it found)."""
        return [[Translation.from_score(self._detokenize(ids), score, len(ids), self.scoring_alpha)
                 for ids, score in hypotheses[:self.returned()]] for hypotheses in self._hypotheses(texts, prefixes)]

    def count_source_tokens(self, text: str) -> int:
        """The source SentencePiece model's pieces of `text` (without eos or a language token), for
        `translate_document`'s budget."""
        return len(self.source_processor.encode(text))

    @property
    def source_language(self) -> str | None:
        """The language a multilingual export translates from by default (its metadata's), else None."""
        return self._language["source"]

    def translate_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[str]:
        """The best of `n_best_batch`, per text."""
        return [hypotheses[0][0] for hypotheses in self.n_best_batch(texts, prefixes)]

    def score_batch(self, sources: list[str], targets: list[str]) -> list[float]:
        """Forced decoding with CTranslate2's `score_batch`: per pair, log P(target and eos | source), divided by
        the GNMT penalty of `scoring_alpha`, as the other engines score."""
        target_tokens = []
        for text in targets:
            if self.mapped:
                target_tokens.append(self._pieces(self.target_processor, text, "target")[: self.max_target_length - 1])
                continue
            ids = self.target_processor.encode(text)[: self.max_target_length - 1]
            target_tokens.append([self.target_tokens[i] for i in ids])
        results = self.translator.score_batch([self.encode_source(text) for text in sources], target_tokens,
                                              max_input_length=0)
        return [float(np.sum(result.log_probs)) / float(gnmt_length_penalty(len(result.log_probs), self.scoring_alpha))
                for result in results]

    def translate(self, sentences: Lines) -> list[str]:
        """Translates a batch of sentences (`translate_lines` in one batch).

        Args:
            sentences: a list of `str` (or UTF-8 `bytes`).

        Returns:
            A list of `str`, one per sentence.

        Example:

        >>> translator.translate(["A man rides a bike.", ""])  # doctest: +SKIP
        ['Ein Mann fährt Fahrrad.', '']
        """
        return self.translate_lines(sentences, batch_size=sys.maxsize)  # one batch

    def n_best(self, sentences: Lines) -> dict[str, list[list[Any]]]:
        """All `beam_size` hypotheses per sentence, best first, with their length-normalised scores.

        Returns:
            `{"translations": [[str] * beam_size] * N, "scores": [[float] * beam_size] * N}`,
            as the SavedModel's ``n_best`` signature; blank inputs give "" with score 0.

        Example:

        >>> translator.n_best(["A dog."])["translations"][0][:2]  # doctest: +SKIP
        ['Ein Hund rennt.', 'Ein Hund befindet sich.']
        """
        results = self.n_best_lines(sentences, batch_size=sys.maxsize)  # one batch
        return {"translations": [[text for text, _ in row] for row in results],
                "scores": [[score for _, score in row] for row in results]}
