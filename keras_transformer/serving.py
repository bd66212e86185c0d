"""`keras-transformer serve`: any model folder behind HTTP, speaking TensorFlow Serving's REST API.

One process serves one model (a training workdir, a SavedModel or CTranslate2
export, or an ensemble: whatever `inference.load_translator` loads; the command
line hands `serve` the loading function). Endpoints (docs/serving.md):

```
GET  /v1/models/NAME                    TensorFlow Serving's model status (LOADING, then AVAILABLE)
GET  /v1/models/NAME/metadata           the signatures, as TensorFlow Serving describes them
POST /v1/models/NAME:predict            {"instances": [...]} (rows) or {"inputs": ...} (columns), "signature_name"
POST /translate                         {"sentences": [...], "beam_size": 5, "strategy": "sample", ...}
GET  /healthz, /readyz, /stats          liveness; readiness (after load and warm-up); batch sizes and counts
```

Concurrent requests are decoded together: a request waits at most
`batch_wait` seconds for others asking for the same decoding (the same
`DecodeOptions`), up to `max_batch` sentences, and a batch is formed while the
previous one decodes, so many small clients get the throughput of batches. One
thread runs the engine, one batch at a time. SIGTERM (or Ctrl-C) stops
accepting connections, lets the requests in flight finish, and exits 0.

This module imports the standard library and the decoding options; the server
itself (starlette, uvicorn: the `serve` extra) is imported when it starts, and
TensorFlow only by the engine the loading function returns.
"""

import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import random
import signal
import threading
import time

from keras_transformer.decoding.options import MAX_SEED, SAMPLING_FIELDS, DecodeOptions
from keras_transformer.errors import ConfigError

log = logging.getLogger("keras_transformer.serving")

VERSION = "1"  # the one version a TensorFlow Serving client sees: a model folder holds one model

# A warm-up translates this many sentences at once, so that a graph-building engine (the TensorFlow one decodes
# its first few sentences eagerly, then builds its graph) has built the graph requests use before it says ready.
WARM_UP_SENTENCES = 16


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How `keras-transformer serve` batches requests and what it accepts.

    Example:

    >>> ServeSettings(max_batch=32).batch_wait
    0.005
    """

    max_batch: int = 64  # sentences decoded together at most (a larger request is decoded alone)
    batch_wait: float = 0.005  # seconds a request waits for others to share its batch (0: no wait)
    max_body_bytes: int = 1 << 20  # a larger request body is refused with 413
    max_sentences: int = 256  # sentences (or pairs) per request; more: 413
    max_sentence_chars: int = 2000  # characters per sentence; more: 413
    variants: int = 8  # sets of decoding options kept ready (each a translator over the same weights)

    def __post_init__(self):
        for name in ("max_batch", "max_body_bytes", "max_sentences", "max_sentence_chars", "variants"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"serve: {name} must be a positive integer, got {getattr(self, name)!r}.")
        if not self.batch_wait >= 0:
            raise ConfigError(f"serve: batch_wait must be >= 0 seconds, got {self.batch_wait!r}.")


class RequestError(Exception):
    """A request the server refuses: `status` (400, 404, 413, 503) and a message naming the problem."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------------------ signatures
def _tensor(dtype, *dims):
    return {"dtype": dtype, "tensor_shape": {"dim": [{"size": str(size), "name": ""} for size in dims],
                                             "unknown_rank": False}}


# The SavedModel export's signatures (keras_transformer/export.py), served by every engine: inputs (batched ones
# first: `[-1]`; scalars `[]`) and outputs. `translate_ids` (token ids in) is the export's only one left out.
SIGNATURES = {
    "serving_default": {"inputs": {"inputs": _tensor("DT_STRING", -1)},
                        "outputs": {"translation": _tensor("DT_STRING", -1), "score": _tensor("DT_FLOAT", -1)}},
    "n_best": {"inputs": {"inputs": _tensor("DT_STRING", -1)},
               "outputs": {"translations": _tensor("DT_STRING", -1, -1), "scores": _tensor("DT_FLOAT", -1, -1)}},
    "sample": {"inputs": {"inputs": _tensor("DT_STRING", -1), "seed": _tensor("DT_INT32"),
                          "temperature": _tensor("DT_FLOAT"), "top_k": _tensor("DT_INT32"),
                          "top_p": _tensor("DT_FLOAT")},
               "outputs": {"translation": _tensor("DT_STRING", -1), "score": _tensor("DT_FLOAT", -1)}},
    "score": {"inputs": {"sources": _tensor("DT_STRING", -1), "targets": _tensor("DT_STRING", -1)},
              "outputs": {"score": _tensor("DT_FLOAT", -1)}},
}


def _batched(signature):
    return [name for name, spec in SIGNATURES[signature]["inputs"].items() if spec["tensor_shape"]["dim"]]


def signature_metadata(name):
    """What TensorFlow Serving's `GET /v1/models/NAME/metadata` answers for the served signatures.

    Example:

    >>> signature_metadata("en_de")["metadata"]["signature_def"]["signature_def"]["score"]["outputs"]["score"]["dtype"]
    'DT_FLOAT'
    """
    defs = {}
    for signature, spec in SIGNATURES.items():
        def info(kind):
            return {key: {**tensor, "name": f"{signature}_{key}:0"} for key, tensor in spec[kind].items()}
        defs[signature] = {"inputs": info("inputs"), "outputs": info("outputs"),
                           "method_name": "tensorflow/serving/predict"}
    return {"model_spec": {"name": name, "signature_name": "", "version": VERSION},
            "metadata": {"signature_def": {"signature_def": defs}}}


# ------------------------------------------------------------------------------------------ requests
def _string(value, where):
    """A JSON string, or TensorFlow Serving's `{"b64": ...}` for bytes, as `str`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True).decode("utf-8", "replace")
        except ValueError as error:
            raise RequestError(400, f"{where}: bad base64 ({error}).") from None
    raise RequestError(400, f"{where}: expected a string (or {{\"b64\": ...}}), got {_kind(value)}.")


def _kind(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def check_sentences(sentences, settings, what="sentences"):
    """Refuses (413) more sentences than `settings.max_sentences` and longer ones than `max_sentence_chars`.

    Example:

    >>> check_sentences(["A dog."] * 3, ServeSettings(max_sentences=2))
    Traceback (most recent call last):
    ...
    keras_transformer.serving.RequestError: 3 sentences in one request; this server takes at most 2 (--max-sentences).
    """
    if len(sentences) > settings.max_sentences:
        raise RequestError(413, f"{len(sentences)} {what} in one request; this server takes at most "
                                f"{settings.max_sentences} (--max-sentences).")
    for index, sentence in enumerate(sentences):
        if len(sentence) > settings.max_sentence_chars:
            raise RequestError(413, f"{what} {index} has {len(sentence)} characters; this server takes at most "
                                    f"{settings.max_sentence_chars} (--max-sentence-chars).")


def parse_json(body):
    """A request body as a JSON object, or a 400 naming what is wrong.

    Example:

    >>> parse_json(b'{"instances": ["A dog."]}')
    {'instances': ['A dog.']}
    >>> parse_json(b'{"instances": [')
    Traceback (most recent call last):
    ...
    keras_transformer.serving.RequestError: Malformed JSON: Expecting value: line 1 column 16 (char 15).
    """
    try:
        value = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise RequestError(400, f"The request body is not UTF-8 ({error}).") from None
    except json.JSONDecodeError as error:
        raise RequestError(400, f"Malformed JSON: {error}.") from None
    if not isinstance(value, dict):
        raise RequestError(400, f"The request body must be a JSON object, got {_kind(value)}.")
    return value


@dataclasses.dataclass(frozen=True)
class Work:
    """One request's share of a batch: what to decode (`kind`: "best", "n_best" or "score"), with which options,
    and its items (sentences; `(source, target)` pairs for "score"). Requests with equal `kind` and `options`
    are batched together."""

    kind: str
    options: DecodeOptions
    items: tuple

    @property
    def key(self):
        """What a batch shares."""
        return self.kind, self.options


TRANSLATE_FIELDS = ("strategy", "beam_size", "alpha", "max_extra", "early_exit", "n_best") + SAMPLING_FIELDS


def _options(defaults, given, seeded):
    """`defaults` with the fields in `given` (a 400 for a bad value); a sampling request without a seed gets a
    fresh one unless the server's defaults were given one (`seeded`)."""
    try:
        options = defaults.replace(**given)
    except (ConfigError, TypeError) as error:
        raise RequestError(400, str(error)) from None
    if options.sampling and "seed" not in given and not (seeded and defaults.sampling):
        options = options.replace(seed=random.randint(0, MAX_SEED))
    return options


def parse_translate(body, defaults, settings, seeded=False):
    """A `POST /translate` body as `Work`.

    `{"sentences": [...]}` plus any `DecodeOptions` field (`strategy`, `beam_size`, `alpha`, `max_extra`,
    `early_exit`, `n_best`, `top_k`, `top_p`, `temperature`, `seed`) replacing the server's default for this
    request; a sampling setting alone means `strategy: sample`. With `n_best`, each sentence gets that many
    hypotheses.

    Example:

    >>> work = parse_translate({"sentences": ["A dog."], "beam_size": 2}, DecodeOptions(), ServeSettings())
    >>> work.kind, work.options.beam_size, work.items
    ('best', 2, ('A dog.',))
    """
    unknown = sorted(set(body) - {"sentences", *TRANSLATE_FIELDS})
    if unknown:
        raise RequestError(400, f"Unknown field(s) {', '.join(unknown)}; /translate takes sentences and "
                                f"{', '.join(TRANSLATE_FIELDS)}.")
    sentences = body.get("sentences")
    if not isinstance(sentences, list):
        raise RequestError(400, f"sentences must be a list of strings, got {_kind(sentences)}.")
    sentences = [_string(value, f"sentences[{index}]") for index, value in enumerate(sentences)]
    check_sentences(sentences, settings)
    given = {key: value for key, value in body.items() if key in TRANSLATE_FIELDS and value is not None}
    options = _options(defaults, given, seeded)
    if "n_best" in given:
        return Work("n_best", options, tuple(sentences))
    return Work("best", options.replace(n_best=1), tuple(sentences))


def parse_predict(body, defaults, settings, seeded=False):
    """A TensorFlow Serving predict body (`POST /v1/models/NAME:predict`) as `(signature, Work, rows)`.

    Rows: `{"instances": [value, ...]}` (a single-input signature) or `[{"name": value, ...}, ...]`; columns:
    `{"inputs": [...]}` or `{"inputs": {"name": [...], ...}}`. `signature_name` picks a signature of
    `SIGNATURES` (default `serving_default`); strings may be `{"b64": ...}`. `rows` says which format the
    answer takes (`predictions` or `outputs`). The `sample` signature's scalars (seed, temperature, top_k,
    top_p) are one value per request: in rows, every instance gives the same (missing ones: the server's).

    Example:

    >>> signature, work, rows = parse_predict({"instances": ["A dog.", "A cat."]}, DecodeOptions(),
    ...                                       ServeSettings())
    >>> signature, work.kind, work.items, rows
    ('serving_default', 'best', ('A dog.', 'A cat.'), True)
    """
    signature = body.get("signature_name", "serving_default") or "serving_default"
    if signature not in SIGNATURES:
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
    batched = _batched(signature)
    rows = "instances" in body
    columns, scalars = {}, {}
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
                columns[name].append(_string(instance[name], f"instances[{index}].{name}"))
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
            columns[name] = [_string(value, f"inputs.{name}[{index}]") for index, value in enumerate(inputs[name])]
        scalars = {name: inputs[name] for name in inputs if name not in batched}
        if len({len(column) for column in columns.values()}) > 1:
            raise RequestError(400, "inputs: " + " but ".join(f"{name} has {len(column)} values"
                                                              for name, column in columns.items())
                               + "; give one per row.")
    for column in columns.values():
        check_sentences(column, settings)
    if signature == "score":
        return signature, Work("score", defaults, tuple(zip(columns["sources"], columns["targets"]))), rows
    if signature == "sample":
        given = {name: value for name, value in scalars.items() if value is not None}
        options = _options(defaults.replace(strategy="sample") if not defaults.sampling else defaults,
                           given, seeded)
        return signature, Work("best", options.replace(n_best=1), tuple(columns["inputs"])), rows
    if signature == "n_best":
        return signature, Work("n_best", defaults, tuple(columns["inputs"])), rows
    return signature, Work("best", defaults.replace(n_best=1), tuple(columns["inputs"])), rows


def _check_names(given, names, batched, where, signature):
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise RequestError(400, f"{where}: signature {signature} has no input {', '.join(unknown)} "
                                f"(its inputs: {', '.join(names)}).")
    missing = [name for name in batched if name not in given]
    if missing:
        raise RequestError(400, f"{where}: signature {signature} needs input {', '.join(missing)}.")


def predict_response(signature, work, results, rows):
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
    else:
        columns = {"translation": [text for text, _ in results], "score": [score for _, score in results]}
    single = len(columns) == 1
    if rows:
        count = len(work.items)
        if single:
            return {"predictions": next(iter(columns.values()))}
        return {"predictions": [{name: column[i] for name, column in columns.items()} for i in range(count)]}
    return {"outputs": next(iter(columns.values())) if single else columns}


# ------------------------------------------------------------------------------------------ the engine
class Engine:
    """A loaded translator and its variants (one per set of decoding options asked for), run from one thread.

    Args:
        translator: a `keras_transformer.interface.TranslatorInterface` (what `load_translator` returns).
        variants: how many variants to keep (least recently used ones go).

    Example:

    >>> engine = Engine(load_translator("saved_models/multi30k_en_de"))  # doctest: +SKIP
    >>> engine.run(("best", engine.options.replace(n_best=1)), [("A dog.",)])  # doctest: +SKIP
    [[('Ein Hund.', -0.29)]]
    """

    def __init__(self, translator, variants=8):
        self.translator = translator
        self.options = translator.options
        self._variants = collections.OrderedDict()
        self._size = variants

    def variant(self, options):
        """The translator decoding with `options` (the loaded one's `with_options`, kept for later requests)."""
        if options == self.options:
            return self.translator
        if options not in self._variants:
            while len(self._variants) >= self._size:
                self._variants.popitem(last=False)
            self._variants[options] = self.translator.with_options(options)
        self._variants.move_to_end(options)
        return self._variants[options]

    def run(self, key, parts):
        """Decodes one batch: `key` is `Work.key`, `parts` each request's items; returns each request's results
        (`(translation, score)` per sentence for "best", a list of them for "n_best", a score for "score")."""
        kind, options = key
        items = [item for part in parts for item in part]
        if not items:
            results = []
        elif kind == "score":
            results = self.variant(options).score_lines([s for s, _ in items], [t for _, t in items],
                                                        batch_size=len(items))
        elif kind == "best" and options.sampling and getattr(self.translator, "engine", "") == "tensorflow":
            # The TensorFlow engine's `sample` takes the sampling settings as inputs: one graph for every seed.
            translator = self.variant(dataclasses.replace(options, seed=0, top_k=0, top_p=1.0, temperature=1.0))
            outputs = translator.sample([line.encode("utf-8", "surrogatepass") for line in items], options.seed,
                                        float(options.temperature), options.top_k, float(options.top_p))
            results = [(text.decode("utf-8", "replace"), float(score))
                       for text, score in zip(outputs["translation"].numpy(), outputs["score"].numpy())]
        else:
            hypotheses = self.variant(options).n_best_lines(items, batch_size=len(items))
            count = options.returned()
            results = [row[0] for row in hypotheses] if kind == "best" else [row[:count] for row in hypotheses]
        split, start = [], 0
        for part in parts:
            split.append(results[start:start + len(part)])
            start += len(part)
        return split

    def warm_up(self):
        """Translates `WARM_UP_SENTENCES` sentences with the default options, as requests will."""
        sentences = [f"A warm-up sentence, number {i}." for i in range(WARM_UP_SENTENCES)]
        self.run(("best", self.options.replace(n_best=1)), [sentences])


# ------------------------------------------------------------------------------------------ batching
class Stats:
    """What the server has done: requests, sentences, and the batches' sizes (sentences and requests).

    Example:

    >>> stats = Stats(); stats.record(requests=3, sentences=5, seconds=0.2); stats.as_dict()["batch_sentences"]
    {'5': 1}
    """

    def __init__(self):
        self.requests = self.sentences = self.batches = 0
        self.batch_sentences = collections.Counter()
        self.batch_requests = collections.Counter()
        self.seconds = 0.0

    def record(self, requests, sentences, seconds):
        """Counts one decoded batch."""
        self.batches += 1
        self.requests += requests
        self.sentences += sentences
        self.batch_sentences[sentences] += 1
        self.batch_requests[requests] += 1
        self.seconds += seconds

    def as_dict(self):
        """The counts as JSON-friendly values (histogram keys are strings)."""
        return {"requests": self.requests, "sentences": self.sentences, "batches": self.batches,
                "largest_batch": max(self.batch_sentences, default=0),
                "mean_batch": round(self.sentences / self.batches, 2) if self.batches else 0.0,
                "batch_sentences": {str(k): v for k, v in sorted(self.batch_sentences.items())},
                "batch_requests": {str(k): v for k, v in sorted(self.batch_requests.items())},
                "decoding_seconds": round(self.seconds, 3)}


class _Pending:
    def __init__(self, work, future):
        self.work, self.future, self.arrived = work, future, time.monotonic()


class Batcher:
    """Gathers concurrent requests into batches of equal `Work.key` and runs them on the engine's thread.

    The oldest waiting request decides the next batch: it waits until `max_batch` sentences with its key are
    queued or `batch_wait` seconds have passed since it arrived, then takes those (in arrival order, at most
    `max_batch` sentences; a larger request goes alone). Requests arriving while a batch decodes queue for the
    next. Create it inside the running event loop.
    """

    def __init__(self, engine_call, settings, stats, executor):
        self._call, self._settings, self._stats, self._executor = engine_call, settings, stats, executor
        self._pending = collections.deque()
        self._wake = asyncio.Event()
        self.in_flight = 0

    @property
    def queued(self):
        """Requests waiting for a batch."""
        return len(self._pending)

    async def submit(self, work):
        """Decodes `work` in some batch and returns its results."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(work, future))
        self._wake.set()
        self.in_flight += 1
        try:
            return await future
        finally:
            self.in_flight -= 1

    def _ready(self, key):
        return sum(len(p.work.items) for p in self._pending if p.work.key == key) >= self._settings.max_batch

    async def run(self):
        """The batching loop (a task for the server's lifetime)."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            first = self._pending[0]
            key = first.work.key
            while not self._ready(key):
                left = first.arrived + self._settings.batch_wait - time.monotonic()
                if left <= 0:
                    break
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            batch, size = [], 0
            for pending in list(self._pending):
                if pending.work.key != key:
                    continue
                if batch and size + len(pending.work.items) > self._settings.max_batch:
                    break
                batch.append(pending)
                size += len(pending.work.items)
                self._pending.remove(pending)
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(self._executor, self._call, key,
                                                     [p.work.items for p in batch])
            except Exception as error:  # every request of the batch gets the engine's message
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
                continue
            seconds = time.monotonic() - started
            self._stats.record(len(batch), size, seconds)
            log.info("batch of %d sentence(s) from %d request(s) (%s, %s) in %.3f s", size, len(batch), key[0],
                     key[1].describe(), seconds)
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    pending.future.set_result(result)


# ------------------------------------------------------------------------------------------ the app
class _State:
    def __init__(self, name, settings, seeded):
        self.name, self.settings, self.seeded = name, settings, seeded
        self.engine = self.batcher = None
        self.ready = False
        self.failed = None
        self.stats = Stats()


def _json(payload, status=200):
    from starlette.responses import Response

    return Response(json.dumps(payload, ensure_ascii=False).encode("utf-8"), status_code=status,
                    media_type="application/json")


async def _body(request, settings):
    """The request body, refused with 413 past `settings.max_body_bytes` (before reading it when the client
    says its length)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise RequestError(413, f"The request body has {int(declared)} bytes; this server takes at most "
                                f"{settings.max_body_bytes} (--max-body-bytes).")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > settings.max_body_bytes:
            raise RequestError(413, f"The request body has more than {settings.max_body_bytes} bytes, the most "
                                    "this server takes (--max-body-bytes).")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(load, name, settings=None, seeded=False, on_failure=None):
    """The Starlette application of `keras-transformer serve` (`serve` runs it with uvicorn).

    Args:
        load: a function of no argument returning the translator (`inference.load_translator` bound to its
            arguments); called, then warmed up, on the engine's thread once the server listens.
        name: the model's name in TensorFlow Serving's URLs.
        settings: a `ServeSettings`.
        seeded: the translator's options carry a seed given by the user (sampling requests without a seed use
            it; otherwise each gets a fresh one).
        on_failure: called with the message when loading or warming up fails.

    Example:

    >>> app = build_app(lambda: load_translator("saved_models/multi30k_en_de"), "en_de")  # doctest: +SKIP
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    settings = settings or ServeSettings()
    state = _State(name, settings, seeded)
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    def load_and_warm_up():
        started = time.monotonic()
        engine = Engine(load(), settings.variants)
        loaded = time.monotonic()
        engine.warm_up()
        log.info("%s loaded in %.1f s, warmed up in %.1f s (%s engine; decoding by default: %s)", name,
                 loaded - started, time.monotonic() - loaded, getattr(engine.translator, "engine", "?"),
                 engine.options.describe())
        return engine

    async def start():
        try:
            state.engine = await asyncio.get_running_loop().run_in_executor(executor, load_and_warm_up)
        except Exception as error:  # noqa: BLE001 (any failure ends the server with its message)
            state.failed = f"{type(error).__name__}: {error}" if not isinstance(error, (ValueError, OSError)) \
                else str(error)
            log.error("keras-transformer serve: error: %s", state.failed)
            if on_failure is not None:
                on_failure(state.failed)
            return
        state.ready = True

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.batcher = Batcher(lambda key, parts: state.engine.run(key, parts), settings, state.stats, executor)
        tasks = [asyncio.create_task(state.batcher.run()), asyncio.create_task(start())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            executor.shutdown(wait=False, cancel_futures=True)

    def check_model(model):
        if model != state.name:
            raise RequestError(404, f"Model {model!r} is not served here; this server serves {state.name!r}.")

    def check_ready():
        if state.failed:
            raise RequestError(503, f"The model failed to load: {state.failed}")
        if not state.ready:
            raise RequestError(503, f"{state.name} is loading; /readyz says when it is ready.")

    async def decode(work):
        try:
            return await state.batcher.submit(work)
        except (ValueError, TypeError, NotImplementedError) as error:  # options the engine refuses (named)
            raise RequestError(400, str(error)) from None

    async def model_status(request):
        check_model(request.path_params["model"])
        version = request.path_params.get("version", VERSION)
        if version != VERSION:
            raise RequestError(404, f"Version {version} of {state.name} is not served; version {VERSION} is.")
        status = ("AVAILABLE", "OK", "") if state.ready else \
            ("END", "UNKNOWN", state.failed) if state.failed else ("LOADING", "OK", "")
        return _json({"model_version_status": [{"version": VERSION, "state": status[0],
                                                "status": {"error_code": status[1], "error_message": status[2]}}]})

    async def metadata(request):
        check_model(request.path_params["model"])
        return _json(signature_metadata(state.name))

    async def predict(request):
        head, _, method = request.path_params["target"].rpartition(":")
        model, version = (request.path_params["model"], head) if "model" in request.path_params else (head, None)
        if not model:
            raise RequestError(404, f"Unknown path {request.url.path}; predict is POST /v1/models/NAME:predict.")
        check_model(model)
        if version not in (None, VERSION):
            raise RequestError(404, f"Version {version} of {state.name} is not served; version {VERSION} is.")
        if method != "predict":
            raise RequestError(400 if method in ("classify", "regress") else 404,
                               f"{method or 'no method'}: this server answers predict only "
                               "(POST /v1/models/NAME:predict).")
        body = parse_json(await _body(request, settings))
        check_ready()
        signature, work, rows = parse_predict(body, state.engine.options, settings, state.seeded)
        results = await decode(work)
        return _json(predict_response(signature, work, results, rows))

    async def translate(request):
        body = parse_json(await _body(request, settings))
        check_ready()
        work = parse_translate(body, state.engine.options, settings, state.seeded)
        results = await decode(work)
        if work.kind == "n_best":
            payload = {"translations": [[text for text, _ in row] for row in results],
                       "scores": [[score for _, score in row] for row in results]}
        else:
            payload = {"translations": [text for text, _ in results], "scores": [score for _, score in results]}
        if work.options.sampling:
            payload["seed"] = work.options.seed
        return _json(payload)

    async def healthz(request):
        return _json({"status": "alive"})

    async def readyz(request):
        if state.ready:
            return _json({"status": "ready", "model": state.name})
        return _json({"status": "failed" if state.failed else "loading", "model": state.name,
                      "error": state.failed or ""}, status=503)

    async def stats(request):
        batcher = state.batcher
        return _json({"model": state.name, "ready": state.ready, **state.stats.as_dict(),
                      "queued": batcher.queued if batcher else 0, "in_flight": batcher.in_flight if batcher else 0,
                      "settings": dataclasses.asdict(settings)})

    async def refused(request, error):
        return _json({"error": str(error)}, status=error.status)

    async def internal(request, error):
        log.exception("%s %s failed", request.method, request.url.path, exc_info=error)
        return _json({"error": f"{type(error).__name__}: {error}"}, status=500)

    async def http_error(request, error):
        message = {404: f"Unknown path {request.url.path}.",
                   405: f"{request.method} is not allowed on {request.url.path}."}.get(error.status_code,
                                                                                       str(error.detail))
        return _json({"error": message}, status=error.status_code)

    routes = [Route("/v1/models/{model}", model_status, methods=["GET"]),
              Route("/v1/models/{model}/versions/{version}", model_status, methods=["GET"]),
              Route("/v1/models/{model}/metadata", metadata, methods=["GET"]),
              Route("/v1/models/{model}/versions/{version}/metadata", metadata, methods=["GET"]),
              Route("/v1/models/{target}", predict, methods=["POST"]),
              Route("/v1/models/{model}/versions/{target}", predict, methods=["POST"]),
              Route("/translate", translate, methods=["POST"]),
              Route("/healthz", healthz, methods=["GET"]),
              Route("/readyz", readyz, methods=["GET"]),
              Route("/stats", stats, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={RequestError: refused, HTTPException: http_error, Exception: internal})
    app.state.serving = state
    return app


def check_installed():
    """Raises `ConfigError` (naming the extra) when the server's packages (starlette, uvicorn) are missing.

    Example:

    >>> check_installed()  # doctest: +SKIP
    """
    missing = []
    for module in ("starlette", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(f"keras-transformer serve needs {' and '.join(missing)}: "
                          "the serve extra of keras-transformer-mt (pip install '.[serve]' in a clone).")


def serve(load, name, host="127.0.0.1", port=8501, settings=None, seeded=False):
    """Runs the server until SIGTERM or SIGINT (`keras-transformer serve`); returns the exit status.

    The model loads and warms up after the server listens (`/healthz` answers at once, `/readyz` once
    ready). On SIGTERM the server stops accepting connections, the requests in flight finish, and this
    returns 0; a model that fails to load ends it with 2.

    Args:
        load, name, settings, seeded: see `build_app`.
        host, port: where to listen (TensorFlow Serving's REST port is 8501).

    Example:

    >>> serve(lambda: load_translator("saved_models/multi30k_en_de"), "multi30k_en_de")  # doctest: +SKIP
    """
    check_installed()
    import uvicorn

    class Server(uvicorn.Server):
        # uvicorn re-raises the signal that stopped it once it has shut down, which would end the process by
        # SIGTERM; the server has finished its requests by then, so the process exits with a status of its own.
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    failures = []

    def failed(message):
        failures.append(message)
        server.should_exit = True

    app = build_app(load, name, settings, seeded, on_failure=failed)
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                                   lifespan="on"))
    log.info("serving %s at http://%s:%d/v1/models/%s (loading; /readyz says when it is ready)", name, host, port,
             name)
    server.run()
    if failures:
        return 2
    return 0 if server.started else 1
