"""`TranslatorInterface`: what every engine's translator offers, and the line handling they share.

Four engines implement it (`keras_transformer.engines`):

| engine | class | needs |
| --- | --- | --- |
| TensorFlow (tensorflow-text, XLA, the SavedModel's graph) | `engines.tensorflow.Translator` | TensorFlow |
| CTranslate2 (its C++ search) | `engines.ctranslate2.CTranslate2Translator` | ctranslate2, sentencepiece |
| packed (Keras on any backend: JAX on a GPU) | `engines.packed.PackedTranslator` | Keras, sentencepiece |
| LiteRT (the search inside `model.tflite`) | `engines.litert.LiteRTTranslator` | ai-edge-litert, sentencepiece |

`keras_transformer.load_translator` returns the one a model folder calls for. Code written against this
interface (evaluation, plotting, serving, back-translation scripts) runs on each. Every method takes and returns
Python values: `str` (or UTF-8 `bytes`) in, `str` and `float` out, one result per input, in input order.

The base class does what is the same for every engine, once: each line is cleaned (`clean_line`: invalid UTF-8
and lone surrogates become U+FFFD), a blank line (empty or ASCII whitespace only) gives "" with score 0 without
reaching the engine, the other lines go to the engine in batches of similar length and come back in input order,
scores are normalised with `scoring_alpha`, and options are refused when the engine does not implement their
strategy (`check_options`). An engine implements only its batch methods: `translate_batch`, `n_best_batch` and
`score_batch`, and `details_batch` / `n_best_details_batch` for `translate_detailed` / `n_best_detailed` (each
translation with its score, mean token log-probability and token count: `engines.details`).

Target prefixes (`translate_lines(..., target_prefix=..., target_lang=...)`): each line's translation starts with
its prefix, forced, then decoding goes on (docs/decoding.md, "Target prefixes"). A prefix is text of the target
language, tokenized by the model's target tokenizer without eos; `target_lang` puts the language token of a
multilingual model's target vocabulary first (`target_languages` lists them). The base class gives the engine one
prefix text per line (`prefixes=` of its batch methods), and the engine refuses, by `check_prefix_ids`, a prefix
that holds unk or leaves no room for a decoded token.

Documents (`translate_document`): segmented, cut and laid out again by `keras_transformer.documents`.

This module imports only the standard library, the package's errors, `engines.details`, `engines.terms` and
`keras_transformer.documents` (numpy, lxml, sentencex).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from keras_transformer.documents import alignment, document
from keras_transformer.engines.details import BLANK, SentenceDetails, Translation
from keras_transformer.engines.languages import language_token, source_side_token, target_language_in_source
from keras_transformer.engines.lines import ASCII_WHITESPACE, Lines, Prefixes, clean_line, is_blank, with_first_token
from keras_transformer.engines.terms import read_glossary, refuse
from keras_transformer.errors import ConfigError

if TYPE_CHECKING:
    from keras_transformer.decoding.options import DecodeOptions

# Source positions a sentence's tokens leave to the specials: the end token, and a multilingual model's language token.
SPECIAL_POSITIONS = 2


def scoring_alpha(options: DecodeOptions) -> float:
    """The length-penalty exponent scores are normalised with: `options.alpha` for beam search, 0 otherwise
    (greedy decoding and sampling score plain log-probabilities).

    Example:

    >>> from keras_transformer.decoding.options import DecodeOptions
    >>> scoring_alpha(DecodeOptions(alpha=0.6)), scoring_alpha(DecodeOptions(strategy="greedy", alpha=0.6))
    (0.6, 0.0)
    """
    return options.alpha if options.strategy == "beam" else 0.0


class TranslatorInterface(abc.ABC):
    """Translate, n-best, score and (where the engine has them) attention maps, from Python strings.

    The line handling is this class's (the module's docstring); an engine implements `translate_batch`,
    `n_best_batch` and `score_batch`, which get cleaned, non-blank lines only, and declares the strategies it
    decodes with in `strategies`.

    Attributes:
        options: the `keras_transformer.decoding.DecodeOptions` the translator decodes with.
        engine: a short name for messages ("tensorflow", "ctranslate2", "packed").
        strategies: the `DecodeOptions.strategy` values the engine implements.

    Example:

    >>> sorted(TranslatorInterface.__abstractmethods__)
    ['n_best_batch', 'score_batch', 'translate_batch']
    """

    options: DecodeOptions
    engine: str = "translator"
    strategies: tuple[str, ...] = ()
    # the language codes `target_lang` takes (a multilingual model's target language tokens)
    target_languages: tuple[str, ...] = ()
    # the language codes `source_lang` takes (a multilingual model's source language tokens)
    source_languages: tuple[str, ...] = ()
    # the most source positions the model encodes (its `max_length`), where the engine knows it
    max_source_length: int | None = None
    default_target_language: str | None = None  # used when none is given (mBART-large-cc25's decoder starts there)

    # ------------------------------------------------------------------ what an engine implements
    @abc.abstractmethod
    def translate_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[str]:
        """One translation per text (cleaned, not blank), in order; with `prefixes` (one text per text), each
        starting with its prefix."""

    @abc.abstractmethod
    def n_best_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[tuple[str, float]]]:
        """Per text (cleaned, not blank), `returned()` `(translation, score)` pairs, best first; with `prefixes`,
        every hypothesis starting with its text's prefix."""

    @abc.abstractmethod
    def score_batch(self, sources: list[str], targets: list[str]) -> Iterable[float]:
        """Per pair of cleaned texts, the forced-decoding score (`score_lines`)."""

    def details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[Translation]:
        """Per text (cleaned, not blank), its best translation as a `details.Translation` (text, score and the
        tokens generated), as `translate_batch` translates it."""
        raise NotImplementedError(f"The {self.engine} engine gives no per-sentence details (scores, log-probs).")

    def n_best_details_batch(self, texts: list[str], prefixes: list[str] | None = None) -> list[list[Translation]]:
        """Per text (cleaned, not blank), its hypotheses as `details.Translation`s, as `n_best_batch` gives them."""
        raise NotImplementedError(f"The {self.engine} engine gives no per-sentence details (scores, log-probs).")

    @classmethod
    def load(cls, paths: list[Any], checkpoint: Any = None, average: int | None = None,
             options: DecodeOptions | None = None, **settings: Any) -> TranslatorInterface:
        """The translator of the model folders `paths` (checked by `layout.check_models`; several: an ensemble),
        what `engines.loader.load_translator` calls for the engine registered as `engine`.

        Raises:
            ConfigError: this engine cannot decode these folders together (named).
        """
        raise NotImplementedError(f"The {cls.engine} engine is not loaded from model folders.")

    # ------------------------------------------------------------------ shared
    def check_options(self, options: DecodeOptions) -> DecodeOptions:
        """`options`, or a `ConfigError` naming their strategy when this engine does not implement it.

        Example:

        >>> class Greedy(TranslatorInterface):
        ...     engine, strategies = "greedy-only", ("greedy",)
        ...     translate_batch = n_best_batch = score_batch = None
        >>> from keras_transformer.decoding.options import DecodeOptions
        >>> Greedy().check_options(DecodeOptions())
        Traceback (most recent call last):
        ...
        keras_transformer.errors.ConfigError: The greedy-only engine does not implement strategy 'beam': ...
        """
        if options.strategy not in self.strategies:
            raise ConfigError(f"The {self.engine} engine does not implement strategy {options.strategy!r}: it "
                              f"decodes with {', '.join(self.strategies)} only.")
        return options

    @property
    def scoring_alpha(self) -> float:
        """The length-penalty exponent this translator's scores are normalised with (`scoring_alpha`)."""
        return scoring_alpha(self.options)

    def returned(self) -> int:
        """How many `(translation, score)` pairs `n_best_lines` gives a line: `options.returned()`."""
        return self.options.returned()

    def target_prefix_ids(self, prefixes: list[str]) -> list[list[int]]:
        """Per prefix text, its forced target ids, checked by `check_prefix_ids` (a `ValueError` naming a bad one).

        Raises:
            NotImplementedError: the engine takes no target prefixes (named).
        """
        raise NotImplementedError(f"The {self.engine} engine takes no target prefixes.")

    def target_prefixes(self, count: int, target_prefix: Prefixes = None, target_lang: str | None = None,
                        caller: str = "translator") -> list[str] | None:
        """Each of `count` lines' prefix text, from `target_prefix` (one text for every line, or a list of one per
        line) and `target_lang` (one of `target_languages`, or a code naming one: `de` for `__de__` or `deu_Latn`,
        `languages.language_token`), whose token goes first (else `default_target_language`'s); or None.

        Raises:
            ConfigError: a `target_lang` this model has no token for (its languages named).
            ValueError: a list of prefixes of another length than the lines (both counts named).

        Example:

        >>> class Plain(TranslatorInterface):
        ...     translate_batch = n_best_batch = score_batch = None
        >>> Plain().target_prefixes(2, "Ein"), Plain().target_prefixes(2)
        (['Ein', 'Ein'], None)
        >>> Plain().target_prefixes(1, target_lang="deu_Latn")
        Traceback (most recent call last):
        ...
        keras_transformer.errors.ConfigError: translator: target language 'deu_Latn': this model has no language ...
        """
        if source_side_token(target_lang, self.source_languages, self.target_languages, caller) is not None:
            target_lang = None  # it opens the source instead (`with_target_lang`)
        if target_prefix is None and target_lang is None and (target_lang := self.default_target_language) is None:
            return None
        if target_prefix is None or isinstance(target_prefix, (str, bytes)):
            prefixes = [clean_line(target_prefix or "", caller)] * count
        else:
            prefixes = [clean_line(text, caller) for text in target_prefix]
            if len(prefixes) != count:
                raise ValueError(f"{caller}: {count} line(s) but {len(prefixes)} target prefix(es); give one prefix "
                                 "per line, or one text for all.")
        if target_lang is not None:  # the model's token, or the one a code users know names (`languages`)
            target_lang = language_token(target_lang, self.target_languages, "target", caller)
            prefixes = [f"{target_lang} {text}".rstrip(ASCII_WHITESPACE) for text in prefixes]
        return prefixes

    def with_target_lang(self, lines: Sequence[str], target_lang: str | None = None,
                         caller: str = "translator") -> list[str]:
        """`lines` with `target_lang`'s token first where the model takes it in the source (MADLAD-400's `<2de>`:
        `languages.source_side_token`, a `ConfigError` for a code it has no token for); `lines` themselves otherwise."""
        token = source_side_token(target_lang, self.source_languages, self.target_languages, caller)
        return list(lines) if token is None else with_first_token(lines, token, caller)

    def with_source_lang(self, lines: Sequence[str], source_lang: str | None = None,
                         caller: str = "translator") -> list[str]:
        """`lines` with a multilingual model's source language token first (`source_languages`), in place of the
        source language its import set; blank lines stay blank. `lines` themselves without `source_lang`.

        Raises:
            ConfigError: a `source_lang` this model has no token for (its languages named).

        Example:

        >>> class Multilingual(TranslatorInterface):
        ...     translate_batch = n_best_batch = score_batch = None
        ...     source_languages = ("eng_Latn", "fra_Latn")
        >>> Multilingual().with_source_lang(["Bonjour.", ""], "fra_Latn")
        ['fra_Latn Bonjour.', '']
        """
        if source_lang is None:
            return list(lines)
        if target_language_in_source(self.source_languages, self.target_languages):  # MADLAD's <2xx>: targets
            raise ConfigError(f"{caller}: source language {source_lang!r}: this model's language tokens name the "
                              "target language (give target_lang); it reads any source language.")
        return with_first_token(lines, language_token(source_lang, self.source_languages, "source", caller), caller)

    def _in_length_order(self, method: str, lines: Lines, batch_size: int, run_batch: Callable[..., Iterable[Any]],
                         blank: Callable[[], Any], target_prefix: Prefixes = None,
                         target_lang: str | None = None) -> list[Any]:
        """`run_batch` over the cleaned non-blank lines, in batches of similar length (word counts: padding, and
        so wasted work, stays low; no result depends on its batch); a blank line gives `blank()`. With a
        target prefix (`target_prefixes`), `run_batch` gets each batch's prefixes as `prefixes=`."""
        caller = f"{type(self).__name__}.{method}"
        if isinstance(lines, (str, bytes)):
            raise TypeError(f"{caller} takes an iterable of lines (a list of str), got one {type(lines).__name__}: "
                            f"{lines[:40]!r}; translate one sentence with translator(sentence) or "
                            "translator([sentence]).")
        texts = self.with_target_lang([clean_line(line, caller) for line in lines], target_lang, caller)
        prefixes = self.target_prefixes(len(texts), target_prefix, target_lang, caller)
        outputs = [None if not is_blank(text) else blank() for text in texts]
        order = sorted((i for i, text in enumerate(texts) if outputs[i] is None),
                       key=lambda i: len(texts[i].split()))
        if prefixes is None:
            return _scattered(outputs, order, batch_size, lambda chunk: run_batch([texts[i] for i in chunk]))
        return _scattered(outputs, order, batch_size, lambda chunk: run_batch(
            [texts[i] for i in chunk], prefixes=[prefixes[i] for i in chunk]))

    def translate_terms(self, lines: Lines, constraints: Sequence[Any] | None = None, banned: Any = None,
                        glossary: Any = None, batch_size: int = 64, target_prefix: Prefixes = None,
                        target_lang: str | None = None, num_return: int = 1) -> list[list[dict[str, Any]]]:
        """Per line, `num_return` hypotheses held to terms, best first: `{"translation", "score", "unmet"}`,
        `unmet` listing the line's constraints the hypothesis lacks (one that cannot fit in the length limit).

        `constraints`: one list per line of target terms its translation must contain (each a text, or a list
        of alternative forms); `banned`: target texts no translation may contain; `glossary`: a
        `decoding.Glossary` or a TSV glossary's path, whose entries found in a line add their terms to its
        constraints (`engines.terms`, with the limits). The other arguments as in `translate_lines`.

        This default refuses (`engines.terms.refuse`): an engine that forces terms overrides it (the TensorFlow
        engine's is `engines.tensorflow_terms.TermSearch.translate_terms`).

        Raises:
            ConfigError: an engine that cannot force terms, sampling with constraints, an empty term, a term
                holding text the target vocabulary lacks, a request over the limits (each named).

        Example:

        >>> translator.translate_terms(["The agreement."], constraints=[["Vertrag"]])  # doctest: +SKIP
        [[{'translation': 'Der Vertrag.', 'score': -0.41, 'unmet': []}]]
        """
        raise refuse(self.engine)

    def translate_lines(self, lines: Lines, batch_size: int = 64, target_prefix: Prefixes = None,
                        target_lang: str | None = None, constraints: Sequence[Any] | None = None, banned: Any = None,
                        glossary: Any = None) -> list[str]:
        """One translation per line (`str`), in order; a blank line translates to "".

        Args:
            lines: an iterable of `str` (or UTF-8 `bytes`).
            batch_size: lines per batch of the engine.
            target_prefix: text each translation starts with (forced, then continued; included in the
                translation and its score), one for every line or a list of one per line ("" forces nothing).
            target_lang: a multilingual model's target language (one of `target_languages`): its language
                token is forced first, before `target_prefix`.
            constraints, banned, glossary: target terms each translation must contain, or must not
                (`translate_terms`, which also says which constraints a translation lacks).

        Raises:
            TypeError: `lines` is one `str` or `bytes` (give a list), or holds something else.
            ValueError: a prefix holding text the target vocabulary lacks, or too long (named).
            ConfigError: a `target_lang` the model has no token for (named).

        Example:

        >>> translator.translate_lines(["A dog.", "", "Two men play football."])  # doctest: +SKIP
        ['Ein Hund.', '', 'Zwei Männer spielen Fußball.']
        >>> translator.translate_lines(["A dog runs."], target_prefix="Der Hund")  # doctest: +SKIP
        ['Der Hund rennt.']
        """
        if constraints is not None or banned is not None or glossary is not None:
            found = self.translate_terms(lines, constraints, banned, glossary, batch_size, target_prefix, target_lang)
            return [hypotheses[0]["translation"] for hypotheses in found]
        return self._in_length_order("translate_lines", lines, batch_size, self.translate_batch, str,
                                     target_prefix, target_lang)

    def n_best_lines(self, lines: Lines, batch_size: int = 64, target_prefix: Prefixes = None,
                     target_lang: str | None = None, constraints: Sequence[Any] | None = None, banned: Any = None,
                     glossary: Any = None) -> list[list[tuple[str, float]]]:
        """Per line, `returned()` `(translation, score)` pairs, best first (sampling: that many draws).

        Scores are those `translate_lines` ranks by: log-probabilities, length-normalised with `scoring_alpha`.
        A blank line gives `("", 0.0)` pairs. `target_prefix` and `target_lang` as in `translate_lines`: every
        hypothesis starts with its line's prefix; `constraints`, `banned` and `glossary` as there too.

        Example:

        >>> translator.n_best_lines(["A dog."])[0][:2]  # doctest: +SKIP
        [('Ein Hund.', -0.21), ('Ein Hund rennt.', -0.74)]
        """
        count = self.returned()
        if constraints is not None or banned is not None or glossary is not None:
            found = self.translate_terms(lines, constraints, banned, glossary, batch_size, target_prefix, target_lang,
                                         count)
            return [[(hypothesis["translation"], hypothesis["score"]) for hypothesis in hypotheses]
                    for hypotheses in found]
        return self._in_length_order("n_best_lines", lines, batch_size, self.n_best_batch,
                                     lambda: [("", 0.0)] * count, target_prefix, target_lang)

    def translate_detailed(self, lines: Lines, batch_size: int = 64, target_prefix: Prefixes = None,
                           target_lang: str | None = None, constraints: Sequence[Any] | None = None,
                           banned: Any = None, glossary: Any = None) -> list[Translation]:
        """Per line, its translation with its quality signals: a `details.Translation`, whose `text` is what
        `translate_lines` gives, `score` what `n_best_lines` gives its best, `mean_log_prob` the mean of its
        tokens' log-probabilities (</s> counted) and `tokens` their number; `to_dict()` for JSON.

        A blank line gives `details.BLANK` (text "", every signal 0). Arguments as `translate_lines` (terms
        too: then the hypotheses of `translate_terms`).

        Example:

        >>> best = translator.translate_detailed(["A dog runs."])[0]  # doctest: +SKIP
        >>> best.text, round(best.mean_log_prob, 2), round(best.score, 2), best.tokens  # doctest: +SKIP
        ('Ein Hund rennt.', -0.16, -0.49, 5)
        """
        if constraints is not None or banned is not None or glossary is not None:
            return [row[0] for row in self._terms_detailed(lines, constraints, banned, glossary, batch_size,
                                                           target_prefix, target_lang, 1)]
        return self._in_length_order("translate_detailed", lines, batch_size, self.details_batch, lambda: BLANK,
                                     target_prefix, target_lang)

    def n_best_detailed(self, lines: Lines, batch_size: int = 64, target_prefix: Prefixes = None,
                        target_lang: str | None = None, constraints: Sequence[Any] | None = None,
                        banned: Any = None, glossary: Any = None) -> list[list[Translation]]:
        """Per line, the hypotheses of `n_best_lines` with their quality signals (`details.Translation`s, as
        `translate_detailed` gives the best). Arguments as `n_best_lines`.

        Example:

        >>> [(t.text, round(t.mean_log_prob, 2)) for t in translator.n_best_detailed(["A dog."])[0]]  # doctest: +SKIP
        [('Ein Hund.', -0.09), ('Ein Hund rennt.', -0.2)]
        """
        count = self.returned()
        if constraints is not None or banned is not None or glossary is not None:
            return self._terms_detailed(lines, constraints, banned, glossary, batch_size, target_prefix, target_lang,
                                        count)
        return self._in_length_order("n_best_detailed", lines, batch_size, self.n_best_details_batch,
                                     lambda: [BLANK] * count, target_prefix, target_lang)

    def _terms_detailed(self, lines: Lines, constraints: Sequence[Any] | None, banned: Any, glossary: Any,
                        batch_size: int, target_prefix: Prefixes, target_lang: str | None,
                        count: int) -> list[list[Translation]]:
        """`translate_terms`' hypotheses as `details.Translation`s."""
        found = self.translate_terms(lines, constraints, banned, glossary, batch_size, target_prefix, target_lang,
                                     count)
        return [[Translation.from_score(h["translation"], h["score"], h["tokens"], self.scoring_alpha)
                 for h in hypotheses] for hypotheses in found]

    def score_lines(self, sources: Lines, targets: Lines, batch_size: int = 64) -> list[float]:
        """Forced decoding: per pair, log P(target | source) under the model, normalised as `n_best_lines` is.

        Pairs go to the engine `batch_size` at a time, shortest targets first; scores come back in input order.

        Raises:
            ValueError: `sources` and `targets` of different lengths (both counts named).

        Example:

        >>> translator.score_lines(["A dog."], ["Ein Hund."])  # doctest: +SKIP
        [-0.21]
        """
        caller = f"{type(self).__name__}.score_lines"
        sources, targets = check_pairs(caller, sources, targets)
        source_texts = [clean_line(line, caller) for line in sources]
        target_texts = [clean_line(line, caller) for line in targets]
        order = sorted(range(len(source_texts)), key=lambda i: len(target_texts[i].split()))  # similar lengths together
        scores = _scattered([None] * len(source_texts), order, batch_size, lambda chunk: self.score_batch(
            [source_texts[i] for i in chunk], [target_texts[i] for i in chunk]))
        return [float(score) for score in scores]

    @property
    def source_language(self) -> str | None:
        """The language the model translates from, where the engine knows it: a multilingual import's source
        language (its source tokenizer's `language`, e.g. ``eng_Latn``); None otherwise."""
        return getattr(getattr(self, "source_tokenizer", None), "language", None)

    def count_source_tokens(self, text: str) -> int:
        """The tokens `text` takes on the source side: an estimate (`documents.document.estimate_tokens`, one per
        3 bytes of UTF-8) unless the engine counts with its tokenizer. `translate_document` cuts a sentence
        whose count is over its budget."""
        return document.estimate_tokens(text)

    def translate_document(self, text: str | bytes, format: str = "text", source_lang: str | None = None,
                           target_lang: str | None = None, batch_size: int = 64, max_tokens: int | None = None,
                           align: alignment.Aligner | None = None, attributes: Sequence[str] = ("alt", "title"),
                           max_bytes: int = document.MAX_DOCUMENT_BYTES, progress: document.Progress | None = None,
                           details: bool = False, glossary: Any = None, banned: Any = None) -> str | dict[str, Any]:
        """A whole document translated sentence by sentence, its layout or markup kept (docs/documents.md).

        Every sentence of the document goes to `translate_lines` in one call, so batches are formed by length
        across the document; a sentence over the token budget is cut at clause boundaries and its parts
        translated in order (`documents.cutting`).

        Args:
            text: the document (`str`, or UTF-8 `bytes`).
            format: "text" (paragraphs, line breaks, indentation and bullets kept), "html" or "xml" (XHTML too).
            source_lang: the document's language. For a multilingual model, one of `source_languages` (its token
                goes first, as in `with_source_lang`); for any model, it picks the segmenter's rules. None: the
                model's (`source_language`), else English rules.
            target_lang: a multilingual model's target language, as in `translate_lines`.
            batch_size: sentences per batch of the engine.
            max_tokens: the most source tokens of one sentence (by `count_source_tokens`); None: the model's
                `max_source_length` less `SPECIAL_POSITIONS`, or `documents.document.DEFAULT_MAX_TOKENS` (126)
                where the engine does not say.
            align: for markup, a word aligner (`documents.alignment`); None: the model's cross-attention
                (`attention`, penultimate decoder layer averaged over heads) where the engine gives it, else
                proportional.
            attributes: markup attributes whose text is translated.
            max_bytes: the largest document taken.
            progress: called with `(sentences done, sentences in all)` after each batch (sentences: the parts
                sent to the engine); the batches are the same as without it.
            details: also give each sentence's translation and quality signals (`translate_detailed`).
            glossary: a `decoding.Glossary` or a TSV glossary's path: each sentence (each part of a cut one) must
                contain the target terms of the entries found in it (`translate_terms`).
            banned: target texts no translation may contain.

        Returns:
            The translated document (`str`); with `details`, a JSON-ready dict: `text`, the translated document,
            and `sentences`, one record per sentence translated, in document order (a markup document's
            translated attributes included): `source`, `translation`, `score`, `mean_log_prob`, `log_prob` and
            `tokens` (`details.sentence_record`; a sentence cut into parts sums its parts' log-probabilities and
            tokens, its score normalised over them all).

        Raises:
            DocumentError: binary data, invalid UTF-8 (the byte offset named), a document over `max_bytes`, XML
                that is not well-formed, an unknown format.
            ConfigError: a `source_lang` or `target_lang` this multilingual model has no token for; a glossary or
                banned phrases on an engine that cannot force terms, or terms past their limits (named).

        Example:

        >>> class Upper(TranslatorInterface):
        ...     n_best_batch = score_batch = None
        ...     def translate_batch(self, texts, prefixes=None):
        ...         return [text.upper() for text in texts]
        >>> print(Upper().translate_document("A dog runs. It barks.\\n\\n  - A cat."))
        A DOG RUNS. IT BARKS.
        <BLANKLINE>
          - A CAT.
        >>> Upper().translate_document("<p>A <b>black</b> dog.</p>", format="html")
        '<p>A <b>BLACK</b> DOG.</p>'
        """
        caller = f"{type(self).__name__}.translate_document"
        terms: dict[str, Any] = {}
        if glossary is not None or banned is not None:  # each sentence's glossary matches: its constraints
            if type(self).translate_terms is TranslatorInterface.translate_terms:
                raise refuse(self.engine, "a glossary or banned phrases")
            terms = {"glossary": read_glossary(glossary), "banned": banned}

        def translate_lines(sentences: list[str]) -> list[str]:
            lines = self.document_sources(sentences, source_lang, caller)
            return self.translate_lines(lines, batch_size=batch_size, target_lang=target_lang, **terms)

        gathered = SentenceDetails(lambda sentences: self.translate_detailed(
            self.document_sources(sentences, source_lang, caller), batch_size=batch_size, target_lang=target_lang,
            **terms), self.scoring_alpha) if details else None
        translated = document.translate_document(
            gathered.translate_lines if gathered else translate_lines, text, format,
            **self.document_settings(source_lang, target_lang, max_tokens, align), attributes=attributes,
            max_bytes=max_bytes, progress=progress, chunk_size=batch_size,
            on_sentence=gathered.on_sentence if gathered else None)
        return {"text": translated, "sentences": gathered.sentences} if gathered else translated

    def document_settings(self, source_lang: str | None = None, target_lang: str | None = None,
                          max_tokens: int | None = None, align: alignment.Aligner | None = None) -> dict[str, Any]:
        """The keyword arguments of `documents.document.translate_document` by which `translate_document` reads a
        document for this model: the segmenter's language, the token budget and count, the aligner, the target
        language (a server that batches a document's sentences with other requests' reads them the same way).

        Example:

        >>> class Upper(TranslatorInterface):
        ...     translate_batch = n_best_batch = score_batch = None
        >>> settings = Upper().document_settings("de")
        >>> settings["source_lang"], settings["max_tokens"]
        ('de', 126)
        """
        if max_tokens is None:
            max_tokens = (self.max_source_length - SPECIAL_POSITIONS if self.max_source_length
                          else document.DEFAULT_MAX_TOKENS)
        specials = alignment.SPECIAL_PIECES + tuple(self.source_languages) + tuple(self.target_languages)
        return {"source_lang": source_lang or self.source_language, "max_tokens": max_tokens,
                "count_tokens": self.count_source_tokens,
                "align": align or alignment.attention_aligner(self.attention, specials), "target_lang": target_lang}

    def document_sources(self, sentences: Sequence[str], source_lang: str | None = None,
                         caller: str = "translator") -> list[str]:
        """A document's sentences as the engine takes them: with a multilingual model's source language token
        first when `source_lang` is given (`with_source_lang`); as they are otherwise.

        Example:

        >>> class Upper(TranslatorInterface):
        ...     translate_batch = n_best_batch = score_batch = None
        >>> Upper().document_sources(["A dog."], "en")
        ['A dog.']
        """
        if source_lang is not None and tuple(self.source_languages) and not target_language_in_source(
                self.source_languages, self.target_languages):
            return self.with_source_lang(sentences, source_lang, caller)
        return list(sentences)

    def with_options(self, options: DecodeOptions) -> TranslatorInterface:
        """A translator of the same loaded model(s) that decodes with `options` (a `DecodeOptions`).

        The weights are shared, not loaded again: a server keeps one per set of options it is asked for.
        `self` when `options` are its own.

        Raises:
            NotImplementedError: the engine decodes only with the options it was built with (named).
            ConfigError: options the engine cannot decode with (named).
        """
        raise NotImplementedError(f"The {self.engine} engine decodes with the options it was built with; "
                                  "build another translator for other options.")

    def attention(self, sentence: str, translation: str | None = None) -> Any:  # an AttentionMaps
        """The `attention.maps.AttentionMaps` of `sentence` and its translation (or the given `translation`).

        Raises:
            NotImplementedError: the engine exposes no attention weights (named).
        """
        raise NotImplementedError(f"The {self.engine} engine gives no attention maps; load the model with the "
                                  "TensorFlow engine (a training workdir or a SavedModel export) to draw them.")

    def __call__(self, sentences: str | bytes | Lines) -> str | list[str]:
        """A `str` or a list of `str` in, the same out (`bytes` are taken as UTF-8)."""
        if isinstance(sentences, (str, bytes)):
            return self.translate_lines([sentences])[0]
        return self.translate_lines(list(sentences))


def _scattered(outputs: list[Any], order: list[int], batch_size: int,
               run_batch: Callable[[list[int]], Iterable[Any]]) -> list[Any]:
    """`outputs` with `run_batch(indices)`'s results put at those indices, for `order` cut into batches of
    `batch_size` indices."""
    for start in range(0, len(order), int(batch_size)):
        chunk = order[start:start + int(batch_size)]
        for i, output in zip(chunk, run_batch(chunk)):
            outputs[i] = output
    return outputs


def check_pairs(caller: str, sources: Lines, targets: Lines) -> tuple[list[str | bytes], list[str | bytes]]:
    """`sources, targets` as lists, or a `ValueError` naming both counts (and a `TypeError` for one string).

    Example:

    >>> check_pairs("score_lines", ["a", "b"], ["x"])
    Traceback (most recent call last):
    ...
    ValueError: score_lines: 2 source(s) but 1 target(s); give one target per source.
    """
    for name, value in (("sources", sources), ("targets", targets)):
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{caller}: {name} must be a list of sentences, got one {type(value).__name__}.")
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise ValueError(f"{caller}: {len(sources)} source(s) but {len(targets)} target(s); give one target per "
                         "source.")
    return sources, targets
