"""What a fresh process pays before its first translation with the shipped model, by engine, and what warm-up buys.

    .venv/bin/python bench/first_request.py [--model saved_models/multi30k_en_de] [--rounds 3]

The bench first exports copies of the model with this tree's code (so that an older export measures as this code
writes it) into a temporary folder: a SavedModel (XLA, with `assets.extra/tf_serving_warmup_requests`) and a
CTranslate2 folder. Then each round starts one fresh process per path, in turn (so machine noise falls on all alike),
each timing import, load, a first request of two sentences and the same request again (warmed):

- `cli`: `keras-transformer translate --model <shipped> "A man rides a bike." "Two dogs play in the snow."`,
  timed from outside as a whole (`end to end`);
- `keras`: the same steps inside one process: `keras_transformer.load_translator` (the Keras model of
  `assets.extra/`, what the command line decodes with), `translate_lines`;
- `savedmodel`: a TensorFlow-only process (tensorflow, tensorflow-text): `tf.saved_model.load` and
  `serving_default`, no warm-up;
- `savedmodel+warmup`: the same, replaying the export's warm-up records first (read with TensorFlow Serving's
  own protocol buffers, as the server does at load; `warmup` is that replay's time), then, after the two
  requests, one request of new sentences per bucket shape (rows 1, 2, 4, 8 by source width 16, 32, 64, 128;
  through `serving_default` and `n_best`): `any bucket (max)` is the slowest of those, which the issue wants
  under 0.5 s;
- `ctranslate2`: `CTranslate2Translator` in a process without TensorFlow, and `cli ct2`, the command line on
  the CTranslate2 folder, end to end.

The table gives each path's median per phase over the rounds. Run it on a quiet machine: the phases are
seconds of one or two cores.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SENTENCES = ["A man rides a bike.", "Two dogs play in the snow."]

# The two requests every in-process path times, the same sentences twice (`translator`, `times` defined before).
TWO_REQUESTS = r"""
for phase in ("first request", "warmed request"):
    start = time.perf_counter()
    out = translator.translate_lines(json.loads(sys.argv[2]))
    times[phase] = time.perf_counter() - start
"""

KERAS = r"""
import json, sys, time
start = time.perf_counter()
import tensorflow as tf
from keras_transformer import load_translator
times = {"import": time.perf_counter() - start}
start = time.perf_counter()
translator = load_translator(sys.argv[1])
times["load"] = time.perf_counter() - start
""" + TWO_REQUESTS + r"""
print(json.dumps({"times": times, "out": out}))
"""

SAVEDMODEL = r"""
import json, sys, time
start = time.perf_counter()
import tensorflow as tf
import tensorflow_text  # noqa: F401
times = {"import": time.perf_counter() - start}
directory, sentences, warm, buckets = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1", json.loads(sys.argv[4])
start = time.perf_counter()
loaded = tf.saved_model.load(directory)
times["load"] = time.perf_counter() - start
if warm:  # what TensorFlow Serving does at load: replay assets.extra/tf_serving_warmup_requests
    from tensorflow_serving.apis import prediction_log_pb2
    start = time.perf_counter()
    for record in tf.data.TFRecordDataset(directory + "/assets.extra/tf_serving_warmup_requests"):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        inputs = {name: tf.constant(tf.make_ndarray(tensor)) for name, tensor in request.inputs.items()}
        loaded.signatures[request.model_spec.signature_name or "serving_default"](**inputs)
    times["warmup"] = time.perf_counter() - start
serve = loaded.signatures["serving_default"]
for phase in ("first request", "warmed request"):
    start = time.perf_counter()
    out = serve(tf.constant(sentences))["translation"].numpy()
    times[phase] = time.perf_counter() - start
if warm:
    slowest = 0.0
    for signature in ("serving_default", "n_best"):
        for batch in buckets:
            start = time.perf_counter()
            loaded.signatures[signature](tf.constant(batch))
            slowest = max(slowest, time.perf_counter() - start)
    times["any bucket (max)"] = slowest
print(json.dumps({"times": times, "out": [t.decode() for t in out]}))
"""

CTRANSLATE2 = r"""
import json, sys, time
start = time.perf_counter()
from keras_transformer.engines.ctranslate2 import CTranslate2Translator
times = {"import": time.perf_counter() - start}
start = time.perf_counter()
translator = CTranslate2Translator(sys.argv[1])
times["load"] = time.perf_counter() - start
""" + TWO_REQUESTS + r"""
assert "tensorflow" not in sys.modules
print(json.dumps({"times": times, "out": out}))
"""

PHASES = ("import", "load", "warmup", "first request", "warmed request", "any bucket (max)", "end to end")


def bucket_requests(words_per_width, rows=(1, 2, 4, 8)):
    """One batch per (rows, width) bucket, of sentences the warm-up never sent (other words, other lengths)."""
    vocabulary = "A woman with a red hat walks her small dog along the beach at sunset".split()
    batches = []
    for count in rows:
        for words in words_per_width:
            batches.append([" ".join(vocabulary[(i + j) % len(vocabulary)] for j in range(words)) + "."
                            for i in range(count)])
    return batches


def prepare(model, folder):
    """Exports `model` again with this tree's code: a SavedModel (with warm-up records) and a CTranslate2 folder."""
    from keras_transformer import load_translator
    from keras_transformer.config import TransformerConfig
    from keras_transformer.exports.ctranslate2 import CTranslate2Exporter
    from keras_transformer.exports.savedmodel import export_translator

    translator = load_translator(model, jit_compile=True)
    config = TransformerConfig.from_yaml(pathlib.Path(model) / "assets.extra" / "model.yaml")
    savedmodel = export_translator(translator, folder / "savedmodel", config)
    ct2 = CTranslate2Exporter().export(model, folder / "ct2")
    return savedmodel, ct2


def worker(script, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def command_line(model):
    """`keras-transformer translate` timed from outside: `(seconds, translations)`."""
    start = time.perf_counter()
    done = subprocess.run([str(pathlib.Path(sys.executable).parent / "keras-transformer"), "translate", "--model",
                           str(model), *SENTENCES], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"keras-transformer translate failed:\n{done.stderr[-3000:]}")
    return {"times": {"end to end": seconds}, "out": done.stdout.splitlines()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "saved_models" / "multi30k_en_de"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", help="export the copies here (and reuse them if there) instead of a temporary "
                                       "folder")
    args = parser.parse_args()
    folder = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="first_request_"))
    if (folder / "savedmodel" / "saved_model.pb").is_file() and (folder / "ct2").is_dir():
        savedmodel, ct2 = folder / "savedmodel", folder / "ct2"
    else:
        start = time.perf_counter()
        savedmodel, ct2 = prepare(args.model, folder)
        print(f"exported {savedmodel} and {ct2} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    # Source widths (encoded lengths) in the buckets 16, 32, 64, 128 of the shipped model: 10, 25, 50, 100 words.
    buckets = json.dumps(bucket_requests((10, 25, 50, 100)))
    sentences = json.dumps(SENTENCES)
    paths = {
        "cli": lambda: command_line(args.model),
        "keras": lambda: worker(KERAS, args.model, sentences),
        "savedmodel": lambda: worker(SAVEDMODEL, savedmodel, sentences, 0, buckets),
        "savedmodel+warmup": lambda: worker(SAVEDMODEL, savedmodel, sentences, 1, buckets),
        "ctranslate2": lambda: worker(CTRANSLATE2, ct2, sentences),
        "cli ct2": lambda: command_line(ct2),
    }
    results = {name: [] for name in paths}
    for round_index in range(args.rounds):
        for name, run in paths.items():
            result = run()
            results[name].append(result["times"])
            print(f"round {round_index + 1} {name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in result["times"].items())
                  + f"  {result['out']}", file=sys.stderr)

    print("| path (median s) | " + " | ".join(PHASES) + " |")
    print("| --- |" + " ---: |" * len(PHASES))
    for name, rounds in results.items():
        cells = [f"{statistics.median(r[phase] for r in rounds):.2f}" if phase in rounds[0] else ""
                 for phase in PHASES]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
