"""Shared test fixtures. Each part of the package keeps its fixtures in its own marked section."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `make test` runs one pytest worker per core: each worker (and each subprocess a test starts) gets one thread per
# TensorFlow pool, instead of one per core each, whose threads would spin against the other worker's.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
# Likewise CTranslate2, which by default takes every core (`engines.ctranslate2.default_intra_threads`): its OpenMP
# threads spin while they wait for each other, and a team as large as the machine stalls beside the other worker.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gc  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

# A pytest worker keeps hundreds of thousands of objects alive (TensorFlow's graphs and functions, the session
# fixtures), and each full collection walks them all, about a second apiece. Python's default (700, 10, 10) runs one
# whenever the objects added since the last reach a quarter of those; this lets ten times as many young
# collections pass between two (measured: a worker's collection time 6.0 -> 2.5 CPU s over four test files).
gc.set_threshold(700, 10, 100)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"


# A test that is not marked slow fails when its call costs more than this many CPU seconds (its own process and
# the subprocesses it waited for; fixture setup, where shared fixtures are built, is not counted). CPU time, not
# wall time: a test slowed down by its neighbours on a busy machine is not failed for it. `make test-fast` skips
# the slow ones, so the edit-test loop stays under 3 minutes.
SLOW_LIMIT_S = float(os.environ.get("KT_SLOW_LIMIT_S", "15"))


def _cpu_seconds():
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def pytest_runtest_setup(item):
    """Once a test has imported TensorFlow, its graph operations stop recording the Python stack they were built
    from: TensorFlow walks the whole stack for each operation it adds to a graph (for its own error messages), and
    under pytest that stack is a hundred frames deep (measured, with the collector's thresholds above: 6-10% less
    CPU for test_decoding, test_translation and test_sampling in one process). Nothing of ours reads those stacks; a
    TensorFlow whose private `_create_c_op` has another signature is left as it is."""
    ops = sys.modules.get("tensorflow.python.framework.ops")
    if ops is None or getattr(pytest_runtest_setup, "done", False):
        return
    import inspect

    create = inspect.unwrap(ops._create_c_op)
    if list(inspect.signature(create).parameters)[-1] == "extract_traceback" and create.__defaults__ == (None, True):
        create.__defaults__ = (None, False)
    pytest_runtest_setup.done = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = _cpu_seconds()
    yield
    item.user_properties.append(("cpu_s", _cpu_seconds() - start))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    cpu = dict(item.user_properties).get("cpu_s", 0.0)
    if (report.when == "call" and report.passed and item.get_closest_marker("slow") is None
            and cpu > SLOW_LIMIT_S):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {cpu:.1f} CPU seconds, over the {SLOW_LIMIT_S:g} s allowed a test "
                           "not marked slow: make it cheaper (tests/README.md) or mark it @pytest.mark.slow")


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker, the tests marked slow that belong to no xdist_group move ahead of the other
    ungrouped tests. The scheduler hands out the groups first, then the ungrouped tests one at a time in this order,
    queueing up to three on each worker: left at the end, a slow test (10-40 s) would run alone while the other
    worker, its queue empty, waits for it. Groups keep their order; so do the tests within each part."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None
                                     and item.get_closest_marker("slow") is None))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """One garbage collection at the end of a run, then every object left frozen: pytest's own end collects five
    times over (to report exceptions raised in finalizers, its hook still installed during this one), and each
    pass walks the hundreds of thousands of objects TensorFlow's graphs leave in a worker, about a second apiece."""
    gc.collect()
    gc.freeze()


def built_once(tmp_path_factory, worker_id, name, build):
    """The path of an artefact built once per test run and shared by the pytest workers: the first worker to ask
    calls `build(path)` under a lock (and renames its file into place); the others wait, then read it.

    For session fixtures that cost seconds (training): each worker would otherwise build its own. `worker_id` is
    pytest-xdist's fixture ("gw0", ..., or "master" in a run without workers).
    """
    import fcntl

    root = tmp_path_factory.getbasetemp()
    root = root if worker_id == "master" else root.parent  # the workers' folders share this run's folder
    path = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        if not path.exists():
            temporary = path.with_name(f"{os.getpid()}.{name}")
            build(temporary)
            os.replace(temporary, path)
    return path


@pytest.fixture(scope="session")
def multi30k_dir():
    """The Multi30k folder beside the repository (CI has it there too)."""
    if not MULTI30K.is_dir():
        pytest.fail(f"Multi30k data not found at {MULTI30K}; the tests expect ../shared beside the repository.")
    return MULTI30K

# ---------------------------------------------------------------- model core

# ---------------------------------------------------------------- decoding, translation, evaluation (issue 4)
# A tiny model trained briefly on the synthetic copy task (shared by test_decoding, test_translation and
# test_evaluation), and a whitespace word tokenizer with the project's tokenizer interface.

COPY_VOCAB = 32  # ids 0-3 reserved (pad, unk, bos, eos), words 4..31


@pytest.fixture(scope="session")
def trained_copy_model(tmp_path_factory, worker_id):
    """`(model, config)`: the tiny preset after ~4 short epochs of copying (about 60-90% token accuracy).

    Partly trained on purpose: its distributions are peaked enough to be a real model, yet beam
    search still finds better-scoring outputs than greedy decoding for many inputs. Trained once per test run:
    the other pytest workers load its weights (`built_once`).
    """
    import keras

    import keras_transformer as kt
    from keras_transformer.config import recommended_warmup_steps
    from keras_transformer.data.synthetic import make_arrays, synthetic_pairs
    from keras_transformer.experiment import TrainingSection

    config = kt.TransformerConfig.preset("tiny", vocab_size=COPY_VOCAB, dropout=0.0)
    settings = TrainingSection(warmup_steps=recommended_warmup_steps("tiny"))

    def train(path):
        keras.utils.set_random_seed(0)
        model = kt.build_model(config)
        model.compile(optimizer=kt.make_optimizer(config, settings),
                      loss=kt.LabelSmoothedCrossEntropy(settings.label_smoothing, pad_id=config.pad_id),
                      metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
        sources, targets = synthetic_pairs("copy", num_examples=2048, vocab_size=COPY_VOCAB, min_length=3,
                                           max_length=10, seed=0)
        inputs, labels = make_arrays(sources, targets)
        model.fit(inputs, labels, batch_size=64, epochs=4, verbose=0)
        model.save_weights(str(path))

    weights = built_once(tmp_path_factory, worker_id, "trained_copy_model.weights.h5", train)
    model = kt.build_model(config)
    model.load_weights(str(weights))
    return model, config


@pytest.fixture(scope="session")
def relative_copy_model(trained_copy_model):
    """`(model, config)`: the trained copy model with relative positions (Shaw et al., k = 2) instead of sinusoids.

    Its weights are the copy model's and its relative tables seeded noise: no second training, yet its outputs
    are peaked and varied (mostly the source's words, in orders the tables set), and beam search often beats
    greedy on them, unlike a fresh model's, which repeat one word. Sentences of up to 10 words reach far past k.
    Shared by the exports' tests (CTranslate2, LiteRT).
    """
    import numpy as np

    import keras_transformer as kt

    model, config = trained_copy_model
    config = config.replace(position="relative", max_relative_position=2)
    relative = kt.build_model(config)
    trained = {weight.path: weight for weight in model.weights}
    rng = np.random.default_rng(0)
    for weight in relative.weights:
        weight.assign(trained[weight.path] if weight.path in trained
                      else rng.normal(size=weight.shape).astype("float32"))
    assert sum(weight.path not in trained for weight in relative.weights) == 2 * (2 + 2)  # tables per layer
    return relative, config


@pytest.fixture(scope="session")
def shipped_served(tmp_path_factory, worker_id, multi30k_dir):
    """What the shipped EN->DE SavedModel's `serving_default` gives for the first 12 validation and the first 50
    test2016 sentences, served in one call (the compilations of its search paid once per run): `{"val": [...],
    "test": [...]}`, for the tests that compare it with JAX and with the golden file."""
    import json

    def serve(path):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        from keras_transformer.evaluation import read_lines
        val = read_lines(multi30k_dir / "val.en.gz")[:12]
        test = read_lines(multi30k_dir / "test_2016_flickr.en.gz")[:50]
        loaded = tf.saved_model.load(str(REPO_ROOT / "saved_models" / "multi30k_en_de"))
        served = loaded.signatures["serving_default"](tf.constant(val + test))["translation"].numpy()
        texts = [t.decode("utf-8") for t in served]
        path.write_text(json.dumps({"val": texts[:12], "test": texts[12:]}, ensure_ascii=False), encoding="utf-8")

    return json.loads(built_once(tmp_path_factory, worker_id, "shipped_served.json", serve).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def word_tokenizer():
    """A whitespace tokenizer over the words "w4".."w31" (id i <-> "w{i}"), tf.function-friendly."""
    import tensorflow as tf

    class WordTokenizer(tf.Module):
        pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3
        vocab_size = COPY_VOCAB

        def __init__(self):
            super().__init__(name="word_tokenizer")
            self.words = tf.constant(["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, COPY_VOCAB)])
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(self.words, tf.range(COPY_VOCAB, dtype=tf.int32)),
                default_value=self.unk_id)

        def tokenize(self, strings):
            words = tf.strings.split(tf.strings.strip(tf.convert_to_tensor(strings, tf.string)))
            return tf.ragged.map_flat_values(self.table.lookup, words)

        def detokenize(self, ids):
            ids = tf.cast(ids, tf.int32)
            before_eos = tf.math.cumsum(tf.cast(tf.equal(ids, self.eos_id), tf.int32), axis=1) == 0
            keep = before_eos & (ids != self.pad_id) & (ids != self.bos_id)
            words = tf.gather(self.words, tf.ragged.boolean_mask(ids, keep))
            return tf.strings.reduce_join(words, axis=1, separator=" ")

    return WordTokenizer()


@pytest.fixture(scope="session")
def reference_search():
    """`reference_beam_search` (tests/reference_search.py), its uncached decoder pass run as one tf.function per
    model (shapes left dynamic) instead of eagerly: the same written-out search, about 3x faster."""
    import reference_search as module
    import tensorflow as tf

    from keras_transformer.model import decode

    graphs = {}

    def graph_decode(model, prefixes, memory, padding):
        if id(model) not in graphs:  # the model is kept, so that its id is not reused
            graphs[id(model)] = model, tf.function(lambda t, m, p: decode(model, t, m, p), reduce_retracing=True)
        return graphs[id(model)][1](tf.constant(prefixes), memory, padding)

    def search(model, source, **options):
        module.decode = graph_decode
        try:
            return module.reference_beam_search(model, source, **options)
        finally:
            module.decode = decode
    return search

# ---------------------------------------------------------------- data: corpus, tokenizers, pipeline (issue 3)
# The Multi30k En-De training split and a joint BPE vocabulary learned from it (about 1 s), shared by
# test_corpus, test_tokenizers and test_pipeline (and free for other tests that need real subword ids).

MULTI30K_VOCAB = 8000


@pytest.fixture(scope="session")
def multi30k_train_pairs(multi30k_dir):
    """`(english, german, summary)`: the 29,000 training pairs as lists of str."""
    from keras_transformer.data.corpus import read_parallel_corpus

    return read_parallel_corpus(multi30k_dir / "train.en.gz", multi30k_dir / "train.de.gz")


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_train_pairs):
    """A shared En+De SentencePiece BPE tokenizer of 8,000 ids learned from the whole training split."""
    from keras_transformer.data.tokenizers import SubwordTokenizer

    english, german, _ = multi30k_train_pairs
    return SubwordTokenizer.train(english + german, MULTI30K_VOCAB, model_type="bpe")


@pytest.fixture(scope="session")
def multi30k_tokenizer_dir(multi30k_tokenizer, tmp_path_factory):
    """A folder holding `multi30k_tokenizer` as `save_tokenizers` writes a shared vocabulary."""
    from keras_transformer.data.tokenizers import save_tokenizers

    directory = tmp_path_factory.mktemp("multi30k_tokenizer")
    save_tokenizers(directory, multi30k_tokenizer, multi30k_tokenizer)
    return directory


# ---------------------------------------------------------------- packed arrays (test_arrays, test_jax_backend)
# A small packed workdir: the input of keras-transformer train-packed, which trains on any Keras backend.


@pytest.fixture(scope="session")
def packed(tmp_path_factory, multi30k_dir):
    """`(workdir, counts, folder)`: 400 Multi30k training and 40 validation pairs packed (shared vocabulary of 600)
    for the tiny preset with one layer each side (half the time Keras spends tracing a training step).

    Read-only: tests that train take a fresh copy (`copy_packed`); tests that only need the text files use `folder`.
    """
    import gzip

    from keras_transformer import training

    folder = tmp_path_factory.mktemp("packed")
    for split, count in (("train", 400), ("val", 40)):
        for lang in ("en", "de"):
            with gzip.open(multi30k_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(count)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    experiment = {
        "model": {"preset": "tiny", "num_layers": 1, "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "valid_source": str(folder / "val.en"), "valid_target": str(folder / "val.de"),
                 "vocab_size": 600, "tokens_per_batch": 512, "max_length": 64},
        "training": {"warmup_steps": 20, "epochs": 2, "seed": 3},
        "decoding": {"average_last": 2},
    }
    workdir = folder / "run"
    counts = training.pack_arrays(experiment, workdir)
    return workdir, counts, folder


@pytest.fixture
def copy_packed(packed, tmp_path):
    """`copy_packed(name)`: a fresh copy of the packed workdir in this test's folder, without any run's
    checkpoints, backup, history or average (none should be there: `packed` is read-only)."""
    import shutil

    def copy(name="run"):
        return shutil.copytree(packed[0], tmp_path / name,
                               ignore=shutil.ignore_patterns("checkpoints", "backup", "history.csv",
                                                             "averaged.weights.h5"))
    return copy

# ---------------------------------------------------------------- serving (test_serve, test_serve_load)
# One `keras-transformer serve` process for both files (TensorFlow's import, the model's load and its warm-up cost
# tens of seconds on 2 cores): the shipped EN-DE export served as version 1 of a base folder of numbered versions,
# with a queue of 4 batches of 16 sentences. Both files are one xdist_group, run in collection order on one
# worker; the last test of test_serve_load.py swaps in version 2 and the one after it ends the server by SIGTERM.

SERVE_NAME = "en_de"
SERVE_LIMITS = {"max_batch": 16, "max_queue": 64, "max_sentences": 40, "max_sentence_chars": 300,
                "max_body_bytes": 20_000}


@pytest.fixture(scope="session")
def serve_base(tmp_path_factory):
    """The server's base folder of versions: `1` links to saved_models/multi30k_en_de."""
    folder = tmp_path_factory.mktemp("versions") / SERVE_NAME
    folder.mkdir()
    (folder / "1").symlink_to(REPO_ROOT / "saved_models" / "multi30k_en_de")
    return folder


@pytest.fixture(scope="session")
def served(serve_base, tmp_path_factory):
    """The running server (`factories.ServeProcess`), ready; killed at the end of the session if still running."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from factories import ServeProcess

    arguments = ["--model", str(serve_base), "--name", SERVE_NAME, "--batch-wait-ms", "20", "--poll-seconds", "0.5"]
    for name, value in SERVE_LIMITS.items():
        arguments += ["--" + name.replace("_", "-"), str(value)]
    server = ServeProcess.start(arguments, tmp_path_factory.mktemp("serve") / "server.log", SERVE_NAME)
    try:
        yield server
    finally:
        server.stop()
