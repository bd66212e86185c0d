"""The HTTP application of `keras-transformer serve` (starlette, imported when it is built) and the server that
runs it (uvicorn) until SIGTERM."""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import signal
import threading
import time

from keras_transformer.errors import ConfigError
from keras_transformer.serving.batching import Batcher, Engine, Stats
from keras_transformer.serving.requests import (RequestError, ServeSettings, parse_json, parse_predict,
                                                parse_translate, predict_response)
from keras_transformer.serving.signatures import VERSION, signature_metadata

log = logging.getLogger("keras_transformer.serving")

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
        load: a function of no argument returning the translator (`keras_transformer.load_translator` bound to its
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
        signature, work, rows = parse_predict(body, state.engine.options, settings, state.seeded,
                                              state.engine.translator)
        results = await decode(work)
        return _json(predict_response(signature, work, results, rows))

    async def translate(request):
        body = parse_json(await _body(request, settings))
        check_ready()
        work = parse_translate(body, state.engine.options, settings, state.seeded, state.engine.translator)
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
