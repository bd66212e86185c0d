"""Latency and throughput of an exported SavedModel on Multi30k test sentences.

    .venv/bin/python bench/serving_latency.py saved_models/multi30k_en_de [--runs 100]

Loads the SavedModel the way a server does (TensorFlow and tensorflow-text only), then measures
single-sentence latency (p50/p95 over `--runs` sentences) and batch-64 throughput (sentences/s and
output tokens/s are not available from strings, so words/s of the output are reported).
"""

import argparse
import gzip
import pathlib
import statistics
import time

import tensorflow as tf
import tensorflow_text  # noqa: F401

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def percentile(values, q):
    values = sorted(values)
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=100, help="single-sentence calls to time")
    parser.add_argument("--batches", type=int, default=6, help="batch-64 calls to time")
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    args = parser.parse_args()

    with gzip.open(args.source, "rt", encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f]
    start = time.perf_counter()
    serve = tf.saved_model.load(args.model).signatures["serving_default"]
    load_s = time.perf_counter() - start
    serve(tf.constant(sentences[:1]))  # trace/warm-up
    serve(tf.constant(sentences[:64]))

    latencies = []
    for sentence in sentences[: args.runs]:
        start = time.perf_counter()
        serve(tf.constant([sentence]))
        latencies.append(time.perf_counter() - start)

    batch_times, words = [], 0
    for i in range(args.batches):
        batch = sentences[64 * (i + 1): 64 * (i + 2)]
        start = time.perf_counter()
        out = serve(tf.constant(batch))
        batch_times.append(time.perf_counter() - start)
        words += sum(len(t.split()) for t in out["translation"].numpy())
    total = sum(batch_times)
    rows = [
        ("load (s)", f"{load_s:.2f}"),
        ("single sentence p50 (ms)", f"{1000 * statistics.median(latencies):.0f}"),
        ("single sentence p95 (ms)", f"{1000 * percentile(latencies, 95):.0f}"),
        ("batch 64: median time (s)", f"{statistics.median(batch_times):.2f}"),
        ("batch 64: sentences/s", f"{64 * args.batches / total:.1f}"),
        ("batch 64: output words/s", f"{words / total:.0f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{'measure'.ljust(width)}  value")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
