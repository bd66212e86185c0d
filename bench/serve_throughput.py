"""`keras-transformer serve`: 16 concurrent single-sentence clients against one client sending one at a time.

    PYTHONPATH=. .venv/bin/python bench/serve_throughput.py [saved_models/multi30k_en_de] [--sentences 192]

Starts the server on the model (a real `keras-transformer serve` process, default options: batches of at most 64
sentences, a 5 ms wait), waits until it is ready (loaded and warmed up), then, `--rounds` times in turn:
`sequential` sends the sentences one request after the other from one client; `concurrent` has `--clients`
clients, each sending one sentence per request and the next when answered, sharing the same sentences.
Both use TensorFlow Serving's predict (`serving_default`). Prints, per mode, the median over rounds of the
sentences per second, the per-request latency (p50, p95) and the mean batch the server formed (its /stats),
and whether every translation was the same in both modes.
"""

import argparse
import gzip
import json
import os
import pathlib
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def call(url, path, body=None):
    data = json.dumps(body).encode("utf-8") if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def start_server(model, port, log):
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "--model", model, "--name", "model",
               "--port", str(port)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the server ended with status {process.returncode}; its log: {log.name}")
        try:
            call(url, "/readyz")
            return process, url, time.perf_counter() - started
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)


def run(url, sentences, clients):
    """Sends each sentence as one request from `clients` clients; returns (seconds, latencies, translations)."""
    work = queue.Queue()
    for index, sentence in enumerate(sentences):
        work.put((index, sentence))
    latencies, translations = [], [None] * len(sentences)

    def client():
        while True:
            try:
                index, sentence = work.get_nowait()
            except queue.Empty:
                return
            sent = time.perf_counter()
            answer = call(url, "/v1/models/model:predict", {"instances": [sentence]})
            latencies.append(time.perf_counter() - sent)
            translations[index] = answer["predictions"][0]["translation"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, latencies, translations


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="saved_models/multi30k_en_de")
    parser.add_argument("--sentences", type=int, default=192, help="test2016 sentences sent per round and mode")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    args = parser.parse_args()

    with gzip.open(args.source, "rt", encoding="utf-8") as handle:
        sentences = [line.rstrip("\n") for line in handle][: args.sentences]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.NamedTemporaryFile("wb", suffix=".log", delete=False) as log:
        process, url, ready_s = start_server(args.model, port, log)
    try:
        figures = {"sequential": [], "concurrent": []}
        outputs = {}
        for _ in range(args.rounds):
            for mode, clients in (("sequential", 1), ("concurrent", args.clients)):
                before = call(url, "/stats")
                seconds, latencies, translations = run(url, sentences, clients)
                after = call(url, "/stats")
                batches = after["batches"] - before["batches"]
                figures[mode].append((len(sentences) / seconds, percentile(latencies, 50), percentile(latencies, 95),
                                      (after["sentences"] - before["sentences"]) / max(batches, 1)))
                outputs.setdefault(mode, translations)
    finally:
        process.terminate()
        status = process.wait(timeout=120)
        os.unlink(log.name)

    def median(mode, column):
        return statistics.median(row[column] for row in figures[mode])

    print(f"model {args.model}; {len(sentences)} test2016 sentences per mode and round, {args.rounds} round(s); "
          f"ready after {ready_s:.1f} s; exit status after SIGTERM: {status}")
    print("| mode | clients | sentences/s | latency p50 (ms) | latency p95 (ms) | mean batch (sentences) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, clients in (("sequential", 1), ("concurrent", args.clients)):
        print(f"| {mode} | {clients} | {median(mode, 0):.1f} | {1000 * median(mode, 1):.0f} | "
              f"{1000 * median(mode, 2):.0f} | {median(mode, 3):.1f} |")
    ratios = [c[0] / s[0] for s, c in zip(figures["sequential"], figures["concurrent"])]
    same = sum(a == b for a, b in zip(outputs["sequential"], outputs["concurrent"]))
    print(f"throughput, concurrent / sequential (per round): {', '.join(f'{r:.2f}x' for r in ratios)}; "
          f"same translations in both modes: {same} of {len(sentences)}")


if __name__ == "__main__":
    main()
