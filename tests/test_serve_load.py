"""`keras-transformer serve` under load and abuse: one real server process on the shipped export, served from a
base folder of numbered versions (version 1 a link to it), with a queue of 4 batches (conftest's `served`, which
tests/test_serve.py uses first).

Request limits answer 400 naming the flag; a few hundred fuzzed bodies get no 500; 64 concurrent clients meet
back-pressure (200 or 503, the 503s at once, bounded latency and memory); abandoned requests are not decoded;
deadlines are answered 504 without decoding; a large request is decoded in chunks that a small one slips between;
Prometheus' metrics agree with /stats; version 2 copied beside version 1 under 16 clients is switched to without
a failed request; SIGTERM lets the requests in flight finish and ends it with status 0. The tests run in this
order, the version swap and SIGTERM last.
"""

import asyncio
import json
import random
import shutil
import signal
import sys
import threading
import time

import pytest
from conftest import REPO_ROOT, SERVE_LIMITS, SERVE_NAME

from keras_transformer.evaluation import read_lines

pytestmark = [pytest.mark.xdist_group("test_serve"), pytest.mark.slow]  # the group shares the server

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
sys.path.insert(0, str(REPO_ROOT / "bench"))
import serve_load  # noqa: E402  (the load generator of bench/serve_load.py)

NAME = SERVE_NAME
MAX_BATCH, MAX_QUEUE, MAX_SENTENCES = (SERVE_LIMITS[name] for name in ("max_batch", "max_queue", "max_sentences"))
SHIPPED = REPO_ROOT / "saved_models" / "multi30k_en_de"


@pytest.fixture(scope="module")
def server(served):
    return served  # conftest's server, shared with tests/test_serve.py (which runs first)


@pytest.fixture(scope="module")
def base(serve_base):
    return serve_base


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    return read_lines(multi30k_dir / "test_2016_flickr.en.gz")


def _run(coroutine):
    return asyncio.run(coroutine)


def _metrics(server):
    from prometheus_client.parser import text_string_to_metric_families

    status, _, content = _run(serve_load.request(server.port, "GET", "/monitoring/prometheus/metrics"))
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(content.decode("utf-8"))}


def test_request_limits_answer_400_naming_the_flag_and_the_memory_is_logged(server):
    """Slow: needs the running server process (shared with this file's load tests) and its logged memory."""
    cases = [({"beam_size": 17}, "--max-beam-size 16"), ({"beam_size": 100_000}, "--max-beam-size"),
             ({"beam_size": 16, "n_best": 17}, "beam_size"), ({"strategy": "sample", "n_best": 17}, "--max-n-best"),
             ({"max_extra": 257}, "--max-extra-limit 256"), ({"top_k": 1001}, "--max-top-k 1000"),
             ({"temperature": 0.01}, "--min-temperature"), ({"alpha": 11}, "--max-alpha")]
    for options, named in cases:
        status, answer = server.request("/translate", {"sentences": ["A dog."], **options})
        assert status == 400 and named in answer["error"], (options, status, answer)
    status, answer = server.predict({"signature_name": "sample", "inputs": {"inputs": ["A dog."], "top_k": 5000}})
    assert status == 400 and "--max-top-k" in answer["error"]
    # The search state of the largest request allowed, from the model's own sizes: 16 sentences of 16 beams,
    # 128 positions, d_model 128, 4 decoder layers, 8,000 words (footprint.search_memory's doctest: 279 MiB).
    assert "holds about 279.4 MiB of search state" in server.output()


def test_64_clients_meet_back_pressure_with_bounded_latency_and_memory(server, sentences):
    """Slow: 64 concurrent clients against a running server; back-pressure only shows under real load."""
    size = 4  # sentences per request: 64 clients want 256 at once, the queue holds 64
    bodies = [{"instances": sentences[i:i + size]} for i in range(0, 400, size)]
    _run(serve_load.load(server.port, 4, 2, bodies, f"/v1/models/{NAME}:predict"))  # the shapes' first calls
    idle = serve_load.rss_bytes(server.process.pid)
    health = []

    async def probe(stop):  # /healthz while the queue is full
        while time.monotonic() < stop:
            sent = time.monotonic()
            health.append(((await serve_load.request(server.port, "GET", "/healthz"))[0], time.monotonic() - sent))
            await asyncio.sleep(0.5)

    async def run():
        stop = time.monotonic() + 20
        records, _ = await asyncio.gather(serve_load.load(server.port, 64, 20, bodies, f"/v1/models/{NAME}:predict",
                                                          backoff=0.25), probe(stop))
        return records

    with serve_load.RssSampler(server.process.pid) as rss:
        records = _run(run())
    figures = serve_load.summarize(records, 20)
    stats = server.request("/stats")[1]
    assert set(figures["statuses"]) == {200, 503}, figures  # every answer 200 or 503, and the queue did fill
    assert figures["ok"] >= 10, figures
    # The server answers a 503 without waiting: by its own clock 99% of them within 100 ms (the metric's 0.1 s
    # bucket) and all within 1 s (on a 2-core machine shared with other work, the process is sometimes not
    # scheduled for a tenth of a second: 1 of 2,639 took longer once, when the load average was 9). Seen from this
    # client, the median stays far below the seconds an admitted request waits (1 s: 5-10x what it measures).
    refused = _metrics(server)["keras_transformer_serve_request_seconds"]
    buckets = {(s.labels["le"]): s.value for s in refused.samples
               if s.name.endswith("_bucket") and s.labels["route"] == "predict" and s.labels["status"] == "503"}
    assert buckets["+Inf"] == stats["responses"]["predict"]["503"], buckets
    assert buckets["0.1"] >= 0.99 * buckets["+Inf"] and buckets["1.0"] == buckets["+Inf"], buckets
    assert serve_load.percentile([r[1] for r in records if r[0] == 503], 50) < 1.0, figures
    # An admitted request finds at most MAX_QUEUE sentences ahead of it (4 batches), then the batch decoding,
    # then its own: 6 batches at most of the longest batch seen, plus 2 s for the HTTP path on a busy machine.
    bound = (MAX_QUEUE / MAX_BATCH + 2) * stats["longest_batch_seconds"] + 2
    assert figures["p99"] < bound, (figures, stats["longest_batch_seconds"])
    assert rss.peak <= 1.5 * idle, (rss.peak, idle)
    # /healthz under the same load: answered within 1 s by the server's clock, and seen from here within 2 s.
    alive = {s.labels["le"]: s.value for s in refused.samples
             if s.name.endswith("_bucket") and s.labels["route"] == "healthz"}
    assert alive["1.0"] == alive["+Inf"] >= len(health), alive
    assert all(status == 200 for status, _ in health) and max(seconds for _, seconds in health) < 2.0, health
    started = time.monotonic()  # the load has ended and its requests are answered: a new one goes at once
    status, answer = server.request("/translate", {"sentences": ["A man rides a bike."]})
    assert status == 200 and time.monotonic() - started < 5, answer


def test_no_fuzzed_body_gets_a_500_and_the_server_lives_on(server, sentences):
    """Generated bodies: broken and deeply nested JSON, wrong types in every field, huge and non-finite numbers,
    bad base64, lone surrogates, unknown fields and signatures. Every body carries a deadline of 1 ms (or a bad
    one), so valid ones are answered 504 without being decoded: what is fuzzed is reading them."""
    rng = random.Random(62)
    values = [None, True, -1, 0, 1, 3, 17, 2**31, 10**30, 1e308, -0.0, 0.5, float("nan"), float("inf"), "",
              "beam", "sample", "\ud800", "x" * 300, [], [1, 2], ["A dog."], {}, {"b64": "!!"}, {"b64": "QQ=="},
              [["nested"]], {"inputs": ["A dog."]}]
    fields = ["sentences", "strategy", "beam_size", "alpha", "max_extra", "early_exit", "n_best", "top_k", "top_p",
              "temperature", "seed", "deadline_ms", "model", "unknown", "instances", "inputs", "signature_name"]

    def body():
        kind = rng.random()
        if kind < 0.1:  # deeply nested
            depth = rng.choice([50, 999, 5000, 100_000])
            return ("[" * depth + "]" * depth).encode() if rng.random() < 0.5 else \
                ('{"a":' * depth + "1" + "}" * depth).encode()
        if kind < 0.2:  # not JSON, or not UTF-8, or truncated
            good = json.dumps({"sentences": ["A dog."]}).encode()
            return rng.choice([good[:rng.randrange(len(good))], b"\xff\xfe" + good, bytes(rng.randrange(256)
                               for _ in range(40)), b"9" * 5000, b"[" + b"9" * 5000 + b"]"])
        document = {}
        if rng.random() < 0.7:
            document["sentences" if rng.random() < 0.5 else "instances"] = rng.choice(
                [rng.sample(sentences[:50], rng.randrange(1, 4)), rng.choice(values)])
        for field in rng.sample(fields, rng.randrange(0, 4)):
            document[field] = rng.choice(values)
        text = json.dumps(document, allow_nan=True)
        return text.encode("utf-8", "surrogatepass")

    paths = ["/translate", f"/v1/models/{NAME}:predict", f"/v1/models/{NAME}/versions/1:predict",
             f"/v1/models/{NAME}/versions/99999999999999999999:predict", f"/v1/models/{NAME}:classify"]
    cases = [(rng.choice(paths), body()) for _ in range(300)]

    async def send_all():
        semaphore = asyncio.Semaphore(8)

        async def one(path, raw):
            async with semaphore:
                headers = {"X-Deadline-Ms": rng.choice(["1", "1", "-5", "abc", "1e400", "nan"])}
                return (await serve_load.request(server.port, "POST", path, raw, headers))[0], path, raw[:100]
        return await asyncio.gather(*(one(path, raw) for path, raw in cases))

    answers = _run(send_all())
    assert not [answer for answer in answers if answer[0] >= 500 and answer[0] not in (503, 504)], answers
    assert {status for status, _, _ in answers} >= {400, 404, 504}
    assert server.request("/healthz") == (200, {"status": "alive"})
    status, answer = server.request("/translate", {"sentences": ["A dog."]})
    assert status == 200 and answer["translations"][0], answer


def test_abandoned_requests_are_not_decoded(server, sentences):
    """Slow: clients give up while a long request decodes in the server; needs a server busy for seconds."""
    before = server.request("/stats")[1]
    # The blocker holds the engine for seconds: hot samples rarely draw the end token, so each of its 16 rows runs
    # to max_extra (50) past its source. The clients give up while it decodes (checked below, not assumed).
    long_sentences = [" ".join(sentences[i:i + 3]) for i in range(0, 48, 3)]  # 16 sentences of ~35 words
    blocker = {}
    body = {"sentences": long_sentences, "strategy": "sample", "temperature": 20.0}
    thread = threading.Thread(target=lambda: blocker.update(answer=server.request("/translate", body)))
    thread.start()
    deadline = time.monotonic() + 60
    while server.request("/stats")[1]["in_flight"] < 1:  # the blocker is on the engine
        assert time.monotonic() < deadline
        time.sleep(0.05)

    async def abandon():
        async def one(index):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            data = json.dumps({"instances": [sentences[100 + index]]}).encode()
            writer.write(f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            await writer.drain()
            return writer

        connections = await asyncio.gather(*(one(index) for index in range(50)))
        await asyncio.sleep(0.3)  # the clients give up
        status = json.loads((await serve_load.request(server.port, "GET", "/stats"))[2])
        for writer in connections:
            writer.close()
        return status

    during = _run(abandon())
    assert during["batches"] == before["batches"] and during["queued"] == 50, during  # the blocker still decodes
    deadline = time.monotonic() + 60
    while server.request("/stats")[1]["cancelled"] < before["cancelled"] + 50:
        assert time.monotonic() < deadline, server.request("/stats")[1]
        time.sleep(0.1)
    thread.join()
    assert blocker["answer"][0] == 200
    started = time.monotonic()
    status, _ = server.predict({"instances": [sentences[200]]})
    assert status == 200 and time.monotonic() - started < 5
    after = server.request("/stats")[1]
    assert after["cancelled"] == before["cancelled"] + 50
    assert after["sentences"] == before["sentences"] + 16 + 1  # the blocker and the fresh one: none of the 50
    assert after["queued"] == 0 and after["in_flight"] == 0


def test_deadlines_are_answered_504_without_decoding(server):
    """Slow: needs the running server process of this file; its counters show that nothing was decoded."""
    before = server.request("/stats")[1]
    status, answer = server.request("/translate", {"sentences": ["A dog."], "deadline_ms": 1})
    assert status == 504 and "deadline" in answer["error"]
    status, answer = server.request(f"/v1/models/{NAME}:predict", {"instances": ["A dog."]},
                                    headers={"X-Deadline-Ms": "1"})
    assert status == 504
    status, answer = server.request("/translate", {"sentences": ["A dog."], "deadline_ms": 60_000})
    assert status == 200
    after = server.request("/stats")[1]
    assert after["deadline_exceeded"] == before["deadline_exceeded"] + 2
    assert after["sentences"] == before["sentences"] + 1


def test_a_large_request_is_decoded_in_chunks_a_small_one_slips_between(server, sentences):
    """Slow: a large and a small request race in a running server; the order they finish in is the check."""
    before = server.request("/stats")[1]
    finished = {}

    def send(name, lines):
        answer = server.predict({"instances": lines})
        finished[name] = (time.monotonic(), answer)

    large = threading.Thread(target=send, args=("large", sentences[300:300 + MAX_SENTENCES]))
    large.start()
    deadline = time.monotonic() + 60
    while server.request("/stats")[1]["in_flight"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    send("small", [sentences[400]])
    large.join()
    assert finished["small"][1][0] == finished["large"][1][0] == 200
    assert finished["small"][0] < finished["large"][0]  # it did not wait for the whole large request
    after = server.request("/stats")[1]
    assert after["largest_batch"] <= MAX_BATCH
    assert after["sentences"] - before["sentences"] == MAX_SENTENCES + 1
    assert after["batches"] - before["batches"] == 3  # 16, then the small one with 15, then the last 9


def test_prometheus_metrics_parse_and_agree_with_stats(server):
    """Slow: reads the running server's metrics after this file's load tests, which make the counts worth checking."""
    families = _metrics(server)
    stats = server.request("/stats")[1]
    requests = families["keras_transformer_serve_requests"]
    counted = {(s.labels["route"], s.labels["status"]): s.value for s in requests.samples
               if s.name.endswith("_total")}
    for route, statuses in stats["responses"].items():
        if route in ("metrics", "stats"):  # the two requests of this test are counted after their answer
            continue
        for status, count in statuses.items():
            assert counted[route, status] == count, (route, status)
    for name in ("sentences", "batches", "rejected", "cancelled", "deadline_exceeded"):
        assert families[f"keras_transformer_serve_{name}"].samples[0].value == stats[name], name
    assert stats["rejected"] > 0 and stats["cancelled"] >= 50 and stats["deadline_exceeded"] >= 2
    batches = {s.name: s.value for s in families["keras_transformer_serve_batch_sentences"].samples}
    assert batches["keras_transformer_serve_batch_sentences_count"] == stats["batches"]
    assert batches["keras_transformer_serve_batch_sentences_sum"] == stats["sentences"]
    assert families["keras_transformer_serve_queue_sentences"].samples[0].value == 0
    assert families["keras_transformer_serve_model_version"].samples[0].value == 1


def test_version_2_copied_beside_version_1_is_switched_to_without_a_failed_request(server, base, sentences):
    """Slow: a second model version is loaded by the running server under load; no request may fail meanwhile."""
    bodies = [{"instances": sentences[i:i + 2]} for i in range(500, 700, 2)]
    seen = []

    async def watch():
        while True:
            status, _, content = await serve_load.request(server.port, "GET", f"/v1/models/{NAME}")
            listed = tuple((v["version"], v["state"]) for v in json.loads(content)["model_version_status"])
            if not seen or seen[-1] != listed:
                seen.append(listed)
            if listed == (("2", "AVAILABLE"), ("1", "END")):
                return
            await asyncio.sleep(0.1)

    async def run():
        watcher = asyncio.ensure_future(watch())
        await asyncio.to_thread(shutil.copytree, SHIPPED, base / "2")  # a copy in progress is not loaded
        loads = []
        while not watcher.done():  # 16 clients, in rounds of 2 s, until the switch is over; each pauses about
            # 0.5 s between an answer and its next request, leaving the 2 cores some time for version 2's warm-up
            loads += await serve_load.load(server.port, 16, 2, bodies, f"/v1/models/{NAME}:predict", think=0.5)
            assert len(loads) < 100_000
        await asyncio.wait_for(watcher, 300)
        return loads

    records = _run(run())
    assert {status for status, *_ in records} == {200}, serve_load.summarize(records, 1)
    assert (("2", "LOADING"), ("1", "AVAILABLE")) in seen, seen
    assert seen[-1] == (("2", "AVAILABLE"), ("1", "END")), seen
    status, answer = server.request(f"/v1/models/{NAME}/versions/2")
    assert status == 200 and answer["model_version_status"][0]["state"] == "AVAILABLE"
    assert server.request(f"/v1/models/{NAME}/versions/1:predict", {"instances": ["A dog."]})[0] == 404
    status, answer = server.request(f"/v1/models/{NAME}/versions/2:predict", {"instances": ["A dog."]})
    assert status == 200 and answer["predictions"][0]["translation"]
    assert _metrics(server)["keras_transformer_serve_model_version"].samples[0].value == 2
    assert "version 2 serves new requests" in server.output()


@pytest.mark.slow  # its call reaps the server, whose whole CPU time counts (TensorFlow's import, load, warm-up)
def test_sigterm_lets_requests_in_flight_finish_then_exits_0(server, multi30k_dir):
    """Last: it ends the server (after the version swap, version 2 answers)."""
    sentences = read_lines(multi30k_dir / "val.en.gz")[100:164]
    answers, finished = [None] * 16, [0.0] * 16

    def client(index):
        answers[index] = server.request("/translate", {"sentences": sentences[4 * index:4 * index + 4]})
        finished[index] = time.monotonic()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    done = server.request("/stats")[1]["requests"]
    deadline = time.monotonic() + 60
    while True:  # until every request has reached the server (answered or waiting for its batch)
        stats = server.request("/stats")[1]
        if stats["requests"] - done + stats["in_flight"] >= len(threads):
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.01)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join()
    assert server.process.wait(timeout=120) == 0, server.output()[-3000:]
    assert [status for status, _ in answers] == [200] * 16, answers
    assert all(len(answer["translations"]) == 4 and all(answer["translations"]) for _, answer in answers)
    assert max(finished) > signalled  # requests still decoding when the signal came were answered
    assert "Shutting down" in server.output()
