"""`keras-transformer serve` under load: N concurrent clients for a fixed time, on loopback.

    PYTHONPATH=. .venv/bin/python bench/serve_load.py [saved_models/multi30k_en_de] [--clients 1 16 64 256]
        [--seconds 20] [--sentences-per-request 4] [--max-batch 16] [--max-queue 64] [--swap]

Starts a real `keras-transformer serve` process on the model (served from a base folder of numbered versions
in a temporary folder, version 1 a link to the model), waits until it is ready, then for each client count runs
that many clients for `--seconds`: each sends TensorFlow Serving predict requests of `--sentences-per-request`
test2016 sentences, the next as soon as the last is answered; a client answered 503 waits `--backoff-ms` (or
the server's Retry-After, whichever is shorter) and sends again. Requests still running at the end are awaited.
Prints a table (sentences/s answered, latency percentiles of the 200s, the 503 share and their latency as this
client saw it and by the server's own histogram (the bucket holding its 99th percentile), other failures, the
server's peak RSS against its RSS when idle) and, with `--swap`, a run at 16 clients during
which version 2 is copied beside version 1: the requests that failed, and when the server switched.

The client is asyncio over raw sockets (one thread for every client), so that it costs the machine little next
to the server. The load generator's functions (`load`, `summarize`, `RssSampler`, `request`) are what
tests/test_serve_load.py drives its server with.
"""

import argparse
import asyncio
import gzip
import json
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


# ------------------------------------------------------------------------------------------ the client
async def request(port, method, path, body=None, headers=None, timeout=120.0):
    """One HTTP/1.1 request to 127.0.0.1:`port` on a connection of its own: `(status, headers, body bytes)`."""
    data = json.dumps(body).encode("utf-8") if isinstance(body, (dict, list)) else (body or b"")
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
            "Content-Type: application/json", f"Content-Length: {len(data)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]

    async def exchange():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
            await writer.drain()
            answer = await reader.read()
        finally:
            writer.close()
        header, _, content = answer.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        return int(lines[0].split()[1]), {k.lower(): v for k, v in fields.items()}, content

    return await asyncio.wait_for(exchange(), timeout)


async def load(port, clients, seconds, bodies, path, backoff=0.1, headers=None, think=0.0):
    """`clients` clients sending `bodies` (cycled) to `path` for `seconds`, each pausing `think` seconds between
    an answer and its next request; returns one record per request: `(status, seconds, sentences, sent_at)`
    (status 0: no answer, the connection failed or timed out)."""
    records, stop = [], time.monotonic() + seconds
    counter = iter(range(10**12))

    async def client():
        while time.monotonic() < stop:
            body = bodies[next(counter) % len(bodies)]
            sent = time.monotonic()
            try:
                status, fields, _ = await request(port, "POST", path, body, headers)
            except (OSError, asyncio.TimeoutError, ValueError, IndexError):
                status, fields = 0, {}
            records.append((status, time.monotonic() - sent, _sentences(body), sent))
            if status == 503:
                retry = float(fields.get("retry-after", backoff))
                await asyncio.sleep(min(retry, backoff) * random.uniform(0.5, 1.5))
            elif think:
                await asyncio.sleep(think * random.uniform(0.5, 1.5))

    await asyncio.gather(*(client() for _ in range(clients)))
    return records


def _sentences(body):
    values = body.get("instances", body.get("sentences", [])) if isinstance(body, dict) else []
    return len(values)


def percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def summarize(records, seconds):
    """Throughput and latencies of `load`'s records over a run of `seconds`."""
    ok = [r for r in records if r[0] == 200]
    busy = [r for r in records if r[0] == 503]
    return {"requests": len(records), "ok": len(ok), "rejected": len(busy),
            "failed": len(records) - len(ok) - len(busy),
            "statuses": sorted({r[0] for r in records}),
            "sentences_per_s": sum(r[2] for r in ok) / seconds,
            "p50": percentile([r[1] for r in ok], 50), "p90": percentile([r[1] for r in ok], 90),
            "p99": percentile([r[1] for r in ok], 99), "max": max((r[1] for r in ok), default=float("nan")),
            "rejected_share": len(busy) / max(len(records), 1),
            "rejected_p99": percentile([r[1] for r in busy], 99),
            "rejected_p50": percentile([r[1] for r in busy], 50),
            "rejected_max": max((r[1] for r in busy), default=float("nan"))}


def rss_bytes(pid):
    """The resident memory of process `pid` (Linux's /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """The peak RSS of process `pid`, sampled every `interval` seconds on a thread while in the `with` block."""

    def __init__(self, pid, interval=0.2):
        self.pid, self.interval, self.peak = pid, interval, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._done.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except OSError:
                return
            self._done.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def refusal_buckets(port):
    """The server's own latency histogram of its 503 answers to predict: `{upper bound: cumulative count}`."""
    _, _, content = asyncio.run(request(port, "GET", "/monitoring/prometheus/metrics"))
    buckets = {}
    for line in content.decode("utf-8").splitlines():
        if line.startswith("keras_transformer_serve_request_seconds_bucket{") and 'route="predict"' in line \
                and 'status="503"' in line:
            bound = line.split('le="')[1].split('"')[0]
            buckets[float(bound)] = float(line.rsplit(" ", 1)[1])
    return buckets


def server_p99(before, after):
    """The upper bound of the histogram bucket holding the 99th percentile of the answers between two reads."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    return next((bound for bound, count in counts.items() if total and count >= 0.99 * total), float("nan"))


# ------------------------------------------------------------------------------------------ the bench
def _call(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as answer:
        return json.loads(answer.read())


def _start(base, port, log, args):
    command = [sys.executable, "-m", "keras_transformer.cli", "serve", "--model", str(base), "--name", "model",
               "--port", str(port), "--max-batch", str(args.max_batch), "--max-queue", str(args.max_queue),
               "--max-sentences", str(min(args.max_queue, 256))]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    started = time.monotonic()
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the server ended with status {process.returncode}; its log: {log.name}")
        try:
            _call(port, "/readyz")
            return process, time.monotonic() - started
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)


def _swap_run(port, base, model, bodies, limit=300.0):
    """16 clients, from before version 2 is copied beside version 1 until version 1 has ended (at most `limit`
    seconds); returns the records, the version states seen in order, and the seconds from the copy to the switch
    and to the end of version 1."""
    seen, times = [], {}

    async def watch(started):
        while True:
            _, _, content = await request(port, "GET", "/v1/models/model")
            states = tuple((v["version"], v["state"]) for v in json.loads(content)["model_version_status"])
            if not seen or seen[-1] != states:
                seen.append(states)
            if ("2", "AVAILABLE") in states:
                times.setdefault("switch", time.monotonic() - started)
            if states == (("2", "AVAILABLE"), ("1", "END")):
                times["end"] = time.monotonic() - started
                return
            await asyncio.sleep(0.1)

    async def run():
        records = await load(port, 16, 2, bodies, "/v1/models/model:predict")  # before the copy
        started = time.monotonic()
        watcher = asyncio.ensure_future(watch(started))
        copy = asyncio.get_running_loop().run_in_executor(None, shutil.copytree, model, base / "2")
        while not watcher.done() and time.monotonic() - started < limit:
            records += await load(port, 16, 2, bodies, "/v1/models/model:predict")
        await copy
        watcher.cancel()
        return records

    records = asyncio.run(run())
    return records, seen, times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="saved_models/multi30k_en_de")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=20.0, help="each run's length")
    parser.add_argument("--sentences-per-request", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--backoff-ms", type=float, default=100.0)
    parser.add_argument("--swap", action="store_true", help="also a run that swaps the model's version under load")
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    args = parser.parse_args(argv)

    with gzip.open(args.source, "rt", encoding="utf-8") as handle:
        sentences = [line.rstrip("\n") for line in handle]
    size = args.sentences_per_request
    bodies = [{"instances": sentences[i:i + size]} for i in range(0, len(sentences) - size, size)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = pathlib.Path(args.model).resolve()
    with tempfile.TemporaryDirectory() as folder, tempfile.NamedTemporaryFile("wb", suffix=".log") as log:
        base = pathlib.Path(folder) / "model"
        base.mkdir()
        (base / "1").symlink_to(model)
        process, ready_s = _start(base, port, log, args)
        try:
            asyncio.run(load(port, 4, 3, bodies, "/v1/models/model:predict"))  # the request shapes' first calls
            time.sleep(1)
            idle = rss_bytes(process.pid)
            rows = []
            for clients in args.clients:
                refusals = refusal_buckets(port)
                with RssSampler(process.pid) as rss:
                    started = time.monotonic()
                    records = asyncio.run(load(port, clients, args.seconds, bodies, "/v1/models/model:predict",
                                               backoff=args.backoff_ms / 1000))
                    elapsed = time.monotonic() - started
                figures = summarize(records, elapsed)
                figures["server_rejected_p99"] = server_p99(refusals, refusal_buckets(port))
                rows.append((clients, figures, rss.peak))
            swap = _swap_run(port, base, model, bodies) if args.swap else None
        finally:
            process.terminate()
            status = process.wait(timeout=120)
    print(f"model {args.model}; requests of {size} test2016 sentences, TensorFlow Serving predict; "
          f"--max-batch {args.max_batch} --max-queue {args.max_queue}; {args.seconds:g} s per run; ready after "
          f"{ready_s:.1f} s; idle RSS {idle / 2**20:.0f} MiB; exit status after SIGTERM: {status}")
    print("| clients | sentences/s | p50 (s) | p90 (s) | p99 (s) | 503 share | 503 p50 / p99, client (ms) "
          "| 503 p99, server (ms) | other failures | peak RSS (MiB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for clients, figures, peak in rows:
        print(f"| {clients} | {figures['sentences_per_s']:.1f} | {figures['p50']:.2f} | {figures['p90']:.2f} | "
              f"{figures['p99']:.2f} | {100 * figures['rejected_share']:.0f}% | "
              f"{1000 * figures['rejected_p50']:.0f} / {1000 * figures['rejected_p99']:.0f} | "
              f"<= {1000 * figures['server_rejected_p99']:.0f} | {figures['failed']} | {peak / 2**20:.0f} |")
    if swap is not None:
        records, seen, times = swap
        statuses = sorted({r[0] for r in records})
        failed = sum(r[0] != 200 for r in records)
        print(f"version swap under 16 clients: {len(records)} requests, statuses {statuses}, {failed} not answered "
              f"200; version 2 served {times.get('switch', float('nan')):.1f} s after the copy began, version 1 "
              f"ended at {times.get('end', float('nan')):.1f} s")
        print("states seen, in order: " + " -> ".join("/".join(f"{v} {s}" for v, s in states) for states in seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
