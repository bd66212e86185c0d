"""Shared test fixtures. Each part of the package keeps its fixtures in its own marked section."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"


# A test that is not marked slow fails when its call takes longer than this (setup, where shared fixtures are
# built, is not counted). `make test-fast` skips the slow ones, so the edit-test loop stays under 3 minutes.
SLOW_LIMIT_S = float(os.environ.get("KT_SLOW_LIMIT_S", "15"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.when == "call" and report.passed and item.get_closest_marker("slow") is None
            and report.duration > SLOW_LIMIT_S):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {report.duration:.1f} s, over the {SLOW_LIMIT_S:g} s allowed a test "
                           "not marked slow: make it cheaper (tests/README.md) or mark it @pytest.mark.slow")


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
def trained_copy_model():
    """`(model, config)`: the tiny preset after ~4 short epochs of copying (about 60-90% token accuracy).

    Partly trained on purpose: its distributions are peaked enough to be a real model, yet beam
    search still finds better-scoring outputs than greedy decoding for many inputs.
    """
    import keras

    import keras_transformer as kt
    from keras_transformer.data.synthetic import make_arrays, synthetic_pairs

    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.preset("tiny", vocab_size=COPY_VOCAB, dropout=0.0)
    model = kt.build_model(config)
    model.compile(optimizer=kt.make_optimizer(config),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
                  metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
    sources, targets = synthetic_pairs("copy", num_examples=2048, vocab_size=COPY_VOCAB, min_length=3,
                                       max_length=10, seed=0)
    inputs, labels = make_arrays(sources, targets)
    model.fit(inputs, labels, batch_size=64, epochs=4, verbose=0)
    return model, config


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
# A small packed workdir: the input of keras_transformer.arrays, which trains on any Keras backend.


@pytest.fixture(scope="session")
def packed(tmp_path_factory, multi30k_dir):
    """`(workdir, counts, folder)`: 400 Multi30k training and 40 validation pairs packed (shared vocabulary of 600).

    Tests that train take a fresh copy (`copy_packed`): this one is shared by the session.
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
        "model": {"preset": "tiny", "dropout": 0.0, "warmup_steps": 20},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "valid_source": str(folder / "val.en"), "valid_target": str(folder / "val.de"),
                 "vocab_size": 600, "tokens_per_batch": 512, "max_length": 64},
        "training": {"epochs": 2, "seed": 3},
        "decoding": {"average_last": 2},
    }
    workdir = folder / "run"
    counts = training.pack_arrays(experiment, workdir)
    return workdir, counts, folder


@pytest.fixture
def copy_packed(packed, tmp_path):
    """`copy_packed(name)`: a fresh copy of the packed workdir in this test's folder, without any run's
    checkpoints, backup or history (other tests train the shared one)."""
    import shutil

    def copy(name="run"):
        return shutil.copytree(packed[0], tmp_path / name,
                               ignore=shutil.ignore_patterns("checkpoints", "backup", "history.csv"))
    return copy
