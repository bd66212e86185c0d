"""`keras-transformer serve`: one real server process on the shipped export, driven over HTTP as clients would.

TensorFlow Serving's predict answers what the SavedModel's own `serving_default` gives (`shipped_served`, the
signature called directly); `/translate` samples with per-request options; concurrent clients are batched;
malformed and oversized requests are refused with a message. The server is conftest's `served`, started once for
this file and tests/test_serve_load.py (TensorFlow's import, the model's load and its warm-up cost seconds),
which runs after this one and ends it by SIGTERM.
"""

import json
import threading

import pytest
from conftest import SERVE_LIMITS, SERVE_NAME

from keras_transformer.evaluation import read_lines

pytestmark = pytest.mark.xdist_group("test_serve")

# The serve extra (the test extra installs it, as it does ctranslate2 for tests/test_ctranslate2_export.py).
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

NAME = SERVE_NAME
MAX_SENTENCES, MAX_CHARS, MAX_BODY = (SERVE_LIMITS[name] for name in ("max_sentences", "max_sentence_chars",
                                                                     "max_body_bytes"))


@pytest.fixture(scope="module")
def server(served):
    return served  # conftest's server, shared with tests/test_serve_load.py


@pytest.mark.slow  # a running server process on the shipped export
def test_status_metadata_health_and_unknown_models(server):
    """A running `keras-transformer serve`: alive while the model loads (not ready, TensorFlow Serving's
    LOADING), then ready, its status and metadata as TensorFlow Serving gives them, unknown models 404."""
    # The server listens while the model loads (seconds): alive, not ready, TensorFlow Serving's LOADING.
    assert server.while_loading is not None, "/readyz was never seen before the model was ready"
    alive, ready, status = server.while_loading
    assert alive == (200, {"status": "alive"}) and ready[0] == 503 and ready[1]["status"] == "loading"
    assert status["state"] == "LOADING"
    assert server.request("/healthz") == (200, {"status": "alive"})
    assert server.request("/readyz")[0] == 200
    status, answer = server.request(f"/v1/models/{NAME}")
    assert status == 200 and answer["model_version_status"][0]["state"] == "AVAILABLE"
    status, answer = server.request(f"/v1/models/{NAME}/metadata")
    signatures = answer["metadata"]["signature_def"]["signature_def"]
    assert status == 200 and {"serving_default", "n_best", "sample", "score"} <= set(signatures)
    assert signatures["serving_default"]["outputs"]["translation"]["dtype"] == "DT_STRING"
    for path in (f"/v1/models/{NAME}x", f"/v1/models/{NAME}x:predict"):
        status, answer = server.request(path, {"instances": ["A dog."]} if path.endswith("predict") else None)
        assert status == 404 and f"{NAME}x" in answer["error"] and NAME in answer["error"]


@pytest.mark.slow  # n_best and score build their graphs in the server on first use
def test_tf_serving_predict_answers_what_the_savedmodel_signature_gives(server, shipped_served, multi30k_dir):
    """Rows and columns, base64 strings and the versioned URL: the translations of `serving_default` itself."""
    val = read_lines(multi30k_dir / "val.en.gz")[:12]
    test = read_lines(multi30k_dir / "test_2016_flickr.en.gz")[:8]
    status, rows = server.predict({"instances": val})
    assert status == 200
    assert [row["translation"] for row in rows["predictions"]] == shipped_served["val"]
    assert all(isinstance(row["score"], float) and row["score"] < 0 for row in rows["predictions"])
    status, columns = server.request(f"/v1/models/{NAME}/versions/1:predict",
                                     {"signature_name": "serving_default", "inputs": {"inputs": test}})
    assert status == 200 and columns["outputs"]["translation"] == shipped_served["test"][:8]
    import base64
    status, encoded = server.predict({"instances": [{"b64": base64.b64encode(val[0].encode()).decode()}]})
    assert status == 200 and encoded["predictions"][0]["translation"] == shipped_served["val"][0]
    # n_best: the best hypothesis first, the beam's size of them; score: forced decoding gives the beam's score.
    status, n_best = server.predict({"signature_name": "n_best", "instances": [{"inputs": val[0]}]})
    assert status == 200 and n_best["predictions"][0]["translations"][0] == shipped_served["val"][0]
    assert len(n_best["predictions"][0]["translations"]) == 5  # the export's beam_size
    status, scored = server.predict({"signature_name": "score",
                                     "instances": [{"sources": val[0], "targets": shipped_served["val"][0]}]})
    assert status == 200
    assert scored["predictions"][0] == pytest.approx(rows["predictions"][0]["score"], abs=1e-4)


@pytest.mark.slow  # the sampling graph and the greedy search are built in the server on first use
def test_translate_takes_sampling_options_per_request(server, shipped_served, multi30k_dir):
    """Slow: requests to a running server process, decoding Multi30k sentences several ways."""
    sentences = read_lines(multi30k_dir / "val.en.gz")[:4]
    status, greedy = server.request("/translate", {"sentences": sentences, "strategy": "greedy"})
    assert status == 200 and "seed" not in greedy
    # Drawing among the 1 most probable tokens is greedy decoding, whatever the seed and temperature.
    status, top1 = server.request("/translate", {"sentences": sentences, "top_k": 1, "temperature": 0.7,
                                                 "seed": 11})
    assert status == 200 and top1["seed"] == 11 and top1["translations"] == greedy["translations"]
    assert top1["scores"] == pytest.approx(greedy["scores"], abs=1e-4)
    hot = {"sentences": sentences, "temperature": 1.5, "top_p": 0.95}
    first, again, other = (server.request("/translate", {**hot, "seed": seed})[1] for seed in (1, 1, 2))
    assert first == again and first["translations"] != other["translations"]
    status, signature = server.predict({"signature_name": "sample", "inputs": {"inputs": sentences, "seed": 1,
                                                                              "temperature": 1.5, "top_p": 0.95}})
    assert status == 200 and signature["outputs"]["translation"] == first["translations"]
    assert first["translations"] != greedy["translations"]
    status, fresh = server.request("/translate", {"sentences": sentences[:1], "strategy": "sample"})
    assert status == 200 and isinstance(fresh["seed"], int)
    status, n_best = server.request("/translate", {"sentences": sentences[:1], "beam_size": 3, "n_best": 2})
    assert status == 200 and len(n_best["translations"][0]) == 2 and n_best["scores"][0][0] >= n_best["scores"][0][1]


@pytest.mark.slow  # the prefixed search is built in the server on first use
def test_translate_and_predict_take_target_prefixes(server, shipped_served, multi30k_dir):
    """/translate's `target_prefix` (one for all, or one per sentence) and the `translate_prefix` signature force
    the translations' start; "" forces nothing (the plain translation); a prefix too long and a language the model
    has no token for are that request's 400, naming them."""
    sentences = read_lines(multi30k_dir / "val.en.gz")[:2]
    status, forced = server.request("/translate", {"sentences": sentences, "target_prefix": ["Eine Frau", ""]})
    assert status == 200 and forced["translations"][0].startswith("Eine Frau")
    assert forced["translations"][1] == shipped_served["val"][1]
    status, signature = server.predict({"signature_name": "translate_prefix",
                                        "inputs": {"inputs": sentences, "target_prefix": ["Eine Frau", ""]}})
    assert status == 200 and signature["outputs"]["translation"] == forced["translations"]
    assert signature["outputs"]["score"] == pytest.approx(forced["scores"], abs=1e-4)
    status, refused = server.request("/translate", {"sentences": sentences[:1], "target_prefix": "Ein " * 200})
    assert status == 400 and "has 200 tokens; the model produces at most 128" in refused["error"]
    status, refused = server.request("/translate", {"sentences": sentences[:1], "target_lang": "deu_Latn"})
    assert status == 400 and "target language 'deu_Latn': this model has no language tokens" in refused["error"]


@pytest.mark.slow  # a running server process on the shipped export
def test_concurrent_requests_all_succeed_and_are_decoded_in_batches(server, shipped_served, multi30k_dir):
    """32 concurrent clients against a running server: every answer is the sentence's translation, and the
    server decoded them in batches, not one by one."""
    sentences = read_lines(multi30k_dir / "test_2016_flickr.en.gz")[:32]
    answers = [None] * len(sentences)

    def client(index):
        answers[index] = server.predict({"instances": [sentences[index]]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(sentences))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in answers] == [200] * len(sentences)
    assert [answer["predictions"][0]["translation"] for _, answer in answers] == shipped_served["test"][:32]
    status, stats = server.request("/stats")
    requests_per_batch = [int(size) for size in stats["batch_requests"]]
    assert status == 200 and max(requests_per_batch) > 1, stats
    assert "sentence(s) from" in server.output()  # each batch is logged with its size


@pytest.mark.slow  # a running server process
def test_malformed_and_oversized_requests_are_refused_with_a_message(server):
    """A running server answers malformed JSON, wrong shapes and oversized requests with a 400 or 413 and a
    message naming the problem, and goes on serving."""
    cases = [
        (f"/v1/models/{NAME}:predict", b'{"instances": [', 400, "Malformed JSON"),
        (f"/v1/models/{NAME}:predict", b'["A dog."]', 400, "JSON object"),
        (f"/v1/models/{NAME}:predict", b'{"instances": "A dog."}', 400, "instances must be a list"),
        (f"/v1/models/{NAME}:predict", b'{"instances": [3]}', 400, "expected a string"),
        (f"/v1/models/{NAME}:predict", b'{"signature_name": "nope", "instances": []}', 400, "nope"),
        (f"/v1/models/{NAME}:predict", b'{"inputs": {"sources": ["a"], "targets": []}}', 400, "serving_default"),
        ("/translate", b'{"sentences": "A dog."}', 400, "sentences must be a list"),
        ("/translate", b'{"sentences": ["A dog."], "beam_size": 0}', 400, "beam_size"),
        ("/translate", b'{"sentences": ["A dog."], "beams": 2}', 400, "beams"),
        ("/translate", json.dumps({"sentences": ["A dog."] * (MAX_SENTENCES + 1)}).encode(), 413, "--max-sentences"),
        ("/translate", json.dumps({"sentences": ["word " * MAX_CHARS]}).encode(), 413, "--max-sentence-chars"),
        (f"/v1/models/{NAME}:predict", json.dumps({"instances": ["x" * 100] * 300}).encode(), 413,
         "--max-body-bytes"),
    ]
    for path, raw, expected, named in cases:
        status, answer = server.request(path, raw=raw)
        assert (status, named in answer.get("error", "")) == (expected, True), (raw[:80], status, answer)
    assert server.request("/v1/models/x/y/z")[0] == 404
