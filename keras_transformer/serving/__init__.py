"""`keras-transformer serve`: any model folder behind HTTP, speaking TensorFlow Serving's REST API.

A process serves one model (a training workdir, a SavedModel or CTranslate2
export, or an ensemble: whatever `keras_transformer.load_translator` loads; the command
line hands `serve` the loading function), a base folder of numbered versions of one, or several
(`versions.ServedModel`). Endpoints (docs/serving.md):

```
GET  /v1/models/NAME[/versions/N]       TensorFlow Serving's model status (LOADING, AVAILABLE, UNLOADING, END)
GET  /v1/models/NAME/metadata           the signatures, as TensorFlow Serving describes them
POST /v1/models/NAME[/versions/N]:predict  {"instances": [...]} (rows) or {"inputs": ...} (columns), "signature_name"
POST /translate                         {"sentences": [...], "beam_size": 5, "strategy": "sample", ...}
GET  /healthz, /readyz, /stats          liveness; readiness (after load and warm-up); counts
GET  /monitoring/prometheus/metrics     the same counts, latency and batch histograms, for Prometheus
```

Concurrent requests are decoded together: a request waits at most
`batch_wait` seconds for others asking for the same decoding (the same
`DecodeOptions`), up to `max_batch` sentences, and a batch is formed while the
previous one decodes, so many small clients get the throughput of batches. One
thread runs the engine, one batch at a time; a larger request goes in chunks of
`max_batch` sentences, taking turns with the others. The queue is bounded
(`max_queue` sentences: past it, 503 at once), a request whose client has gone is
not decoded, a request past its deadline gets 504, and every decoding option a
client gives is bounded (`ServeSettings`). SIGTERM (or Ctrl-C) stops
accepting connections, lets the requests in flight finish, and exits 0.

The modules: `signatures` (what a TensorFlow Serving client sees), `requests` (request bodies read and checked,
limits, answers laid out), `batching` (the engine's thread, the bounded queue and the batches it decodes),
`versions` (models and their numbered versions), `metrics` (Prometheus), `app` (the HTTP application and the
server). Import the names from this package.

This package imports the standard library and the decoding options; the server
itself (starlette, uvicorn, prometheus_client: the `serve` extra) is imported when it starts, and
TensorFlow only by the engine the loading function returns.
"""

from keras_transformer.serving.app import build_app, check_installed, serve
from keras_transformer.serving.batching import WARM_UP_SENTENCES, Batcher, Engine, Stats
from keras_transformer.serving.requests import (
                                                TRANSLATE_FIELDS,
                                                RequestError,
                                                ServeSettings,
                                                Work,
                                                check_limits,
                                                check_sentences,
                                                parse_json,
                                                parse_predict,
                                                parse_translate,
                                                predict_response,
)
from keras_transformer.serving.signatures import SIGNATURES, VERSION, batched_inputs, signature_metadata
from keras_transformer.serving.versions import ServedModel

__all__ = ["SIGNATURES", "TRANSLATE_FIELDS", "VERSION", "WARM_UP_SENTENCES", "Batcher", "Engine", "RequestError",
           "ServeSettings", "ServedModel", "Stats", "Work", "batched_inputs", "build_app", "check_installed",
           "check_limits", "check_sentences", "parse_json", "parse_predict", "parse_translate", "predict_response",
           "serve", "signature_metadata"]
