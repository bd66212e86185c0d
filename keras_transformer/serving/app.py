"""The HTTP application of `keras-transformer serve` (starlette, imported when it is built) and the server that
runs it (uvicorn) until SIGTERM."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import math
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from keras_transformer.errors import ConfigError, format_size
from keras_transformer.serving.batching import Batcher, Cancelled, Engine, Stats
from keras_transformer.serving.metrics import CONTENT_TYPE, Metrics, route_of
from keras_transformer.serving.requests import (
    RequestError,
    ServeSettings,
    assemble_documents,
    check_limits,
    parse_json,
    parse_predict,
    parse_translate,
    predict_response,
)
from keras_transformer.serving.signatures import signature_metadata
from keras_transformer.serving.versions import AVAILABLE, END, LOADING, UNLOADING, ServedModel

if TYPE_CHECKING:
    from keras_transformer.serving.requests import Work
    from keras_transformer.serving.versions import Version

log = logging.getLogger("keras_transformer.serving")

DEADLINE_HEADER = "x-deadline-ms"  # milliseconds from its arrival within which a request wants its answer
MAX_DEADLINE_MS = 24 * 3600 * 1000
DRAIN_BYTES = 4 << 20  # a body past --max-body-bytes is read and dropped up to this (or 8 times the limit)
CLIENT_GONE = 499  # the status an answer nobody reads is counted under (nginx's "client closed request")


# ------------------------------------------------------------------------------------------ the app
class _State:
    def __init__(self, models: list[ServedModel], settings: ServeSettings, seeded: bool) -> None:
        self.models, self.settings, self.seeded = models, settings, seeded
        self.by_name = {model.name: model for model in models}
        self.batcher: Batcher | None = None
        self.failed: str | None = None
        self.stats = Stats()

    @property
    def ready(self) -> bool:
        return all(model.current is not None for model in self.models)


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import Response

    text = json.dumps(payload, ensure_ascii=False)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate a client sent, quoted back in a message
        body = json.dumps(payload).encode("ascii")
    return Response(body, status_code=status, media_type="application/json", headers=headers)


async def _body(request: Any, settings: ServeSettings) -> bytes:
    """The request body, refused with 413 past `settings.max_body_bytes`.

    A body past the limit is still read (and dropped) up to `DRAIN_BYTES`, so that the client, still sending,
    gets the 413 rather than a connection reset; a larger one is refused unread (when the client says its length).
    """
    limit = settings.max_body_bytes
    drain = max(8 * limit, DRAIN_BYTES)
    declared = request.headers.get("content-length")
    refused = None
    if declared is not None and declared.isdigit() and int(declared) > limit:
        refused = (f"The request body has {int(declared)} bytes; this server takes at most {limit} "
                   "(--max-body-bytes).")
        if int(declared) > drain:
            raise RequestError(413, refused)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if refused is None and size > limit:
            refused = f"The request body has more than {limit} bytes, the most this server takes (--max-body-bytes)."
        if refused is None:
            chunks.append(chunk)
        elif size > drain:
            break
    if refused is not None:
        raise RequestError(413, refused)
    return b"".join(chunks)


def _deadline(request: Any, body: dict[str, Any] | None) -> float | None:
    """The request's deadline (`time.monotonic()` seconds) from the `X-Deadline-Ms` header or a `/translate`
    body's `deadline_ms` (the earlier of the two), or None."""
    given = []
    header = request.headers.get(DEADLINE_HEADER)
    if header is not None:
        try:
            given.append(("X-Deadline-Ms", float(header)))
        except ValueError:
            raise RequestError(400, f"X-Deadline-Ms must be a number of milliseconds, got {header[:40]!r}.") from None
    if body is not None and "deadline_ms" in body:
        given.append(("deadline_ms", body.pop("deadline_ms")))
    deadline = None
    for name, value in given:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and 0 < value <= MAX_DEADLINE_MS):
            raise RequestError(400, f"{name} must be a number of milliseconds in (0, {MAX_DEADLINE_MS}], "
                                    f"got {str(value)[:40]}.")
        at = request.state.arrived + value / 1000
        deadline = at if deadline is None else min(deadline, at)
    return deadline


async def _disconnected(request: Any) -> None:
    """Returns once the client has gone (the ASGI server's `http.disconnect`; the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def build_app(load: Callable[[], Any] | Iterable[ServedModel], name: str | None = None,
              settings: ServeSettings | None = None, seeded: bool = False,
              on_failure: Callable[[str], None] | None = None) -> _Counted:
    """The Starlette application of `keras-transformer serve` (`serve` runs it with uvicorn).

    Args:
        load: a function of no argument returning the translator (`keras_transformer.load_translator` bound to its
            arguments), served under `name` as version 1; or a list of `versions.ServedModel` (several models, or
            a base folder of numbered versions), `name` then unused. Models load, then warm up, on a thread of
            their own once the server listens.
        name: the model's name in TensorFlow Serving's URLs.
        settings: a `ServeSettings`.
        seeded: the translator's options carry a seed given by the user (sampling requests without a seed use
            it; otherwise each gets a fresh one).
        on_failure: called with the message when loading or warming up fails at start.

    Example:

    >>> app = build_app(lambda: load_translator("saved_models/multi30k_en_de"), "en_de")  # doctest: +SKIP
    """
    from starlette.applications import Starlette

    settings = settings or ServeSettings()
    if callable(load):
        single = load
        models = [ServedModel(name, lambda path: single())]  # type: ignore[arg-type]  # serve names a single model
    else:
        models = list(load)
    server = _Server(models, settings, seeded, on_failure)
    app = Starlette(routes=server.routes(), lifespan=server.lifespan, exception_handlers=server.exception_handlers())
    app.state.serving = server.state
    return _Counted(app, server.state.stats, server.metrics)


class _Server:
    """What `build_app`'s handlers share: the models and their versions (loaded, warmed up and retired on a
    thread of their own), the batcher feeding the engine's thread, the settings and the metrics. Each handler is
    one method; `routes` and `exception_handlers` give them to Starlette."""

    def __init__(self, models: list[ServedModel], settings: ServeSettings, seeded: bool,
                 on_failure: Callable[[str], None] | None) -> None:
        self.models, self.settings, self.on_failure = models, settings, on_failure
        self.state = _State(models, settings, seeded)
        self.metrics = Metrics(self.state.stats, self.state)
        self.engine_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.loader_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="loader")

    # ---------------------------------------------------------------- versions: load, warm up, retire
    def load_and_warm_up(self, model: ServedModel, version: Version) -> Engine:
        started = time.monotonic()
        engine = Engine(model.load(version.path), self.settings.variants)
        try:
            check_limits(engine.options, self.settings)
        except RequestError as error:
            raise ConfigError(f"{model.name}: the model decodes by default with options this server refuses: "
                              f"{error}") from None
        loaded = time.monotonic()
        engine.warm_up()
        log.info("%s version %d loaded in %.1f s, warmed up in %.1f s (%s engine; decoding by default: %s)",
                 model.name, version.number, loaded - started, time.monotonic() - loaded,
                 getattr(engine.translator, "engine", "?"), engine.options.describe())
        memory = engine.search_memory(self.settings.max_batch, self.settings.max_beam_size)
        if memory is not None:
            log.info("%s: the largest request allowed (batches of %d sentences, beam %d, %d-token outputs at most) "
                     "holds about %s of search state", model.name, self.settings.max_batch,
                     self.settings.max_beam_size, engine.translator.max_target_length, format_size(memory))
        return engine

    async def bring_up(self, model: ServedModel, version: Version, at_start: bool) -> None:
        version.state = LOADING
        try:
            version.engine = await asyncio.get_running_loop().run_in_executor(self.loader_thread, self.load_and_warm_up,
                                                                              model, version)
        except Exception as error:  # noqa: BLE001 (any failure ends the version, with its message)
            version.state = END
            version.error = f"{type(error).__name__}: {error}" if not isinstance(error, (ValueError, OSError)) \
                else str(error)
            log.error("keras-transformer serve: error: %s version %d: %s", model.name, version.number,
                      version.error)
            if at_start:
                self.state.failed = version.error
                if self.on_failure is not None:
                    self.on_failure(version.error)
            return
        version.state = AVAILABLE  # new requests go to the highest AVAILABLE version from now on
        for old in model.replaced():
            old.state = UNLOADING
            log.info("%s: version %d serves new requests; version %d finishes its %d request(s)", model.name,
                     version.number, old.number, old.active)
            self.retire(old)

    def retire(self, version: Version) -> None:
        if version.state == UNLOADING and version.active == 0:
            version.state, version.engine = END, None

    async def watch(self, model: ServedModel) -> None:
        first = True
        while True:
            version = model.to_load()
            if version is not None:
                await self.bring_up(model, version, at_start=first)
                if first and self.state.failed:
                    return
                first = False
            if model.base is None and not first:
                return
            await asyncio.sleep(self.settings.poll_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Starlette's lifespan: the batcher and one watcher per model run while the server does."""
        self.state.batcher = Batcher(lambda engine, key, parts: engine.run(key, parts), self.settings,
                                     self.state.stats, self.engine_thread)
        self.state.batcher.on_batch = (lambda engine, sentences, requests, seconds:
                                       self.metrics.observe_batch(sentences, seconds))
        tasks = [asyncio.create_task(self.state.batcher.run())]
        tasks += [asyncio.create_task(self.watch(model)) for model in self.models]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            self.engine_thread.shutdown(wait=False, cancel_futures=True)
            self.loader_thread.shutdown(wait=False, cancel_futures=True)

    def model_named(self, model: str) -> ServedModel:
        if model not in self.state.by_name:
            served = ", ".join(repr(m.name) for m in self.models)
            raise RequestError(404, f"Model {model!r} is not served here; this server serves {served}.")
        return self.state.by_name[model]

    def version_number(self, model: ServedModel, version: str | None) -> int | None:
        if version is None:
            return None
        if not version.isdigit() or len(version) > 18:
            raise RequestError(404, f"Version {version[:40]!r} of {model.name} is not served: versions are "
                                    "numbers.")
        return int(version)

    def serving_version(self, model: ServedModel, number: int | None) -> Version:
        """The version a request of `model` goes to (`number`: the one it names, or None: the current one)."""
        if self.state.failed:
            raise RequestError(503, f"The model failed to load: {self.state.failed}")
        if number is None:
            version = model.current
            if version is None:
                raise RequestError(503, f"{model.name} is loading; /readyz says when it is ready.")
            return version
        listed = model.listed(number)
        if not listed or listed[0].state in (END, UNLOADING):
            serving = model.current
            raise RequestError(404, f"Version {number} of {model.name} is not served"
                                    + (f"; version {serving.number} is." if serving else "."))
        if listed[0].state != AVAILABLE:
            raise RequestError(503, f"Version {number} of {model.name} is loading.")
        return listed[0]

    async def decode(self, request: Any, version: Version, work: Work, deadline: float | None) -> list[Any]:
        assert self.state.batcher is not None  # started by `lifespan` before a version can be AVAILABLE
        pending = self.state.batcher.admit(version.engine, work, deadline)  # or 503 (queue full) / 504 (deadline)
        version.active += 1
        waiter = asyncio.ensure_future(self.state.batcher.wait(pending))
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                self.state.batcher.cancel(pending)
                with contextlib.suppress(Cancelled, RequestError):
                    await waiter
                raise Cancelled()
            try:
                return waiter.result()
            except (ValueError, TypeError, NotImplementedError) as error:  # options the engine refuses (named)
                raise RequestError(400, str(error)) from None
        finally:
            watcher.cancel()
            version.active -= 1
            self.retire(version)

    # ---------------------------------------------------------------- the handlers, one per route
    async def model_status(self, request: Any) -> Any:
        model = self.model_named(request.path_params["model"])
        number = self.version_number(model, request.path_params.get("version"))
        listed = model.listed(number)
        if not listed:
            raise RequestError(404, f"Version {number} of {model.name} is not served; its versions: "
                                    f"{', '.join(str(v.number) for v in model.listed()) or 'none yet'}.")
        return _json({"model_version_status": [version.status() for version in listed]})

    async def metadata(self, request: Any) -> Any:
        model = self.model_named(request.path_params["model"])
        number = self.version_number(model, request.path_params.get("version"))
        version = self.serving_version(model, number) if number is not None else model.current
        payload = signature_metadata(model.name)
        payload["model_spec"]["version"] = str(version.number if version else number or 1)
        return _json(payload)

    async def predict(self, request: Any) -> Any:
        raw = await _body(request, self.settings)  # read first: a client answered before sending its body sees a reset
        head, _, method = request.path_params["target"].rpartition(":")
        name, version = (request.path_params["model"], head) if "model" in request.path_params else (head, None)
        if not name:
            raise RequestError(404, f"Unknown path {request.url.path}; predict is POST /v1/models/NAME:predict.")
        model = self.model_named(name)
        number = self.version_number(model, version)
        if method != "predict":
            raise RequestError(400 if method in ("classify", "regress") else 404,
                               f"{method or 'no method'}: this server answers predict only "
                               "(POST /v1/models/NAME:predict).")
        body = parse_json(raw)
        deadline = _deadline(request, None)
        served = self.serving_version(model, number)
        signature, work, rows = parse_predict(body, served.engine.options, self.settings, self.state.seeded,
                                              served.engine.translator)
        results = await self.decode(request, served, work, deadline)
        return _json(predict_response(signature, work, results, rows))

    async def translate(self, request: Any) -> Any:
        body = parse_json(await _body(request, self.settings))
        deadline = _deadline(request, body)
        if len(self.models) > 1 or "model" in body:
            name = body.pop("model", None)
            if not isinstance(name, str):
                raise RequestError(400, f"This server serves several models: name one in \"model\" "
                                        f"({', '.join(m.name for m in self.models)}).")
            model = self.model_named(name)
        else:
            model = self.models[0]
        served = self.serving_version(model, None)
        work = parse_translate(body, served.engine.options, self.settings, self.state.seeded, served.engine.translator)
        results = await self.decode(request, served, work, deadline)
        payload: dict[str, Any]
        if work.documents is not None:  # put together on the engine's thread: markup's aligner reads the model
            payload = await asyncio.get_running_loop().run_in_executor(self.engine_thread, assemble_documents,
                                                                       work.documents, results)
        elif work.kind == "n_best":
            payload = {"translations": [[hypothesis[0] for hypothesis in row] for row in results],
                       "scores": [[hypothesis[1] for hypothesis in row] for row in results]}
        elif work.kind == "details":  # lines with their quality signals, as `translate_detailed` gives them
            payload = {"translations": [result.text for result in results],
                       "scores": [result.score for result in results],
                       "details": [result.to_dict() for result in results]}
        else:
            payload = {"translations": [result[0] for result in results], "scores": [result[1] for result in results]}
        if work.banned is not None:  # with terms: each translation's constraints it lacks (a too long one)
            payload["unmet"] = [[h[2] for h in row] if work.kind == "n_best" else row[2] for row in results]
        if work.options.sampling:
            payload["seed"] = work.options.seed
        return _json(payload)

    async def healthz(self, request: Any) -> Any:
        return _json({"status": "alive"})

    async def readyz(self, request: Any) -> Any:
        names = ", ".join(m.name for m in self.models)
        if self.state.ready:
            return _json({"status": "ready", "model": names})
        return _json({"status": "failed" if self.state.failed else "loading", "model": names,
                      "error": self.state.failed or ""}, status=503)

    async def stats(self, request: Any) -> Any:
        batcher = self.state.batcher
        versions = {model.name: {str(v.number): v.state for v in model.listed()} for model in self.models}
        return _json({"model": ", ".join(m.name for m in self.models), "ready": self.state.ready,
                      **self.state.stats.as_dict(),
                      "queued": batcher.queued if batcher else 0,
                      "queued_sentences": batcher.queued_sentences if batcher else 0,
                      "in_flight": batcher.in_flight if batcher else 0, "versions": versions,
                      "settings": dataclasses.asdict(self.settings)})

    async def prometheus(self, request: Any) -> Any:
        from starlette.responses import Response

        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    # ---------------------------------------------------------------- exception handlers
    async def refused(self, request: Any, error: RequestError) -> Any:
        return _json({"error": str(error)}, status=error.status, headers=error.headers)

    async def gone(self, request: Any, error: Exception) -> Any:
        return _json({"error": "The client went away."}, status=CLIENT_GONE)

    async def internal(self, request: Any, error: Exception) -> Any:
        log.exception("%s %s failed", request.method, request.url.path, exc_info=error)
        return _json({"error": f"{type(error).__name__}: {error}"}, status=500)

    async def http_error(self, request: Any, error: Any) -> Any:
        message = {404: f"Unknown path {request.url.path}.",
                   405: f"{request.method} is not allowed on {request.url.path}."}.get(error.status_code,
                                                                                       str(error.detail))
        return _json({"error": message}, status=error.status_code)

    async def client_disconnect(self, request: Any, error: Exception) -> Any:
        self.state.stats.cancelled += 1  # gone before its body was read: never queued
        return await self.gone(request, error)

    def routes(self) -> list[Any]:
        """The URLs: TensorFlow Serving's REST API, /translate, the health and readiness probes, the metrics."""
        from starlette.routing import Route

        return [Route("/v1/models/{model}", self.model_status, methods=["GET"]),
                Route("/v1/models/{model}/versions/{version}", self.model_status, methods=["GET"]),
                Route("/v1/models/{model}/metadata", self.metadata, methods=["GET"]),
                Route("/v1/models/{model}/versions/{version}/metadata", self.metadata, methods=["GET"]),
                Route("/v1/models/{target}", self.predict, methods=["POST"]),
                Route("/v1/models/{model}/versions/{target}", self.predict, methods=["POST"]),
                Route("/translate", self.translate, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/stats", self.stats, methods=["GET"]),
                Route("/monitoring/prometheus/metrics", self.prometheus, methods=["GET"])]

    def exception_handlers(self) -> dict[Any, Callable[[Any, Any], Awaitable[Any]]]:
        """Every failure answered in one JSON line: refusals with their status, a client gone, the rest 500."""
        from starlette.exceptions import HTTPException
        from starlette.requests import ClientDisconnect

        return {RequestError: self.refused, HTTPException: self.http_error, Cancelled: self.gone,
                ClientDisconnect: self.client_disconnect, Exception: self.internal}


class _Counted:
    """The application with each answer counted by route and status (`Stats.responses`) and its latency observed
    (`Metrics`): an ASGI middleware, so that refusals and unknown paths are counted too."""

    def __init__(self, app: Any, stats: Stats, metrics: Metrics) -> None:
        self.app, self.stats, self.metrics = app, stats, metrics
        self.state = app.state
        self.router = app.router

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrived = time.monotonic()
        scope.setdefault("state", {})["arrived"] = arrived
        status = [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = route_of(scope.get("path", ""))
            self.stats.responses[route, status[0]] += 1
            self.metrics.observe_request(route, status[0], time.monotonic() - arrived)


def check_installed() -> None:
    """Raises `ConfigError` (naming the extra) when the server's packages (starlette, uvicorn, prometheus_client)
    are missing.

    Example:

    >>> check_installed()  # doctest: +SKIP
    """
    missing = []
    for module in ("starlette", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(f"keras-transformer serve needs {' and '.join(missing)}: "
                          "the serve extra of keras-transformer-mt (pip install '.[serve]' in a clone).")


def serve(load: Callable[[], Any] | Iterable[ServedModel], name: str | None, host: str = "127.0.0.1",
          port: int = 8501, settings: ServeSettings | None = None, seeded: bool = False) -> int:
    """Runs the server until SIGTERM or SIGINT (`keras-transformer serve`); returns the exit status.

    The model loads and warms up after the server listens (`/healthz` answers at once, `/readyz` once
    ready). On SIGTERM the server stops accepting connections, the requests in flight finish, and this
    returns 0; a model that fails to load ends it with 2.

    Args:
        load, name, settings, seeded: see `build_app` (`load` may be a list of `versions.ServedModel`).
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
        def capture_signals(self) -> Iterator[None]:
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

    def failed(message: str) -> None:
        failures.append(message)
        server.should_exit = True

    app = build_app(load, name, settings, seeded, on_failure=failed)
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                                   lifespan="on"))
    names = [m.name for m in app.state.serving.models]
    log.info("serving %s at http://%s:%d/v1/models/%s (loading; /readyz says when it is ready)", ", ".join(names),
             host, port, names[0])
    server.run()
    if failures:
        return 2
    return 0 if server.started else 1
