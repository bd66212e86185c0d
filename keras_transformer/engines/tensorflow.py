"""`Translator`: raw strings in, translated strings out (tokenize, search, detokenize): the TensorFlow engine.

This is the TensorFlow side of decoding: the tokenizers are tensorflow-text
graphs, and the whole path runs in one `tf.function` that the export module
saves in a SavedModel. The search itself is `keras_transformer.decoding`
(the strategy its `DecodeOptions` name), the graph's pieces are
`engines.tensorflow_graph`'s, a batch's length-ordered chunks
`engines.tensorflow_chunks`'s, a search with terms `engines.tensorflow_terms`'s, attention maps
`engines.tensorflow_attention`'s, and the Python-level methods
(line clean-up, blanks, length order) are `keras_transformer.engines.interface.TranslatorInterface`'s.
`keras_transformer.load_translator` builds one for a workdir or SavedModel export.

The graph itself replaces bytes that are not valid UTF-8 by U+FFFD and translates an empty or whitespace-only input
to "" with score 0, as the Python-level methods do (an exported signature gets raw strings). Sources longer than the
model accepts are truncated: a source keeps its first `max_length - 1` tokens and then its end-of-sequence token, so
the encoder sees at most `max_length` positions (`max_length` is the model's positional-encoding length,
`TransformerConfig.max_length`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.attention.maps import AttentionMaps
from keras_transformer.data.tokenizers import load_tokenizers
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.decoding.strategies import SAMPLING_FIELDS
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.lines import check_prefix_ids
from keras_transformer.engines.tensorflow_attention import translation_attention
from keras_transformer.engines.tensorflow_chunks import score_in_length_order, search_in_length_order
from keras_transformer.engines.tensorflow_details import count_source_tokens, details_batch, n_best_details_batch
from keras_transformer.engines.tensorflow_graph import (
    blank_strings,
    check_vocabulary_sizes,
    encode_ids,
    encode_prefix_ids,
    one_target_per_source,
    valid_utf8,
)
from keras_transformer.engines.tensorflow_terms import TermSearch
from keras_transformer.model import parts
from keras_transformer.trainer.footprint import search_memory
from keras_transformer.workdir.checkpoints import load_models

# Sentences per search loop (and pairs per forced-decoding pass of `score`), the `Translator` default: each
# length-ordered chunk stops when its own sentences are done (docs/decoding.md, "Length-ordered chunks"; 8-12
# measured best for a trained model on the 2-core development machine), and a request of any size holds one
# chunk's search state at a time.
TRAINED_CHUNK_SIZE = 8

# The tf.functions below are traced without AutoGraph: the decoding code has no Python control flow on tensors
# (its loops are explicit `while_loop`s), so the graph is the same, and a process's first translation no longer
# spends most of its time converting the decoding code (bench/startup.py: 2.6x faster).


# A translator without XLA decodes its first sentences eagerly, op by op, up to this many in all: tracing
# `translate` into a graph and optimising it costs 4.4 s for the shipped model on the 2-core development CPU,
# most of a two-sentence `keras-transformer translate`, where eager decoding takes about 1 s for two sentences
# and 3 s for eight (then 0.3 s a sentence, against 0.01-0.03 s in the graph). So a short request answers
# without the graph, and a longer one, or any request after these, pays for the graph once. The results are
# the graph's (the same kernels; test2016 translated both ways gave the same 1,000 translations).
EAGER_SENTENCES = 8

# A compiled search is one op, so TensorFlow's inter-op threads can run two at once: with
# `jit_compile`, the chunks are dealt to this many independent loops (chunk i to loop i % 2). With one
# inter-op thread they run one after the other; results never depend on it.
PARALLEL_CHUNKS = 2


class Translator(TermSearch, tf.Module, TranslatorInterface):
    """Translates batches of sentences with a `build_model` Transformer.

    Every method below that takes `tf.string` works inside `tf.function` and
    is exportable; `translate` is the one a SavedModel serves.

    Args:
        model: a `build_model` model (the Translator keeps a reference, so a
            model still training is decoded with its current weights), or a
            list of models sharing the tokenizers, decoded as an ensemble (the
            mean of their next-token distributions; `decoding.ensemble_members`).
        source_tokenizer: has `tokenize(tf.string [N]) -> int [N, None]` (ragged
            or dense) and `eos_id`/`pad_id`; its `vocab_size`, where it has one,
            must be the size of the model's source embedding.
        target_tokenizer: has `detokenize(int [N, L]) -> tf.string [N]` (dropping
            pad/bos/eos) and `tokenize`, `pad_id`, `bos_id`, `eos_id`; its
            `vocab_size` must be the size of the target embedding. Defaults
            to `source_tokenizer` (a shared vocabulary).
        options: a `keras_transformer.decoding.DecodeOptions`: the strategy (beam
            search, greedy, sampling) and its settings (default: `DecodeOptions()`,
            the paper's beam search).
        jit_compile: compile the search with XLA: one compilation (seconds) per
            input shape, after which the shipped model decoded 1.5-1.8x faster
            on the 2-core development CPU (docs/BENCHMARKS.md). With `chunk_size`, chunks are padded to a few shapes
            (`bucket_sizes`: rows and source width to powers of two), so a
            long-running process compiles a handful of programs; without it,
            one per distinct batch shape. Exports use it by default.
        chunk_size: a batch is decoded in length order, `chunk_size` sentences
            at a time, each chunk with its own search loop and source width
            (results come back in input order and do not change): a chunk
            stops when its own sentences are done, rather than every sentence
            stepping until the batch's slowest one is. `score` likewise runs
            its forced pass over `chunk_size` pairs at a time. So memory is
            bounded whatever the batch size: one chunk's search state or
            logits at a time, plus the batch's ids and results. Default:
            `TRAINED_CHUNK_SIZE` (8). 0 decodes the batch as one search and
            scores it in one pass, with memory growing with the batch (`score`
            then holds `(N, T, vocabulary)` float32 logits per model): for
            callers that bound their batches themselves, like the BLEU
            callback during training, whose model, still learning, runs its
            translations to their length limit and would pay for every chunk's
            full loop in turn. An export serves in chunks whatever this is
            (`export.TranslatorModule`).
        name: the module's name.
        **settings: `DecodeOptions` fields replacing those of `options`
            (`Translator(model, tokenizer, beam_size=5)`; a sampling setting
            alone chooses strategy "sample").

    Raises:
        ConfigError: a decoding setting out of range (named).
        ValueError: a tokenizer whose vocabulary size is not the model's (both sizes named).

    Example:

    >>> translator = Translator(model, source_tokenizer, target_tokenizer)  # doctest: +SKIP
    >>> translator(["A man rides a bike."])  # doctest: +SKIP
    ['Ein Mann fährt Fahrrad.']
    """

    engine = "tensorflow"
    strategies = tuple(STRATEGIES)  # every registered strategy: the search is `decoding.strategy(name)`
    details_batch, count_source_tokens = details_batch, count_source_tokens  # engines.tensorflow_details
    n_best_details_batch = n_best_details_batch

    def __init__(self, model: Any, source_tokenizer: Any, target_tokenizer: Any = None,
                 options: DecodeOptions | None = None, jit_compile: bool = False,
                 chunk_size: int = TRAINED_CHUNK_SIZE, name: str = "translator", **settings: Any) -> None:
        super().__init__(name=name)
        self.models = decoding.ensemble_members(model)
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer if target_tokenizer is not None else source_tokenizer
        if options is not None and not isinstance(options, DecodeOptions):
            raise TypeError(f"Translator: options must be a DecodeOptions, got {type(options).__name__}.")
        self.options = self.check_options((options or DecodeOptions()).replace(**settings))
        for index, model in enumerate(self.models):
            check_vocabulary_sizes(model, self.source_tokenizer, self.target_tokenizer,
                                    "the model" if len(self.models) == 1 else f"ensemble member {index}")
        self.max_source_length: int = parts(self.models[0]).source_position.max_length
        self.max_target_length = decoding.max_positions(self.models[0])
        self._jit_compile = bool(jit_compile)
        self.chunk_size = int(chunk_size)
        if self.chunk_size < 0:
            raise ValueError(f"Translator: chunk_size must be >= 0 (0: one search per batch), got {chunk_size}.")
        # The search on one chunk as a function of its own, traced once per distinct settings and called from every
        # graph that decodes with them (an export's `serving_default` and `translate_ids` share one): compiled with
        # XLA, or not. Outside a graph, an uncompiled translator runs `_search_ids` itself, eagerly.
        # (jit_compile None, not False, without XLA: False would mark the graph `_XlaMustCompile=false`.)
        self._graph_search = tf.function(self._search_ids, jit_compile=True if self._jit_compile else None,
                                         autograph=False)
        self._eager_left = 0 if jit_compile else EAGER_SENTENCES  # sentences still decoded without the graph

    @property
    def jit_compile(self) -> bool:
        """Whether the search is compiled with XLA, one program per bucketed chunk shape (`bucket_sizes`)."""
        return self._jit_compile

    @property
    def beam_size(self) -> int:
        """`options.beam_size`: beams per sentence of the beam search."""
        return self.options.beam_size

    @property
    def alpha(self) -> float:
        """`options.alpha`: the beam search's length-penalty exponent."""
        return self.options.alpha

    @property
    def max_extra(self) -> int:
        """`options.max_extra`: a translation has at most source length + this many tokens."""
        return self.options.max_extra

    @property
    def early_exit(self) -> bool:
        """`options.early_exit`: the beam search also stops by OpenNMT's and CTranslate2's rule."""
        return self.options.early_exit

    @property
    def model(self) -> Any:
        """The model of a single-model Translator (an ensemble's members are in `models`)."""
        if len(self.models) != 1:
            raise AttributeError(f"This Translator decodes an ensemble of {len(self.models)} models: "
                                 "use `translator.models`.")
        return self.models[0]

    # --------------------------------------------------------------- constructors
    @classmethod
    def load(cls, paths: list[Any], checkpoint: Any = None, average: int | None = None,
             options: DecodeOptions | None = None, **settings: Any) -> Translator:
        """The translator of workdirs and SavedModel exports, several as one ensemble (`TranslatorInterface.load`;
        `workdir.load_models`): decoding defaults from the first."""
        loaded = load_models(paths if len(paths) > 1 else paths[0], checkpoint, average, require_vocabulary=True,
                             checked=True)
        return cls.from_models(loaded.models, loaded.vocab_dir, options or loaded.decoding, **settings)

    @classmethod
    def from_models(cls, models: list[Any], tokenizers: Any, options: DecodeOptions | None = None,
                    **settings: Any) -> Translator:
        """Wraps built models (one, or an ensemble's members) with their tokenizers.

        Args:
            models: a list of `build_model` models sharing a vocabulary.
            tokenizers: `(source_tokenizer, target_tokenizer)`, or a vocabulary
                folder that `keras_transformer.data.tokenizers.load_tokenizers` reads.
            options, **settings: as `Translator`.

        Returns:
            A `Translator`.

        Example:

        >>> loaded = workdir.load_models("runs/en_de")  # doctest: +SKIP
        >>> translator = Translator.from_models(loaded.models, loaded.vocab_dir, loaded.decoding)  # doctest: +SKIP

        `keras_transformer.load_translator` does this for any model folder.
        """
        if isinstance(tokenizers, (str, os.PathLike)):
            tokenizers = load_tokenizers(os.fspath(tokenizers))
        source_tokenizer, target_tokenizer = tokenizers
        return cls(models if len(models) > 1 else models[0], source_tokenizer, target_tokenizer, options, **settings)

    @classmethod
    def ensemble(cls, translators: Iterable[Translator], **settings: Any) -> Translator:
        """One Translator decoding the models of several Translators as an ensemble.

        The members must share the tokenizers (the caller checks: `load_translator`
        compares the vocabulary files); tokenizers and decoding options come from
        the first, with `settings` (`Translator` arguments and `DecodeOptions` fields) applied.

        Example:

        >>> both = Translator.ensemble([load_translator("runs/a"), load_translator("runs/b")])  # doctest: +SKIP
        """
        translators = list(translators)
        if not translators:
            raise ValueError("Translator.ensemble: no translators given.")
        first = translators[0]
        settings = {"jit_compile": first._jit_compile, "chunk_size": first.chunk_size, **settings}
        return cls([model for t in translators for model in t.models], first.source_tokenizer,
                   first.target_tokenizer, first.options, **settings)

    def search_memory(self, rows: int, beam: int) -> int:
        """Bytes the search over `rows` sentences of `beam` hypotheses each holds at its longest, every member of
        an ensemble included (`footprint.search_memory` with the models' sizes; a `chunk_size` translator
        decodes two chunks at a time at most, whatever `rows`).

        Example:

        >>> translator.search_memory(rows=64, beam=16) // 2**20  # doctest: +SKIP
        279
        """
        rows = min(rows, 2 * self.chunk_size) if self.chunk_size else rows
        total = 0
        for model in self.models:
            layers = parts(model)
            total += search_memory(rows, beam, layers.source_position.max_length,
                                   layers.target_position.max_length, layers.target_embedding.d_model,
                                   layers.decoder.num_layers, layers.target_embedding.vocab_size)
        return total

    def with_options(self, options: DecodeOptions) -> Translator:
        """A Translator of the same models and tokenizers decoding with `options` (`TranslatorInterface.with_options`).

        It shares the weights and keeps `jit_compile` and `chunk_size`; its graphs are its own (traced on
        first use).

        Example:

        >>> greedy = translator.with_options(translator.options.replace(strategy="greedy"))  # doctest: +SKIP
        """
        if not isinstance(options, DecodeOptions):
            raise TypeError(f"Translator.with_options: options must be a DecodeOptions, got {type(options).__name__}.")
        if options == self.options:
            return self
        return Translator(self.models if len(self.models) > 1 else self.models[0], self.source_tokenizer,
                          self.target_tokenizer, options, jit_compile=self.jit_compile, chunk_size=self.chunk_size)

    # -------------------------------------------------------------------- ids
    def encode_sources(self, sentences: Any) -> tf.Tensor:
        """Tokenizes strings into the model's source ids: tokens then eos, padded.

        Over-long sentences keep their first `max_length - 1` tokens.

        Args:
            sentences: `tf.string [N]`.

        Returns:
            int32 `[N, S]` with `S <= max_length`.
        """
        return encode_ids(self.source_tokenizer, sentences, self.max_source_length,
                          getattr(self.source_tokenizer, "language_last", False))

    def encode_targets(self, sentences: Any) -> tf.Tensor:
        """Tokenizes reference translations into target ids (tokens then eos), for `score`."""
        return encode_ids(self.target_tokenizer, sentences, self.max_target_length)

    def encode_prefixes(self, prefixes: Any) -> tf.Tensor:
        """Tokenizes target prefixes into forced target ids (no eos), padded: int32 `[N, P]`
        (`tensorflow_graph.encode_prefix_ids`: too long a prefix, or one holding unk, fails in the graph)."""
        return encode_prefix_ids(self.target_tokenizer, prefixes, self.max_target_length)

    @property
    def target_languages(self) -> tuple[str, ...]:  # type: ignore[override]  # a property where the interface has a class default
        """The language codes of the target tokenizer's language tokens (`TranslatorInterface.target_languages`)."""
        return tuple(getattr(self.target_tokenizer, "languages", ()))

    @property
    def source_languages(self) -> tuple[str, ...]:  # type: ignore[override]  # a property where the interface has a class default
        """The language codes of the source tokenizer's language tokens (`TranslatorInterface.source_languages`)."""
        return tuple(getattr(self.source_tokenizer, "languages", ()))

    @property
    def default_target_language(self) -> str | None:  # type: ignore[override]  # a property where the interface has a class default
        """A `language_last` target tokenizer's language (mBART-large-cc25's: the decoder starts from it when no
        target language is given, `TranslatorInterface.default_target_language`), else None."""
        target = self.target_tokenizer
        return getattr(target, "language", None) if getattr(target, "language_last", False) else None

    def target_prefix_ids(self, prefixes: list[str]) -> list[list[int]]:
        """Per prefix text, its forced target ids, checked (`lines.check_prefix_ids`) before any graph runs."""
        target = self.target_tokenizer
        ids = target.tokenize(tf.constant([text.encode("utf-8") for text in prefixes], tf.string))
        rows = ids.to_list() if isinstance(ids, tf.RaggedTensor) else [
            [i for i in row if i != target.pad_id] for row in ids.numpy().tolist()]
        return [check_prefix_ids("Translator", text, [int(i) for i in row], getattr(target, "unk_id", None),
                                 self.max_target_length) for text, row in zip(prefixes, rows)]

    def _search_ids(self, source: tf.Tensor, num_return: int, options: DecodeOptions, sampling: dict[str, Any],
                    target_prefix: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """The options' strategy (`keras_transformer.decoding.STRATEGIES`) on one chunk of source ids.

        `sampling` holds the sampling settings as tensors (inputs of the compiled search, never constants
        folded into it, so a SavedModel's `sample` signature and a Translator draw the same samples). A
        sentence's draws depend on its own ids (`decoding.sampling.source_keys`), not on its chunk.
        """
        target = self.target_tokenizer
        forced = {} if target_prefix is None else {"target_prefix": target_prefix}
        if target_prefix is not None and getattr(target, "language_last", False):  # mBART-large-cc25
            forced["start_from_prefix"] = True  # the prefix's language token starts the decoder
        return decoding.strategy(options.strategy)(
            self.models, source, options.replace(n_best=num_return, **sampling), pad_id=target.pad_id,
            bos_id=target.bos_id, eos_id=target.eos_id, first_cache_stage=decoding.FIRST_CACHE_STAGE, **forced)

    def _search(self, source: tf.Tensor, num_return: int, options: DecodeOptions, sampling: dict[str, Any],
                target_prefix: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """`_search_ids` through `_graph_search` (always with XLA; inside a graph without), else eagerly."""
        if self._jit_compile or tf.inside_function():
            return self._graph_search(source, num_return, options, sampling, target_prefix)
        return self._search_ids(source, num_return, options, sampling, target_prefix)

    def translate_ids(self, source: Any, num_return: int | None = None, options: DecodeOptions | None = None,
                      sampling: dict[str, Any] | None = None, target_prefix: Any = None) -> tuple[tf.Tensor, tf.Tensor]:
        """Decodes source ids with the translator's options (or `options`).

        Args:
            source: int32 `[N, S]` from `encode_sources`.
            num_return: hypotheses per sentence, best first (default:
                `options.returned()`, all `beam_size` for beam search); fewer lets
                a beam search stop sooner, never changing the ones returned.
            options: a `DecodeOptions` for this call (default: `self.options`).
            sampling: with strategy "sample", a dict of the `decoding.strategies.SAMPLING_FIELDS` as
                tensors (the `sample` method's inputs) replacing the options' own.
            target_prefix: optional int32 `[N, P]` forced first target ids per sentence, padded
                (`encode_prefixes`; `keras_transformer.decoding.search.target_prefix_ids`).

        Returns:
            `(tokens, scores)`: int32 `[N, num_return, T]` hypotheses, best first (each starting with its
            prefix), and float32 `[N, num_return]` scores (beam: length-normalised log-probabilities;
            greedy and sampling: log-probabilities; a prefix's tokens counted).
        """
        source = tf.convert_to_tensor(source, tf.int32)
        options = self.options if options is None else options
        num_return = options.returned() if num_return is None else int(num_return)
        if options.sampling:
            given = {**{name: getattr(options, name) for name in SAMPLING_FIELDS}, **(sampling or {})}
            sampling = {name: tf.convert_to_tensor(value, tf.float32 if name in ("temperature", "top_p") else tf.int32)
                        for name, value in given.items()}
        else:
            sampling = {}
        if target_prefix is not None:
            target_prefix = tf.convert_to_tensor(target_prefix, tf.int32)
        elif self.default_target_language is not None:  # cc25: the decoder starts from the default language
            start = self.target_tokenizer.tokens.index(self.default_target_language)
            target_prefix = tf.fill([tf.shape(source)[0], 1], tf.constant(start, tf.int32))
        if self.chunk_size:  # length-ordered chunks; with XLA, bucketed and dealt to PARALLEL_CHUNKS lanes
            return search_in_length_order(
                lambda piece, forced: self._search(piece, num_return, options, sampling, forced), source, num_return,
                chunk_size=self.chunk_size, source_pad_id=self.source_tokenizer.pad_id,
                target_pad_id=self.target_tokenizer.pad_id, max_extra=self.max_extra,
                max_source_length=self.max_source_length, max_target_length=self.max_target_length,
                bucketed=self._jit_compile, lanes=PARALLEL_CHUNKS if self._jit_compile else 1,
                target_prefix=target_prefix)
        return self._search(source, num_return, options, sampling, target_prefix)

    # ----------------------------------------------------------------- strings
    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string)])
    def translate(self, sentences: Any) -> dict[str, tf.Tensor]:
        """Translates a batch of sentences.

        Args:
            sentences: `tf.string [N]`.

        Returns:
            `{"translation": tf.string [N], "score": float32 [N]}`: the best
            hypothesis and its length-normalised log-probability.
        """
        tokens, scores = self.translate_ids(self.encode_sources(sentences), num_return=1)
        blank = blank_strings(sentences)  # empty or whitespace-only inputs translate to "" with score 0
        translation = valid_utf8(self.target_tokenizer.detokenize(tokens[:, 0]))
        return {"translation": tf.where(blank, tf.constant(""), translation),
                "score": tf.where(blank, tf.zeros_like(scores[:, 0]), scores[:, 0])}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def translate_prefixed(self, sentences: Any, prefixes: Any) -> dict[str, tf.Tensor]:
        """`translate` with each translation starting with its target prefix (forced, then continued).

        Args:
            sentences: `tf.string [N]`.
            prefixes: `tf.string [N]`, one per sentence ("" forces nothing): text of the target language,
                tokenized without eos. Other counts fail naming both; a prefix of as many tokens as the model's
                longest output, or one holding text the target vocabulary lacks (unk), fails naming it.

        Returns:
            `{"translation": tf.string [N], "score": float32 [N]}`: the best hypothesis (its prefix included)
            and its score, the prefix's tokens counted.
        """
        sentences, prefixes = one_target_per_source("Translator.translate_prefixed", sentences, prefixes)
        tokens, scores = self.translate_ids(self.encode_sources(sentences), num_return=1,
                                            target_prefix=self.encode_prefixes(prefixes))
        blank = blank_strings(sentences)
        translation = valid_utf8(self.target_tokenizer.detokenize(tokens[:, 0]))
        return {"translation": tf.where(blank, tf.constant(""), translation),
                "score": tf.where(blank, tf.zeros_like(scores[:, 0]), scores[:, 0])}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string)])
    def n_best(self, sentences: Any) -> dict[str, tf.Tensor]:
        """`options.returned()` hypotheses per sentence (beam: all `beam_size`), best first; with strategy
        "sample", that many independent draws.

        Returns:
            `{"translations": tf.string [N, R], "scores": float32 [N, R]}`.
        """
        tokens, scores = self.translate_ids(self.encode_sources(sentences))
        shape = tf.shape(tokens)  # (N, K, T)
        flat = valid_utf8(self.target_tokenizer.detokenize(tf.reshape(tokens, [shape[0] * shape[1], shape[2]])))
        blank = tf.broadcast_to(blank_strings(sentences)[:, tf.newaxis], shape[:2])
        return {"translations": tf.where(blank, tf.constant(""), tf.reshape(flat, shape[:2])),
                "scores": tf.where(blank, tf.zeros_like(scores), scores)}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def n_best_prefixed(self, sentences: Any, prefixes: Any) -> dict[str, tf.Tensor]:
        """`n_best` with every hypothesis starting with its sentence's target prefix (`translate_prefixed`)."""
        sentences, prefixes = one_target_per_source("Translator.n_best_prefixed", sentences, prefixes)
        tokens, scores = self.translate_ids(self.encode_sources(sentences),
                                            target_prefix=self.encode_prefixes(prefixes))
        shape = tf.shape(tokens)  # (N, K, T)
        flat = valid_utf8(self.target_tokenizer.detokenize(tf.reshape(tokens, [shape[0] * shape[1], shape[2]])))
        blank = tf.broadcast_to(blank_strings(sentences)[:, tf.newaxis], shape[:2])
        return {"translations": tf.where(blank, tf.constant(""), tf.reshape(flat, shape[:2])),
                "scores": tf.where(blank, tf.zeros_like(scores), scores)}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.int32),
                                                   tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
                                                   tf.TensorSpec([], tf.float32)])
    def sample(self, sentences: Any, seed: Any, temperature: Any, top_k: Any, top_p: Any) -> dict[str, tf.Tensor]:
        """One translation per sentence drawn at random from the model (strategy "sample", whatever `options` say).

        A sentence's draw depends only on `seed`, the sentence and the model (`decoding.sampling.source_keys`:
        the same sentence twice gets the same draw; for several, change the seed or ask `n_best` of a
        translator whose options sample). Exports serve this as the `sample` signature.

        Args:
            sentences: `tf.string [N]`.
            seed: int32 scalar in [0, 2**31).
            temperature: float32 scalar > 0: the logits are divided by it (toward 0: greedy; 1: the model's own).
            top_k: int32 scalar: draw among the k most probable tokens only (0: no cut).
            top_p: float32 scalar in (0, 1]: draw within the nucleus of that probability (1: no cut).

        Returns:
            `{"translation": tf.string [N], "score": float32 [N]}`: the sample and its log-probability under the
            model (untempered).
        """
        options = self.options.replace(strategy="sample", n_best=1)
        sampling = {"seed": seed, "temperature": temperature, "top_k": top_k, "top_p": top_p}
        tokens, scores = self.translate_ids(self.encode_sources(sentences), num_return=1, options=options,
                                            sampling=sampling)
        blank = blank_strings(sentences)
        translation = valid_utf8(self.target_tokenizer.detokenize(tokens[:, 0]))
        return {"translation": tf.where(blank, tf.constant(""), translation),
                "score": tf.where(blank, tf.zeros_like(scores[:, 0]), scores[:, 0])}

    @tf.function(autograph=False,
                 input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def score(self, sources: Any, targets: Any) -> tf.Tensor:
        """Forced decoding: log P(target | source) of given pairs, length-normalised with `alpha`.

        With `chunk_size`, `chunk_size` pairs at a time, shortest targets first:
        one teacher-forced pass over the whole batch would hold `(N, T,
        vocabulary)` float32 logits per model (20 GB for 10,000 pairs of 64
        tokens and 8,000 ids).

        Args:
            sources: `tf.string [N]`.
            targets: `tf.string [N]`, one translation per source; other counts
                raise `tf.errors.InvalidArgumentError` naming both.

        Returns:
            float32 `[N]`, comparable with the scores of `translate`.
        """
        sources, targets = one_target_per_source("Translator.score", sources, targets)
        source, target = self.encode_sources(sources), self.encode_targets(targets)
        if self.chunk_size:
            return score_in_length_order(self._score_ids, source, target, chunk_size=self.chunk_size,
                                         source_pad_id=self.source_tokenizer.pad_id,
                                         target_pad_id=self.target_tokenizer.pad_id, parallel=PARALLEL_CHUNKS)
        return self._score_ids(source, target)

    def _score_ids(self, source: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        """`decoding.score` of id batches, with this translator's models, alpha and special ids."""
        target_tokenizer = self.target_tokenizer
        return decoding.score(self.models, source, target, alpha=self.scoring_alpha, pad_id=target_tokenizer.pad_id,
                              bos_id=target_tokenizer.bos_id,
                              start_from_prefix=getattr(target_tokenizer, "language_last", False))

    def _run(self, name: str, batch: list[bytes], prefixes: list[str] | None = None) -> dict[str, tf.Tensor]:
        """The method `name` (`translate` or `n_best`; with `prefixes`, its `_prefixed` form) on a list of
        UTF-8 `bytes`, for the Python-level methods.

        Eagerly while the graph is not traced and the process's first `EAGER_SENTENCES` sentences last
        (a translator without XLA), else through the traced graph: the same results, sooner for a short
        first request.
        """
        inputs = [tf.constant(batch, tf.string)]
        if prefixes is not None:
            self.target_prefix_ids(prefixes)  # a bad prefix is named here, before any graph runs
            name += "_prefixed"
            inputs.append(tf.constant([text.encode("utf-8") for text in prefixes], tf.string))
        function = getattr(self, name)
        if 0 < len(batch) <= self._eager_left and function.experimental_get_tracing_count() == 0:
            self._eager_left -= len(batch)
            return function.python_function(*inputs)
        return function(*inputs)

    def translate_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[str]:
        """`translate` on cleaned, non-blank texts (`TranslatorInterface.translate_lines` calls it); with
        `prefixes` (one text per text), `translate_prefixed`."""
        result = self._run("translate", [text.encode("utf-8") for text in texts], prefixes)
        return [text.decode("utf-8") for text in result["translation"].numpy()]

    def n_best_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[tuple[str, float]]]:
        """`n_best` on cleaned, non-blank texts, as `(translation, score)` lists (`n_best_lines` calls it); with
        `prefixes`, `n_best_prefixed`."""
        result = self._run("n_best", [text.encode("utf-8") for text in texts], prefixes)
        return [[(text.decode("utf-8"), float(score)) for text, score in zip(texts, scores)]
                for texts, scores in zip(result["translations"].numpy(), result["scores"].numpy())]

    def score_batch(self, sources: list[str], targets: list[str]) -> list[float]:
        """`score` on cleaned pairs (`score_lines` calls it)."""
        return self.score(tf.constant([text.encode("utf-8") for text in sources], tf.string),
                          tf.constant([text.encode("utf-8") for text in targets], tf.string)).numpy().tolist()

    def attention(self, sentence: str | bytes, translation: str | bytes | None = None) -> AttentionMaps:
        """The `AttentionMaps` of `sentence` and the translation this translator gives it (or `translation`).

        The source goes through the same tokenization and truncation as `translate`, and the translation drawn is
        the one `translate` returns. One model only (an ensemble's members attend differently).

        Example:

        >>> maps = translator.attention("A dog runs.")  # doctest: +SKIP
        >>> maps.translation, maps.cross[-1].shape  # doctest: +SKIP
        ('Ein Hund läuft.', (4, 5, 6))
        """
        return translation_attention(self, sentence, translation)
