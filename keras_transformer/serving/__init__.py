"""`keras-transformer serve`: any model folder behind HTTP, speaking TensorFlow Serving's REST API.

One process serves one model (a training workdir, a SavedModel or CTranslate2
export, or an ensemble: whatever `keras_transformer.load_translator` loads; the command
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

The modules: `signatures` (what a TensorFlow Serving client sees), `requests` (request bodies read and checked,
answers laid out), `batching` (the engine's thread and the batches it decodes), `app` (the HTTP application and
the server). Import the names from this package.

This package imports the standard library and the decoding options; the server
itself (starlette, uvicorn: the `serve` extra) is imported when it starts, and
TensorFlow only by the engine the loading function returns.
"""

from keras_transformer.serving.app import build_app, check_installed, serve
from keras_transformer.serving.batching import WARM_UP_SENTENCES, Batcher, Engine, Stats
from keras_transformer.serving.requests import (TRANSLATE_FIELDS, RequestError, ServeSettings, Work, check_sentences,
                                                parse_json, parse_predict, parse_translate, predict_response)
from keras_transformer.serving.signatures import SIGNATURES, VERSION, batched_inputs, signature_metadata

__all__ = ["SIGNATURES", "TRANSLATE_FIELDS", "VERSION", "WARM_UP_SENTENCES", "Batcher", "Engine", "RequestError",
           "ServeSettings", "Stats", "Work", "batched_inputs", "build_app", "check_installed", "check_sentences",
           "parse_json", "parse_predict", "parse_translate", "predict_response", "serve", "signature_metadata"]
