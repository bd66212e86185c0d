"""The server's parts on their own, without a server: the queue (`serving.batching.Batcher`, with engines that
record what they are given instead of decoding: the order batches are formed in, the bound on the queue,
cancellation and deadlines), which version of a base folder is loaded when (`serving.versions.ServedModel`), the
command line's checks of serve's flags, and the application on a translator without a model, in this process. The
end-to-end behaviour, on a real server process, is tests/test_serve_load.py's."""

import asyncio
import concurrent.futures
import contextlib
import time

import pytest

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.details import BLANK, Translation
from keras_transformer.serving import Batcher, RequestError, ServeSettings, Stats, Work
from keras_transformer.serving.batching import Cancelled


class Recorder:
    """An engine call that records each batch `(engine, sentences)` and answers each sentence with itself."""

    def __init__(self, seconds=0.01):
        self.batches, self.seconds = [], seconds

    def __call__(self, engine, key, parts):
        time.sleep(self.seconds)
        self.batches.append((engine, [item for part in parts for item in part]))
        return [[(item, 0.0) for item in part] for part in parts]


def _work(prefix, count):
    return Work("best", DecodeOptions(n_best=1), tuple(f"{prefix}{i}" for i in range(count)))


def _run(test, recorder, **settings):
    async def main():
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        batcher = Batcher(recorder, ServeSettings(batch_wait=0.0, **settings), Stats(), executor)
        task = asyncio.create_task(batcher.run())
        try:
            return await test(batcher)
        finally:
            task.cancel()
            executor.shutdown(wait=True)
    return asyncio.run(main())


def test_large_requests_go_in_chunks_of_max_batch_and_models_take_turns():
    recorder = Recorder(seconds=0.05)

    async def test(batcher):
        huge = batcher.admit("A", _work("h-", 40))  # model A: 3 chunks, 16, 16 and 8
        await asyncio.sleep(0.01)  # its first chunk is on the engine
        small = batcher.admit("A", _work("s-", 1))
        other = batcher.admit("B", _work("b-", 1))  # model B
        return await asyncio.gather(*(batcher.wait(p) for p in (huge, small, other)))

    huge, small, other = _run(test, recorder, max_batch=16, max_queue=128, max_sentences=40)
    assert [(engine, len(items)) for engine, items in recorder.batches] == [("A", 16), ("B", 1), ("A", 16), ("A", 9)]
    assert recorder.batches[2][1][0] == "s-0"  # the small request waited for one chunk of the large one (and B)
    assert [text for text, _ in huge] == [f"h-{i}" for i in range(40)]  # its chunks put back in order
    assert small == [("s-0", 0.0)] and other == [("b-0", 0.0)]


def test_a_full_queue_refuses_at_once_with_retry_after_and_counts_it():
    recorder = Recorder(seconds=0.2)

    async def test(batcher):
        first = batcher.admit("A", _work("x", 8))
        await asyncio.sleep(0.01)  # on the engine: the queue is empty again
        waiting = [batcher.admit("A", _work(f"w{n}-", 8)) for n in range(2)]  # 16 queued: the limit
        started = time.monotonic()
        with pytest.raises(RequestError) as refused:
            batcher.admit("A", _work("z", 1))
        assert time.monotonic() - started < 0.05
        assert refused.value.status == 503 and "--max-queue" in str(refused.value)
        assert int(refused.value.headers["Retry-After"]) >= 1
        await asyncio.gather(*(batcher.wait(p) for p in [first] + waiting))
        return batcher

    batcher = _run(test, recorder, max_batch=8, max_queue=16, max_sentences=8)
    assert batcher._stats.rejected == 1 and batcher.queued_sentences == 0


def test_cancelled_and_overdue_requests_are_not_decoded():
    recorder = Recorder(seconds=0.2)

    async def test(batcher):
        first = batcher.admit("A", _work("first", 4))
        await asyncio.sleep(0.01)
        gone = batcher.admit("A", _work("gone", 4))
        overdue = batcher.admit("A", _work("late", 4), deadline=time.monotonic() + 0.05)
        batcher.cancel(gone)
        with pytest.raises(Cancelled):
            await batcher.wait(gone)
        with pytest.raises(RequestError) as late:
            await batcher.wait(overdue)
        assert late.value.status == 504
        await batcher.wait(first)
        kept = await batcher.submit("A", _work("kept", 2))
        return batcher, kept

    batcher, kept = _run(test, recorder, max_batch=8, max_queue=64, max_sentences=8)
    decoded = [item for _, items in recorder.batches for item in items]
    assert not [item for item in decoded if item.startswith(("gone", "late"))], decoded
    assert [text for text, _ in kept] == ["kept0", "kept1"]
    assert (batcher._stats.cancelled, batcher._stats.deadline_exceeded) == (1, 1)


@pytest.mark.parametrize(("arguments", "named"), [
    (["--model", "en_de=saved_models/multi30k_en_de", "--model", "saved_models/multi30k_en_fr"], "not a mix"),
    (["--model", "a=saved_models/multi30k_en_de", "--model", "a=saved_models/multi30k_en_fr"], "given twice"),
    (["--model", "a=saved_models/multi30k_en_de", "--name", "b"], "--name"),
    (["--model", "saved_models/multi30k_en_de", "--max-queue", "10"], "--max-queue (10)"),
])
def test_serve_refuses_bad_model_and_queue_flags_before_loading(arguments, named, capsys, monkeypatch):
    from conftest import REPO_ROOT

    from keras_transformer import cli

    monkeypatch.chdir(REPO_ROOT)
    assert cli.main(["serve", *arguments]) == 2
    assert named in capsys.readouterr().err


def test_translate_fields_choose_their_strategy_on_a_greedy_default_and_errors_name_the_fields():
    """docs/serving.md's `/translate` example (beam_size 2, n_best 2) on a model that decodes greedily by default:
    beam search with 2 hypotheses; a field that contradicts the request's strategy is a 400 naming both fields."""
    from keras_transformer.serving.requests import parse_translate

    greedy = DecodeOptions(strategy="greedy")
    work = parse_translate({"sentences": ["A dog."], "beam_size": 2, "n_best": 2}, greedy, ServeSettings())
    assert (work.kind, work.options.strategy, work.options.beam_size, work.options.returned()) == ("n_best", "beam",
                                                                                                   2, 2)
    work = parse_translate({"sentences": ["A dog."], "alpha": 0.0}, greedy, ServeSettings())
    assert (work.options.strategy, work.options.alpha) == ("beam", 0.0)
    for body, message in (({"strategy": "greedy", "beam_size": 2}, "beam_size belongs to strategy 'beam' and "
                                                                     "strategy is 'greedy'"),
                          ({"n_best": 2}, "n_best must be 1 with strategy 'greedy' (one hypothesis), got 2: beam "
                                          "search returns several (strategy 'beam', beam_size >= 2)")):
        with pytest.raises(RequestError) as error:
            parse_translate({"sentences": ["A dog."], **body}, greedy, ServeSettings())
        assert error.value.status == 400 and message in str(error.value) and "decoding." not in str(error.value)


def test_a_new_version_is_loaded_once_its_files_stop_changing_and_a_failed_one_only_when_changed(tmp_path):
    from keras_transformer.serving.versions import AVAILABLE, END, ServedModel

    def version(number, content=b"graph"):
        folder = tmp_path / str(number)
        folder.mkdir(exist_ok=True)
        (folder / "saved_model.pb").write_bytes(content)  # what makes a folder an export (layout.model_kind)

    version(1)
    version(2)
    (tmp_path / ".3.partial").mkdir()  # hidden: never a version
    model = ServedModel("m", load=None, base=str(tmp_path))
    first = model.to_load()
    assert first.number == 2 and model.to_load() is None  # at start, the highest at once; then nothing new
    first.state = AVAILABLE
    version(3)
    assert model.to_load() is None  # just appeared: its files may still be growing
    (tmp_path / "3" / "variables").mkdir()
    (tmp_path / "3" / "variables" / "data").write_bytes(b"x" * 10)
    assert model.to_load() is None  # changed since the last look
    third = model.to_load()  # unchanged since the last look: loaded
    assert third.number == 3 and third.path == str(tmp_path / "3")
    third.state, third.error = END, "damaged"  # its load failed: the current version keeps serving
    assert model.current is first and model.to_load() is None and model.to_load() is None
    version(3, b"fixed graph")  # changed: tried again once stable
    assert model.to_load() is None
    again = model.to_load()
    assert again.number == 3 and not again.error
    again.state = AVAILABLE
    assert model.current is again and model.replaced() == [first]


class UpperCaser:
    """A translator of the interface `serve` uses, without a model: a sentence's translation is its upper case."""

    engine = "upper"

    def __init__(self, options=None):
        self.options = options or DecodeOptions(n_best=None)

    def with_options(self, options):
        return UpperCaser(options)

    def n_best_lines(self, lines, batch_size=64):
        return [[(line.upper(), -float(len(line)))] * self.options.returned() for line in lines]


@contextlib.contextmanager
def serving(app):
    """`app` served by uvicorn on a thread of this process, on a free port, once ready; gives `call(path, body)`
    -> `(status, answer bytes)`."""
    import json
    import socket
    import threading
    import urllib.error
    import urllib.request

    uvicorn = pytest.importorskip("uvicorn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run)
    thread.start()

    def call(path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if call("/readyz")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield call
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_model_folder_given_as_a_load_function_is_served_as_version_1():
    """`build_app(load, name)` as before versions existed (`serve --model DIR` of one folder): version 1, predict,
    /translate in chunks of max_batch, /stats and the metrics, in this process with uvicorn on a thread."""
    import json

    pytest.importorskip("uvicorn")  # the serve extra, with starlette and prometheus_client
    pytest.importorskip("prometheus_client")
    from keras_transformer.serving import build_app

    app = build_app(lambda: UpperCaser(), "upper", ServeSettings(max_batch=4, max_sentences=8))
    with serving(app) as call:
        status, answer = call("/v1/models/upper")
        assert status == 200 and json.loads(answer)["model_version_status"] == [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]
        assert call("/v1/models/upper/versions/2")[0] == 404
        status, answer = call("/v1/models/upper/versions/1:predict", {"instances": ["a dog", "a cat"]})
        assert status == 200 and [p["translation"] for p in json.loads(answer)["predictions"]] == ["A DOG", "A CAT"]
        status, answer = call("/translate", {"sentences": [f"s{i}" for i in range(6)]})
        assert status == 200 and json.loads(answer)["translations"] == [f"S{i}" for i in range(6)]
        stats = json.loads(call("/stats")[1])
        assert stats["batch_sentences"] == {"2": 2, "4": 1} and stats["requests"] == 2  # 2, then 4 and 2
        metrics = call("/monitoring/prometheus/metrics")[1].decode()
        assert 'keras_transformer_serve_model_version{model="upper"} 1.0' in metrics
        assert 'keras_transformer_serve_requests_total{route="predict",status="200"} 1.0' in metrics


# ---------------------------------------------------------------- /translate's documents


def _document_upper():
    """A translator of the interface (documents included) without a model: upper case, score minus the length."""
    from keras_transformer.engines.interface import TranslatorInterface

    class DocumentUpper(TranslatorInterface):
        engine, strategies = "upper", ("beam", "greedy")
        translate_batch = score_batch = None

        def __init__(self, options=None):
            self.options = options or DecodeOptions()

        def with_options(self, options):
            return DocumentUpper(options)

        def n_best_batch(self, texts, prefixes=None):
            return [[(text.upper(), -float(len(text)))] * self.options.returned() for text in texts]

        def details_batch(self, texts, prefixes=None):  # the score over one token per word and eos
            return [Translation.from_score(text.upper(), -float(len(text)), len(text.split()) + 1,
                                           self.scoring_alpha) for text in texts]

    return DocumentUpper()


def test_translate_reads_documents_into_sentences_that_the_limits_count():
    from keras_transformer.serving.requests import assemble_documents, parse_translate

    translator, settings = _document_upper(), ServeSettings(max_sentences=4)
    text = "A dog runs. It barks.\n\n  - Two men."
    work = parse_translate({"sentences": [text, "", "<p>A <b>big</b> cat.</p>"], "format": "html"},
                           translator.options, settings, translator=translator)
    assert work.items[-1] == "A big cat." and work.documents.counts[1:] == (0, 1)  # an empty document: none
    work = parse_translate({"sentences": [text, ""], "format": "text"}, translator.options, settings,
                           translator=translator)
    assert work.kind == "details" and work.items == ("A dog runs.", "It barks.", "Two men.")
    answer = assemble_documents(work.documents, translator.translate_detailed(work.items))
    assert answer["translations"] == [text.upper(), ""] and answer["scores"] == [-(11 + 9 + 8) / 3, 0.0]
    penalty = ((5 + 3) / 6) ** translator.scoring_alpha  # "Two men." is 3 tokens, its score -8
    assert answer["sentences"][0][2] == {"source": "Two men.", "translation": "TWO MEN.", "score": -8.0,
                                         "log_prob": -8.0 * penalty, "mean_log_prob": -8.0 * penalty / 3,
                                         "tokens": 3}
    log_probs = [-11 * ((5 + 4) / 6) ** translator.scoring_alpha, -9 * penalty, -8 * penalty]
    assert answer["mean_log_probs"] == [pytest.approx(sum(log_probs) / 10), 0.0]  # 10 tokens in the document
    lines = parse_translate({"sentences": [text]}, translator.options, settings, translator=translator)
    assert lines.items == (text,) and lines.documents is None  # format lines: today's one sentence per string

    refusals = [({"sentences": ["One. Two. Three.", "Four. Five."], "format": "text"}, 413,
                 "5 sentences after segmentation in one request; this server takes at most 4 (--max-sentences)"),
                ({"sentences": ["<doc><p>Hi</doc>"], "format": "xml"}, 400,
                 "sentences[0]: the XML document is not well-formed"),
                ({"sentences": ["A\x00B."], "format": "text"}, 400, "sentences[0]: the document looks binary"),
                ({"sentences": ["A."], "format": "pdf"}, 400, "format must be one of lines, text, html, xml"),
                ({"sentences": ["A."], "format": "text", "n_best": 2}, 400, "n_best is for sentences"),
                ({"sentences": ["A."], "format": "text", "target_prefix": "Ein"}, 400, "target_prefix is for"),
                ({"sentences": ["A."], "format": "text", "source_lang": 3}, 400, "source_lang must be a string")]
    for body, status, message in refusals:
        with pytest.raises(RequestError) as refused:
            parse_translate(body, translator.options, settings, translator=translator)
        assert refused.value.status == status and message in str(refused.value), body


def test_a_request_s_documents_are_read_once_and_answered_as_translate_document_answers(monkeypatch):
    """Each document is segmented (or its markup parsed) once, when the request is read: its plan's lines are the
    request's sentences and the answer is put together from that plan; text and records are those of
    `translate_document(..., details=True)` in Python."""
    import collections

    from keras_transformer.documents import document
    from keras_transformer.serving.requests import assemble_documents, parse_translate

    translator, calls = _document_upper(), collections.Counter()
    for name in ("segment", "read_markup"):
        real = getattr(document, name)
        monkeypatch.setattr(document, name, lambda *a, real=real, name=name, **k: calls.update([name]) or real(*a, **k))
    texts = {"text": ("A dog runs. It barks.\n\n  - Two men.", {"segment": 2}),
             "html": ("<p>A <b>big</b> cat. It <i>sleeps</i>.</p><img alt='A red car.'>", {"read_markup": 2})}
    for format, (text, once) in texts.items():
        calls.clear()
        work = parse_translate({"sentences": [text, text], "format": format}, translator.options, ServeSettings(),
                               translator=translator)
        answer = assemble_documents(work.documents, translator.translate_detailed(work.items))
        assert calls == once  # once per document, for reading and answering together
        python = translator.translate_document(text, format, details=True)
        assert answer["translations"] == [python["text"]] * 2 and answer["sentences"] == [python["sentences"]] * 2
        assert len(python["sentences"]) == 3 and python["text"] != text


def test_the_server_translates_documents_whole_batching_their_sentences_as_lines():
    """/translate with format text and html on a translator without a model, in this process: each document
    comes back whole, its sentences decoded in batches of at most max_batch; past the limits 413, bad markup 400."""
    import json

    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from keras_transformer.serving import build_app

    app = build_app(_document_upper, "upper", ServeSettings(max_batch=4, max_sentences=8))
    text = "Title\n\nOne. Two. Three.\n  - Four.\n  - Five. Six."
    with serving(app) as call:
        before = json.loads(call("/stats")[1])["batch_sentences"]
        status, answer = call("/translate", {"sentences": [text], "format": "text", "beam_size": 2})
        answer = json.loads(answer)
        assert status == 200 and answer["translations"] == [text.upper()]
        assert [row["source"] for row in answer["sentences"][0]] == ["Title", "One.", "Two.", "Three.", "Four.",
                                                                     "Five.", "Six."]
        assert [row["mean_log_prob"] for row in answer["sentences"][0]] == [
            detail.mean_log_prob for detail in _document_upper().translate_detailed(
                ["Title", "One.", "Two.", "Three.", "Four.", "Five.", "Six."])]
        after = json.loads(call("/stats")[1])["batch_sentences"]
        grown = {size: after[size] - before.get(size, 0) for size in after if after[size] != before.get(size, 0)}
        assert grown == {"4": 1, "3": 1}  # 7 sentences in batches of at most 4
        status, answer = call("/translate", {"sentences": ["<p>A <i>red</i> car. It <b>stops</b>.</p>"],
                                             "format": "html"})
        assert status == 200 and json.loads(answer)["translations"] == ["<p>A <i>RED</i> CAR. IT <b>STOPS</b>.</p>"]
        nine = " ".join(f"It is {i}." for i in range(9))
        status, answer = call("/translate", {"sentences": [nine], "format": "text"})
        assert status == 413 and "--max-sentences" in json.loads(answer)["error"]
        status, answer = call("/translate", {"sentences": ["<a><b></a>"], "format": "xml"})
        assert status == 400 and "not well-formed" in json.loads(answer)["error"]
        # lines with their signals: translate_detailed's records, named as in Python
        status, answer = call("/translate", {"sentences": ["A dog runs.", ""], "details": True})
        expected = _document_upper().translate_detailed(["A dog runs.", ""])
        assert status == 200 and json.loads(answer) == {
            "translations": ["A DOG RUNS.", ""], "scores": [-11.0, 0.0],
            "details": [expected[0].to_dict(), BLANK.to_dict()]}
        assert json.loads(answer)["details"][0]["mean_log_prob"] < 0
        for body, message in (({"details": "yes"}, "details must be true or false"),
                              ({"details": True, "n_best": 1}, "details is for the best translation")):
            status, answer = call("/translate", {"sentences": ["A dog."], **body})
            assert status == 400 and message in json.loads(answer)["error"], body


def _terms_upper(refuses=False):
    """`_document_upper`'s translator that also forces terms, as the TensorFlow engine's interface does: a
    term the vocabulary lacks ("☃") is refused by `term_tokens`; a translation is the upper case followed by its
    constraints' first forms, except a term of over 20 characters, reported unmet. With `refuses`, an engine
    without terms."""
    from keras_transformer.engines.terms import TermRequest
    from keras_transformer.errors import ConfigError

    upper = type(_document_upper())

    class TermsUpper(upper):
        def with_options(self, options):
            return TermsUpper(options)

        def term_tokens(self, text):
            if "☃" in text:
                raise ConfigError(f"The term {text!r} holds text the target vocabulary does not have.")
            return [len(word) for word in text.split()]

        def translate_terms(self, lines, constraints=None, banned=None, glossary=None, batch_size=64,
                            target_prefix=None, target_lang=None, num_return=1):
            request = TermRequest.build(len(lines), constraints, banned, glossary, lines)
            return [[{"translation": " ".join([line.upper()] + [t[0] for t in terms if len(t[0]) <= 20]),
                      "score": -1.0, "unmet": [t[0] for t in terms if len(t[0]) > 20]}] * num_return
                    for line, terms in zip(lines, request.per_line)]

    return upper() if refuses else TermsUpper()


def test_translate_takes_constraints_a_glossary_and_banned_terms_and_refuses_bad_ones_with_400():
    """/translate's `constraints` (per sentence), `glossary` (per request) and `banned`, on a translator without
    a model, in this process: each sentence gets its terms and the glossary's, `unmet` names a term that could
    not fit; every bad field is a 400 naming it; an engine without terms answers 400 naming itself."""
    import json

    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from keras_transformer.engines.terms import MAX_CONSTRAINTS
    from keras_transformer.serving import build_app
    from keras_transformer.serving.requests import parse_translate

    long_term = "Donaudampfschifffahrtsgesellschaft"
    body = {"sentences": ["A bike.", "A dog."], "constraints": [["Rad"], [long_term]],
            "glossary": {"dog": ["Hund", "Köter"]}, "banned": ["Mist"]}
    work = parse_translate(body, DecodeOptions(), ServeSettings(), translator=_terms_upper())
    assert work.items == (("A bike.", None, (("Rad",),)), ("A dog.", None, ((long_term,), ("Hund", "Köter"))))
    assert work.banned == ("Mist",) and work.key[3] == ("Mist",)
    with serving(build_app(_terms_upper, "upper", ServeSettings())) as call:
        status, answer = call("/translate", body)
        assert status == 200 and json.loads(answer) == {
            "translations": ["A BIKE. Rad", "A DOG. Hund"], "scores": [-1.0, -1.0], "unmet": [[], [long_term]]}
        status, answer = call("/translate", {**body, "n_best": 2})
        assert status == 200 and json.loads(answer)["unmet"] == [[[], []], [[long_term], [long_term]]]
        status, answer = call("/translate", {"sentences": ["A dog."]})  # no terms: the plain path, no "unmet"
        assert status == 200 and json.loads(answer) == {"translations": ["A DOG."], "scores": [-6.0]}
        for bad, named in [({"constraints": [["Rad"]]}, "constraints: give one list of terms per line (2 line"),
                           ({"constraints": [[""], []]}, "constraints: line 1's constraint 1 is empty"),
                           ({"constraints": [["☃"], []]}, "The term '☃' holds text the target vocabulary"),
                           ({"constraints": [["Rad"] * (MAX_CONSTRAINTS + 1), []]}, f"at most {MAX_CONSTRAINTS}"),
                           ({"glossary": ["dog", "Hund"]}, "glossary must be an object"),
                           ({"glossary": {"dog": 3}}, "glossary['dog'] must be a target term"),
                           ({"banned": "Mist"}, "banned must be a list of target terms"),
                           ({"strategy": "sample"}, "constraints: sampling cannot force terms"),
                           ({"format": "text"}, "constraints is for sentences (format lines)")]:
            status, answer = call("/translate", {**body, **bad})
            assert status == 400 and named in json.loads(answer)["error"], (bad, answer)
    with serving(build_app(lambda: _terms_upper(refuses=True), "upper", ServeSettings())) as call:
        status, answer = call("/translate", {"sentences": ["A dog."], "banned": ["Mist"]})
        assert status == 400 and json.loads(answer)["error"].startswith("The upper engine cannot force or ban terms")


def test_predict_serves_translate_constrained_as_the_savedmodel_does_and_refuses_bad_terms_with_400():
    """TensorFlow Serving's `translate_constrained` signature through `:predict`, on a translator without a model:
    rows and columns of slots ("" none, forms split at a tab) become each sentence's terms, `met` flags each slot
    (True for an empty one, False for a term that could not fit); every bad input is a 400 naming it, and an
    engine without terms answers 400 naming itself."""
    import json

    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from keras_transformer.engines.terms import MAX_CONSTRAINTS
    from keras_transformer.serving import build_app

    long_term = "Donaudampfschifffahrtsgesellschaft"
    instances = [{"inputs": "A bike.", "constraints": ["Rad", "", long_term], "banned": ["Mist", ""]},
                 {"inputs": "A dog.", "constraints": ["Hund\tKöter", "", ""], "banned": ["Mist", ""]}]
    path = "/v1/models/upper:predict"
    with serving(build_app(_terms_upper, "upper", ServeSettings())) as call:
        status, answer = call(path, {"signature_name": "translate_constrained", "instances": instances})
        assert status == 200 and json.loads(answer) == {"predictions": [
            {"translation": "A BIKE. Rad", "score": -1.0, "met": [True, True, False]},
            {"translation": "A DOG. Hund", "score": -1.0, "met": [True, True, True]}]}
        columns = {name: [row[name] for row in instances] for name in ("inputs", "constraints", "banned")}
        status, answer = call(path, {"signature_name": "translate_constrained", "inputs": columns})
        assert status == 200 and json.loads(answer) == {"outputs": {
            "translation": ["A BIKE. Rad", "A DOG. Hund"], "score": [-1.0, -1.0],
            "met": [[True, True, False], [True, True, True]]}}
        for bad, named in [({"constraints": "Rad"}, "instances[0].constraints must be a list of strings"),
                           ({"constraints": ["Rad"] * (MAX_CONSTRAINTS + 1)}, f"at most {MAX_CONSTRAINTS} per line"),
                           ({"constraints": ["☃"]}, "The term '☃' holds text the target vocabulary"),
                           ({"banned": ["Quatsch"]}, "banned: this server bans one list of phrases per request"),
                           ({"banned": None}, "instances[0].banned must be a list of strings")]:
            status, answer = call(path, {"signature_name": "translate_constrained",
                                         "instances": [{**instances[0], **bad}, instances[1]]})
            assert status == 400 and named in json.loads(answer)["error"], (bad, answer)
        status, answer = call(path, {"signature_name": "translate_constrained", "instances": [{"inputs": "A dog."}]})
        assert status == 400 and "needs input constraints, banned" in json.loads(answer)["error"]
    with serving(build_app(lambda: _terms_upper(refuses=True), "upper", ServeSettings())) as call:
        status, answer = call(path, {"signature_name": "translate_constrained", "instances": instances})
        assert status == 400 and json.loads(answer)["error"].startswith("The upper engine cannot force or ban terms")
