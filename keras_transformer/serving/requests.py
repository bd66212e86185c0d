"""Requests of `keras-transformer serve` read and checked, and answers laid out: what the server accepts
(`ServeSettings`), `/translate` and TensorFlow Serving's predict bodies as `Work`, a predict answer, and the
documents of a `/translate` request (`Documents`: segmented when the request is read, put back together from their
sentences' translations when they are decoded)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import random
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.strategies import MAX_SEED, SAMPLING_FIELDS
from keras_transformer.documents import document
from keras_transformer.documents.alignment import Aligner
from keras_transformer.engines.details import SentenceDetails, Translation
from keras_transformer.engines.languages import source_side_token
from keras_transformer.errors import ConfigError, DocumentError
from keras_transformer.serving.signatures import SIGNATURES, batched_inputs, row_inputs
from keras_transformer.serving.terms import TERM_FIELDS, parse_terms, predict_terms, slot_flags

if TYPE_CHECKING:
    from keras_transformer.engines.interface import TranslatorInterface


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How `keras-transformer serve` batches requests and what it accepts.

    Each limit is a command-line flag of the same name (`max_beam_size`: `--max-beam-size`); a request past one is
    refused with a message naming the flag.

    Example:

    >>> ServeSettings(max_batch=32).batch_wait, ServeSettings(max_batch=32).max_queue
    (0.005, 256)
    """

    max_batch: int = 64  # sentences decoded together at most (a larger request is decoded in chunks of this size)
    batch_wait: float = 0.005  # seconds a request waits for others to share its batch (0: no wait)
    max_body_bytes: int = 1 << 20  # a larger request body is refused with 413
    max_sentences: int = 256  # sentences (or pairs) per request; more: 413
    max_sentence_chars: int = 2000  # characters per sentence; more: 413
    variants: int = 8  # sets of decoding options kept ready (each a translator over the same weights)
    # Sentences waiting for the engine, all requests together; a request that would pass it gets 503 at once.
    # None: 4 batches (`4 * max_batch`), and never fewer than `max_sentences` (the largest request always fits).
    max_queue: typing.Optional[int] = None
    max_beam_size: int = 16  # beams per sentence a request may ask for (memory grows with it)
    max_n_best: int = 16  # hypotheses (or samples) per sentence a request may ask for
    max_extra_limit: int = 256  # a request's max_extra (output tokens past the source length) at most
    max_top_k: int = 1000  # a sampling request's top_k at most
    min_temperature: float = 0.05  # a sampling request's temperature at least (near 0 the logits overflow)
    max_alpha: float = 10.0  # a request's length-penalty exponent at most
    poll_seconds: float = 1.0  # how often a base folder of numbered versions is looked at for a new one

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_body_bytes", "max_sentences", "max_sentence_chars", "variants",
                     "max_beam_size", "max_n_best", "max_top_k"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"serve: {name} must be a positive integer, got {getattr(self, name)!r}.")
        if not isinstance(self.max_extra_limit, int) or self.max_extra_limit < 0:
            raise ConfigError(f"serve: max_extra_limit must be an integer >= 0, got {self.max_extra_limit!r}.")
        if not self.batch_wait >= 0:
            raise ConfigError(f"serve: batch_wait must be >= 0 seconds, got {self.batch_wait!r}.")
        for name in ("min_temperature", "max_alpha", "poll_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"serve: {name} must be a finite number > 0, got {value!r}.")
        if self.max_queue is None:
            object.__setattr__(self, "max_queue", max(4 * self.max_batch, self.max_sentences))
        elif not isinstance(self.max_queue, int) or self.max_queue < self.max_sentences:
            raise ConfigError(f"serve: --max-queue ({self.max_queue!r}) must be an integer of at least "
                              f"--max-sentences ({self.max_sentences}): the largest request must fit in the queue.")


class RequestError(Exception):
    """A request the server refuses: `status` (400, 404, 413, 503, 504), a message naming the problem, and
    `headers` for the answer (`Retry-After` with a 503)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


# ------------------------------------------------------------------------------------------ requests
def _string(value: Any, where: str) -> str:
    """A JSON string, or TensorFlow Serving's `{"b64": ...}` for bytes, as `str`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True).decode("utf-8", "replace")
        except ValueError as error:
            raise RequestError(400, f"{where}: bad base64 ({error}).") from None
    raise RequestError(400, f"{where}: expected a string (or {{\"b64\": ...}}), got {_kind(value)}.")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    """A row of a `[-1, -1]` string input: a list of strings."""
    if not isinstance(value, list):
        raise RequestError(400, f"{where} must be a list of strings (a row of shape [-1, -1]), got {_kind(value)}.")
    return tuple(_string(item, f"{where}[{index}]") for index, item in enumerate(value))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def check_sentences(sentences: Sequence[str], settings: ServeSettings, what: str = "sentences") -> None:
    """Refuses (413) more sentences than `settings.max_sentences` and longer ones than `max_sentence_chars`.

    Example:

    >>> check_sentences(["A dog."] * 3, ServeSettings(max_sentences=2))
    Traceback (most recent call last):
    ...
    keras_transformer.serving.requests.RequestError: 3 sentences in one request; ... at most 2 (--max-sentences).
    """
    if len(sentences) > settings.max_sentences:
        raise RequestError(413, f"{len(sentences)} {what} in one request; this server takes at most "
                                f"{settings.max_sentences} (--max-sentences).")
    for index, sentence in enumerate(sentences):
        if len(sentence) > settings.max_sentence_chars:
            raise RequestError(413, f"{what} {index} has {len(sentence)} characters; this server takes at most "
                                    f"{settings.max_sentence_chars} (--max-sentence-chars).")


def parse_json(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a 400 naming what is wrong.

    Example:

    >>> parse_json(b'{"instances": ["A dog."]}')
    {'instances': ['A dog.']}
    >>> parse_json(b'{"instances": [')
    Traceback (most recent call last):
    ...
    keras_transformer.serving.requests.RequestError: Malformed JSON: Expecting value: line 1 column 16 (char 15).
    """
    try:
        value = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise RequestError(400, f"The request body is not UTF-8 ({error}).") from None
    except json.JSONDecodeError as error:
        raise RequestError(400, f"Malformed JSON: {error}.") from None
    except RecursionError:
        raise RequestError(400, "Malformed JSON: nested too deeply.") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise RequestError(400, "Malformed JSON: a number has more digits than this server reads.") from None
    if not isinstance(value, dict):
        raise RequestError(400, f"The request body must be a JSON object, got {_kind(value)}.")
    return value


@dataclasses.dataclass(frozen=True)
class Work:
    """One request's share of a batch: what to decode (`kind`: "best", "n_best", "score", or "details": the best
    with its quality signals, a `details.Translation` per sentence), with which options,
    and its items (sentences; `(source, target)` pairs for "score"; `(sentence, target prefix)` pairs where
    `prefixed`; with terms, `(sentence, prefix, constraints)`). Requests with equal `key` are batched together."""

    kind: str
    options: DecodeOptions
    items: tuple
    prefixed: bool = False  # items are (sentence, target prefix) pairs: each translation starts with its prefix
    # /translate's documents (format text, html or xml): the items are their sentences, in order
    documents: Documents | None = dataclasses.field(default=None, compare=False)
    # /translate with terms: the request's banned phrases (none: ()), and its items are (sentence, target prefix
    # or None, constraints) triples (`serving.terms`); None: no terms
    banned: tuple[str, ...] | None = None
    # the `translate_constrained` signature's constraint slots, a row per item, for its `met` output
    slots: tuple[tuple[str, ...], ...] | None = dataclasses.field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, DecodeOptions, bool, tuple[str, ...] | None]:
        """What a batch shares: `(kind, options, prefixed, banned)`."""
        return self.kind, self.options, self.prefixed, self.banned


TRANSLATE_FIELDS = ("strategy", "beam_size", "alpha", "max_extra", "early_exit", "n_best") + SAMPLING_FIELDS
PREFIX_FIELDS = ("target_prefix", "target_lang")  # /translate's forced starts of the translations
# /translate's `format`: each of `sentences` one sentence ("lines"), or one document of these formats
FORMATS = ("lines", *document.FORMATS)


@dataclasses.dataclass(frozen=True)
class Documents:
    """The documents of a `/translate` request, as `plan_documents` read them: each document's plan
    (`documents.document.DocumentPlan`: its sentences after segmentation, long ones cut in parts, are the
    request's), the aligner that places a markup document's inline tags, and the translator's `scoring_alpha`
    (a sentence cut in parts is scored over them all)."""

    format: str
    plans: tuple[document.DocumentPlan, ...]
    align: Aligner | None = None
    alpha: float = 0.0

    @property
    def counts(self) -> tuple[int, ...]:
        """How many of the request's sentences each document has."""
        return tuple(len(plan.lines) for plan in self.plans)


def plan_documents(translator: TranslatorInterface, texts: Sequence[str], format: str,
                   source_lang: str | None = None, target_lang: str | None = None) -> tuple[list[str], Documents]:
    """The sentences of `texts` (documents of `format`: "text", "html" or "xml") as the translator would send
    them to its engine (segmented, long ones cut: `documents.document.plan_document`, read this once), in order,
    and the `Documents` that puts their translations back (`assemble_documents`).

    Raises:
        RequestError: 400 for a document that cannot be read (binary, markup that cannot be parsed; named by
            its index).

    Example:

    >>> from keras_transformer.engines.interface import TranslatorInterface
    >>> class Upper(TranslatorInterface):
    ...     translate_batch = n_best_batch = score_batch = None
    ...     options = DecodeOptions()
    >>> sentences, documents = plan_documents(Upper(), ["A dog runs. It barks.", "<p>Hi <b>you</b>.</p>"], "html")
    >>> sentences, documents.counts
    (['A dog runs.', 'It barks.', 'Hi you.'], (2, 1))
    """
    settings = translator.document_settings(source_lang, target_lang)
    align = settings.pop("align")
    plans = []
    for index, text in enumerate(texts):
        try:
            plans.append(document.plan_document(text, format, **settings))
        except DocumentError as error:
            raise RequestError(400, f"sentences[{index}]: {error}") from None
    sentences = [line for plan in plans for line in plan.lines]
    return sentences, Documents(format, tuple(plans), align, translator.scoring_alpha)


def assemble_documents(documents: Documents, results: Sequence[Translation]) -> dict[str, Any]:
    """The `/translate` answer for documents, from `results`, one `details.Translation` per sentence
    `plan_documents` gave, in its order: each document translated whole (`translations`); the mean score of its
    sentences' parts (`scores`) and its tokens' mean log-probability (`mean_log_probs`), 0 for a document
    without any; per document its sentences' records (`sentences`: `source`, `translation`, `score`,
    `mean_log_prob`, `log_prob`, `tokens`, as `translate_document(..., details=True)` gives them).

    Example:

    >>> from keras_transformer.engines.interface import TranslatorInterface
    >>> class Upper(TranslatorInterface):
    ...     translate_batch = n_best_batch = score_batch = None
    ...     options = DecodeOptions()
    >>> sentences, documents = plan_documents(Upper(), ["A dog runs.\\n\\n- It barks."], "text")
    >>> answer = assemble_documents(documents, [Translation(s.upper(), -0.5, -2.0, 4) for s in sentences])
    >>> answer["translations"], answer["scores"], answer["mean_log_probs"]
    (['A DOG RUNS.\\n\\n- IT BARKS.'], [-0.5], [-0.5])
    >>> answer["sentences"][0][1]["translation"], answer["sentences"][0][1]["mean_log_prob"]
    ('IT BARKS.', -0.5)
    """
    translations, scores, mean_log_probs, sentences = [], [], [], []
    start = 0
    for plan in documents.plans:
        own = list(results[start:start + len(plan.lines)])
        start += len(own)
        gathered = SentenceDetails(functools.partial(_given, own), documents.alpha)  # the plan's lines, in order
        translations.append(document.translate_plan(gathered.translate_lines, plan, documents.align,
                                                    on_sentence=gathered.on_sentence))
        tokens = sum(translation.tokens for translation in own)
        scores.append(sum(translation.score for translation in own) / len(own) if own else 0.0)
        mean_log_probs.append(sum(translation.log_prob for translation in own) / tokens if tokens else 0.0)
        sentences.append(gathered.sentences)
    return {"translations": translations, "scores": scores, "mean_log_probs": mean_log_probs,
            "sentences": sentences}


def _given(translations: list[Translation], lines: list[str]) -> list[Translation]:
    """`translations`, the translations of `lines` already decoded."""
    return translations


def checked_prefixes(translator: TranslatorInterface | None, sentences: Sequence[str], target_prefix: Any = None,
                     target_lang: Any = None, where: str = "target_prefix") -> list[str] | None:
    """Each sentence's target prefix (`TranslatorInterface.target_prefixes`), checked by the translator's
    tokenizer (`target_prefix_ids`) before the request joins a batch: a bad prefix is its own request's 400,
    never its batch's failure. None when neither is given.

    Example:

    >>> checked_prefixes(None, ["A dog."]) is None
    True
    """
    if target_prefix is None and target_lang is None:
        return None
    if translator is None:
        raise RequestError(400, f"{where}: this server takes no target prefixes.")
    if target_lang is not None and not isinstance(target_lang, str):
        raise RequestError(400, f"target_lang must be a string (a language code), got {_kind(target_lang)}.")
    if isinstance(target_prefix, list):
        target_prefix = [_string(value, f"{where}[{index}]") for index, value in enumerate(target_prefix)]
    elif target_prefix is not None:
        target_prefix = _string(target_prefix, where)
    try:
        prefixes = translator.target_prefixes(len(sentences), target_prefix, target_lang, where)
        assert prefixes is not None  # a prefix or a language was given
        translator.target_prefix_ids([text for sentence, text in zip(sentences, prefixes) if sentence.strip()])
    except (ConfigError, ValueError, NotImplementedError) as error:
        raise RequestError(400, str(error)) from None
    return prefixes


def _options(defaults: DecodeOptions, given: dict[str, Any], seeded: bool, settings: ServeSettings) -> DecodeOptions:
    """`defaults` with the fields in `given` (a 400 for a bad value or one past `settings`' limits); a sampling
    request without a seed gets a fresh one unless the server's defaults were given one (`seeded`)."""
    try:
        options = defaults.replace(**given)
    except (ConfigError, TypeError) as error:
        raise RequestError(400, str(error)) from None
    check_limits(options, settings, given)
    if options.sampling and "seed" not in given and not (seeded and defaults.sampling):
        options = options.replace(seed=random.randint(0, MAX_SEED))
    return options


def check_limits(options: DecodeOptions, settings: ServeSettings, given: Mapping[str, Any] | None = None) -> None:
    """Refuses (400, naming the flag) decoding options past the server's limits (`ServeSettings.max_beam_size`,
    `max_n_best`, `max_extra_limit`, `max_top_k`, `min_temperature`, `max_alpha`); `given` names the request's own
    fields (every field when None).

    Example:

    >>> check_limits(DecodeOptions(beam_size=64), ServeSettings())
    Traceback (most recent call last):
    ...
    keras_transformer.serving.requests.RequestError: beam_size 64 is more than this server allows (--max-beam-size 16).
    """
    given = options.to_dict() if given is None else given
    checks = [("beam_size", options.beam_size if options.strategy == "beam" else 1, settings.max_beam_size,
               "--max-beam-size"),
              ("n_best", options.n_best or 0, settings.max_n_best, "--max-n-best"),
              ("max_extra", options.max_extra, settings.max_extra_limit, "--max-extra-limit"),
              ("top_k", options.top_k, settings.max_top_k, "--max-top-k"),
              ("alpha", options.alpha, settings.max_alpha, "--max-alpha")]
    for name, value, limit, flag in checks:
        if value > limit:
            where = "" if name in given else " (the server's default)"
            raise RequestError(400, f"{name} {value:g}{where} is more than this server allows ({flag} {limit:g}).")
    if options.sampling and options.temperature < settings.min_temperature:
        raise RequestError(400, f"temperature {options.temperature:g} is less than this server allows "
                                f"(--min-temperature {settings.min_temperature:g}).")


def parse_translate(body: dict[str, Any], defaults: DecodeOptions, settings: ServeSettings, seeded: bool = False,
                    translator: TranslatorInterface | None = None) -> Work:
    """A `POST /translate` body as `Work`.

    `{"sentences": [...]}` plus any `DecodeOptions` field (`strategy`, `beam_size`, `alpha`, `max_extra`,
    `early_exit`, `n_best`, `top_k`, `top_p`, `temperature`, `seed`) replacing the server's default for this
    request; a sampling setting alone means `strategy: sample`. With `n_best`, each sentence gets that many
    hypotheses. `target_prefix` (a string for every sentence, or a list of one per sentence) and `target_lang`
    (a multilingual model's target language) force the translations' first tokens (`checked_prefixes`, with
    the served `translator`); `source_lang` (a multilingual model's source language) opens every sentence with
    its language token (`TranslatorInterface.with_source_lang`).

    `format` ("lines", the default: each string one sentence; "text", "html" or "xml": each string one document)
    makes each of `sentences` a document (`plan_documents`): its sentences after segmentation are the work's
    items, batched and limited (`--max-sentences`, `--max-sentence-chars`, the queue) as sentences are, and
    `Work.documents` puts them back together (`assemble_documents`). `source_lang` then also picks the
    segmenter's rules, for any model; `target_prefix` and `n_best` are for lines only.

    `details: true` (lines) gives each translation's quality signals (kind "details": `details.Translation`,
    `score` and `mean_log_prob` among them); documents always have them, per sentence.

    Example:

    >>> work = parse_translate({"sentences": ["A dog."], "beam_size": 2}, DecodeOptions(), ServeSettings())
    >>> work.kind, work.options.beam_size, work.items
    ('best', 2, ('A dog.',))
    """
    unknown = sorted(set(body) - {"sentences", "source_lang", "format", "details", *TRANSLATE_FIELDS,
                                  *PREFIX_FIELDS, *TERM_FIELDS})
    if unknown:
        raise RequestError(400, f"Unknown field(s) {', '.join(unknown)}; /translate takes sentences, source_lang, "
                                f"format, details and {', '.join(TRANSLATE_FIELDS + PREFIX_FIELDS + TERM_FIELDS)}.")
    details = body.get("details", False)
    if not isinstance(details, bool):
        raise RequestError(400, f"details must be true or false, got {_kind(details)}.")
    sentences = body.get("sentences")
    if not isinstance(sentences, list):
        raise RequestError(400, f"sentences must be a list of strings, got {_kind(sentences)}.")
    sentences = [_string(value, f"sentences[{index}]") for index, value in enumerate(sentences)]
    format = body.get("format", "lines")
    if format not in FORMATS:
        raise RequestError(400, f"format must be one of {', '.join(FORMATS)}, got {format!r}.")
    source_lang = body.get("source_lang")
    if source_lang is not None and not isinstance(source_lang, str):
        raise RequestError(400, f"source_lang must be a string (a language code), got {_kind(source_lang)}.")
    documents = None
    if format != "lines":  # each of `sentences` a document: its sentences, after segmentation, are the items
        for field in ("target_prefix", "n_best", *TERM_FIELDS):
            if body.get(field) is not None:
                raise RequestError(400, f"{field} is for sentences (format lines), not for documents (format "
                                        f"{format}).")
        if translator is None:
            raise RequestError(400, f"format {format}: this server takes no documents.")
        target_lang = body.get("target_lang") if isinstance(body.get("target_lang"), str) else None
        sentences, documents = plan_documents(translator, sentences, format, source_lang, target_lang)
        try:
            sentences = translator.document_sources(sentences, source_lang, "source_lang")
        except ConfigError as error:
            raise RequestError(400, str(error)) from None
    elif source_lang is not None:  # a multilingual model's source language token opens every sentence
        if translator is None:
            raise RequestError(400, "source_lang: this server takes no source language.")
        try:
            sentences = translator.with_source_lang(sentences, source_lang, "source_lang")
        except ConfigError as error:
            raise RequestError(400, str(error)) from None
    check_sentences(sentences, settings, "sentences" if documents is None else "sentences after segmentation")
    given = {key: value for key, value in body.items() if key in TRANSLATE_FIELDS and value is not None}
    options = _options(defaults, given, seeded, settings)
    target_lang = body.get("target_lang")
    if translator is not None and isinstance(target_lang, str):
        try:  # a model whose target language opens the source (MADLAD-400's <2de>): not a target prefix
            token = source_side_token(target_lang, translator.source_languages, translator.target_languages,
                                      "target_lang")
        except ConfigError as error:
            raise RequestError(400, str(error)) from None
        if token is not None:
            sentences, target_lang = translator.with_target_lang(sentences, target_lang, "target_lang"), None
    prefixes = checked_prefixes(translator, sentences, body.get("target_prefix"), target_lang)
    items = tuple(sentences) if prefixes is None else tuple(zip(sentences, prefixes))
    if prefixes is not None:
        check_sentences(prefixes, settings, "target prefixes")
    try:
        terms = parse_terms(body, sentences, translator, options.sampling)
    except ConfigError as error:
        raise RequestError(400, str(error)) from None
    if details and ("n_best" in given or terms is not None):
        raise RequestError(400, f"details is for the best translation without terms; "
                                f"{'n_best' if 'n_best' in given else 'constraints, glossary and banned'} give "
                                "scores only.")
    if terms is not None:  # (sentence, prefix, constraints) triples, batched with requests banning the same
        items = tuple(zip(sentences, prefixes or [None] * len(sentences), terms[0]))  # type: ignore[list-item]
        kind = "n_best" if "n_best" in given else "best"
        return Work(kind, options if kind == "n_best" else options.replace(n_best=1), items, prefixes is not None,
                    banned=terms[1])
    if "n_best" in given:
        return Work("n_best", options, items, prefixes is not None)
    kind = "details" if details or documents is not None else "best"  # documents: every sentence's signals
    return Work(kind, options.replace(n_best=1), items, prefixes is not None, documents)


def parse_predict(body: dict[str, Any], defaults: DecodeOptions, settings: ServeSettings, seeded: bool = False,
                  translator: TranslatorInterface | None = None) -> tuple[str, Work, bool]:
    """A TensorFlow Serving predict body (`POST /v1/models/NAME:predict`) as `(signature, Work, rows)`.

    Rows: `{"instances": [value, ...]}` (a single-input signature) or `[{"name": value, ...}, ...]`; columns:
    `{"inputs": [...]}` or `{"inputs": {"name": [...], ...}}`. `signature_name` picks a signature of
    `SIGNATURES` (default `serving_default`); strings may be `{"b64": ...}`. `rows` says which format the
    answer takes (`predictions` or `outputs`). The `sample` signature's scalars (seed, temperature, top_k,
    top_p) are one value per request: in rows, every instance gives the same (missing ones: the server's).
    The `translate_prefix` signature's prefixes are checked by the served `translator` (`checked_prefixes`);
    `translate_constrained`'s `constraints` and `banned` (a list of strings per row) are /translate's terms
    (`serving.terms.predict_terms`), checked likewise.

    Example:

    >>> signature, work, rows = parse_predict({"instances": ["A dog.", "A cat."]}, DecodeOptions(),
    ...                                       ServeSettings())
    >>> signature, work.kind, work.items, rows
    ('serving_default', 'best', ('A dog.', 'A cat.'), True)
    """
    signature = body.get("signature_name", "serving_default") or "serving_default"
    if not isinstance(signature, str) or signature not in SIGNATURES:
        raise RequestError(400, f"Unknown signature_name {signature!r}; this server serves "
                                f"{', '.join(SIGNATURES)}.")
    unknown = sorted(set(body) - {"signature_name", "instances", "inputs"})
    if unknown:
        raise RequestError(400, f"Unknown field(s) {', '.join(unknown)}; a predict request has instances (rows) "
                                "or inputs (columns), and signature_name.")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError(400, "A predict request has either instances (rows) or inputs (columns), "
                                f"got {'both' if 'instances' in body else 'neither'}.")
    names = list(SIGNATURES[signature]["inputs"])
    batched = batched_inputs(signature)
    listed = row_inputs(signature)  # a list of strings per row

    def value(name: str, given: Any, where: str) -> Any:
        return _strings(given, where) if name in listed else _string(given, where)

    rows = "instances" in body
    columns: dict[str, list[Any]] = {}
    scalars: dict[str, Any] = {}
    if rows:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise RequestError(400, f"instances must be a list, got {_kind(instances)}.")
        columns = {name: [] for name in batched}
        for index, instance in enumerate(instances):
            if len(names) == 1 and not (isinstance(instance, dict) and set(instance) == set(names)):
                instance = {names[0]: instance}
            if not isinstance(instance, dict):
                raise RequestError(400, f"instances[{index}]: signature {signature} takes named inputs "
                                        f"({', '.join(names)}), got {_kind(instance)}.")
            _check_names(instance, names, batched, f"instances[{index}]", signature)
            for name in batched:
                columns[name].append(value(name, instance[name], f"instances[{index}].{name}"))
            for name in set(instance) - set(batched):
                if name in scalars and scalars[name] != instance[name]:
                    raise RequestError(400, f"instances[{index}].{name} is {instance[name]!r} but an earlier "
                                            f"instance gave {scalars[name]!r}: {name} is one value per request.")
                scalars[name] = instance[name]
    else:
        inputs = body["inputs"]
        if len(names) == 1 and not isinstance(inputs, dict):
            inputs = {names[0]: inputs}
        if not isinstance(inputs, dict):
            raise RequestError(400, f"inputs: signature {signature} takes named inputs ({', '.join(names)}), "
                                    f"got {_kind(inputs)}.")
        _check_names(inputs, names, batched, "inputs", signature)
        for name in batched:
            if not isinstance(inputs[name], list):
                raise RequestError(400, f"inputs.{name} must be a list (shape [-1]), got {_kind(inputs[name])}.")
            columns[name] = [value(name, item, f"inputs.{name}[{index}]") for index, item in enumerate(inputs[name])]
        scalars = {name: inputs[name] for name in inputs if name not in batched}
        if len({len(column) for column in columns.values()}) > 1:
            raise RequestError(400, "inputs: " + " but ".join(f"{name} has {len(column)} values"
                                                              for name, column in columns.items())
                               + "; give one per row.")
    for name, column in columns.items():
        if name not in listed:
            check_sentences(column, settings)
    if signature == "score":
        return signature, Work("score", defaults, tuple(zip(columns["sources"], columns["targets"]))), rows
    if signature == "sample":
        given = {name: value for name, value in scalars.items() if value is not None}
        options = _options(defaults.replace(strategy="sample") if not defaults.sampling else defaults,
                           given, seeded, settings)
        return signature, Work("best", options.replace(n_best=1), tuple(columns["inputs"])), rows
    if signature == "n_best":
        return signature, Work("n_best", defaults, tuple(columns["inputs"])), rows
    if signature == "translate_prefix":
        prefixes = checked_prefixes(translator, columns["inputs"], columns["target_prefix"])
        assert prefixes is not None  # the signature's target_prefix input was given
        return signature, Work("best", defaults.replace(n_best=1), tuple(zip(columns["inputs"], prefixes)),
                               True), rows
    if signature == "translate_constrained":  # /translate's terms, each row's slots kept for `met`
        try:
            items, banned = predict_terms(columns["inputs"], columns["constraints"], columns["banned"], translator,
                                          defaults.sampling)
        except ConfigError as error:
            raise RequestError(400, str(error)) from None
        return signature, Work("best", defaults.replace(n_best=1), items, banned=banned,
                               slots=tuple(columns["constraints"])), rows
    return signature, Work("best", defaults.replace(n_best=1), tuple(columns["inputs"])), rows


def _check_names(given: Mapping[str, Any], names: Sequence[str], batched: Sequence[str], where: str,
                 signature: str) -> None:
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise RequestError(400, f"{where}: signature {signature} has no input {', '.join(unknown)} "
                                f"(its inputs: {', '.join(names)}).")
    missing = [name for name in batched if name not in given]
    if missing:
        raise RequestError(400, f"{where}: signature {signature} needs input {', '.join(missing)}.")


def predict_response(signature: str, work: Work, results: Sequence[Any], rows: bool) -> dict[str, Any]:
    """TensorFlow Serving's answer to a predict request: `{"predictions": [...]}` for rows (one object per
    instance, or the value alone when the signature has one output) or `{"outputs": ...}` for columns.

    Example:

    >>> work = Work("best", DecodeOptions(n_best=1), ("A dog.",))
    >>> predict_response("serving_default", work, [("Ein Hund.", -0.5)], rows=True)
    {'predictions': [{'translation': 'Ein Hund.', 'score': -0.5}]}
    """
    if signature == "score":
        columns = {"score": list(results)}
    elif signature == "n_best":
        columns = {"translations": [[text for text, _ in row] for row in results],
                   "scores": [[score for _, score in row] for row in results]}
    elif signature == "translate_constrained":
        assert work.slots is not None  # parse_predict keeps them
        columns = {"translation": [result[0] for result in results], "score": [result[1] for result in results],
                   "met": [slot_flags(row, result[2]) for row, result in zip(work.slots, results)]}
    else:
        columns = {"translation": [text for text, _ in results], "score": [score for _, score in results]}
    single = len(columns) == 1
    if rows:
        count = len(work.items)
        if single:
            return {"predictions": next(iter(columns.values()))}
        return {"predictions": [{name: column[i] for name, column in columns.items()} for i in range(count)]}
    return {"outputs": next(iter(columns.values())) if single else columns}
