"""Packing token ids and training from them (keras_transformer.packed.training, keras-transformer train-packed), and
translating them without TensorFlow (keras_transformer.packed.scoring): the path to a GPU machine without TensorFlow."""

import csv

import keras
import numpy as np
import pytest
from factories import backup_weights, noam_learning_rates, sigterm_at_update

from keras_transformer import cli, load_translator, training
from keras_transformer.engines.packed import sentencepiece_processors
from keras_transformer.errors import ConfigError
from keras_transformer.packed import scoring as arrays
from keras_transformer.packed.data import (
    ARRAYS_FILE,
    arrays_path,
    arrays_to_ragged,
    load_arrays,
    make_batches,
    save_arrays,
)
from keras_transformer.packed.training import PackedBatches, packed_data, packed_experiment, train_arrays
from keras_transformer.trainer.backup import resumed_seed

# Its module fixtures are expensive: `make test` (--dist loadgroup) runs the whole file on one worker, so they
# are built once.
pytestmark = pytest.mark.xdist_group("test_arrays")


def _rows(batch):
    """Each row of a (source, target_input, labels) batch without its padding, as a tuple of tuples."""
    source, target_input, labels = (np.asarray(a) for a in batch)
    return [tuple(tuple(int(v) for v in side[i][side[i] != 0]) for side in (source, target_input, labels))
            for i in range(len(source))]


def test_batches_hold_every_pair_once_within_the_budget():
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 50, rng.integers(1, 30)) for _ in range(300)]
    targets = [rng.integers(4, 50, rng.integers(1, 30)) for _ in range(300)]
    batches = make_batches(sources, targets, 256, length_multiple=8, rng=np.random.default_rng(1))
    rows = [row for batch in batches for row in _rows(batch)]
    expected = [(tuple(s) + (3,), (2,) + tuple(t), tuple(t) + (3,)) for s, t in zip(sources, targets)]
    assert sorted(rows) == sorted(expected)  # every pair exactly once, eos / bos where the pipeline puts them
    widths = {b[0].shape[1] for b in batches}
    assert all(w % 8 == 0 for w in widths) and len(widths) <= 4  # few shapes: 8, 16, 24, 32
    for source, target_input, labels in batches:
        assert source.shape == target_input.shape == labels.shape
        assert source.shape[0] <= 256 // source.shape[1]  # the token budget, padding included
        longest = max(np.count_nonzero(source, 1).max(), np.count_nonzero(labels, 1).max())
        assert source.shape[1] - 8 < longest <= source.shape[1]  # the narrowest multiple of 8 that fits
    # A width's leftover pairs start the next batch: no width ends with its own small batch.
    fill = [len(b[0]) * b[0].shape[1] / 256 for b in batches]
    assert sum(f < 0.5 for f in fill) <= 1 and sum(f < 0.85 for f in fill) <= 2, sorted(fill)[:5]
    # Another seed gives another order; no seed gives a fixed one.
    assert [b[0].tolist() for b in make_batches(sources, targets, 256)] == \
           [b[0].tolist() for b in make_batches(sources, targets, 256)]
    other = make_batches(sources, targets, 256, rng=np.random.default_rng(2))
    assert [b[0].tolist() for b in other] != [b[0].tolist() for b in batches]


def test_padded_rows_give_one_shape_per_width_and_the_same_loss():
    rng = np.random.default_rng(4)
    sources = [rng.integers(4, 50, rng.integers(1, 20)) for _ in range(100)]
    targets = [rng.integers(4, 50, rng.integers(1, 20)) for _ in range(100)]
    plain = make_batches(sources, targets, 128)
    padded = make_batches(sources, targets, 128, pad_rows=True)
    assert any(len(p[0]) < 128 // p[0].shape[1] for p in plain)  # some batches hold fewer rows than their width allows
    assert len({b[0].shape for b in padded}) == len({b[0].shape[1] for b in padded})  # one shape per width
    assert [_rows(b)[:len(p[0])] for b, p in zip(padded, plain)] == [_rows(p) for p in plain]
    assert all(not np.any(b[i][len(p[0]):]) for b, p in zip(padded, plain) for i in range(3))  # the rest is padding
    # The loss and the accuracy ignore the padding rows.
    from keras_transformer import LabelSmoothedCrossEntropy, TransformerConfig, build_model
    from keras_transformer.trainer.metrics import MaskedAccuracy
    model = build_model(TransformerConfig.preset("tiny", vocab_size=50, dropout=0.0))
    model.compile(loss=LabelSmoothedCrossEntropy(0.1), metrics=[MaskedAccuracy()])
    partial = next(i for i, (b, p) in enumerate(zip(padded, plain)) if len(b[0]) > len(p[0]))
    logs = [model.test_on_batch({"source": b[0], "target": b[1]}, b[2], return_dict=True)
            for b in (plain[partial], padded[partial])]
    assert logs[0]["loss"] == pytest.approx(logs[1]["loss"], rel=1e-5)
    assert logs[0]["masked_accuracy"] == pytest.approx(logs[1]["masked_accuracy"], abs=1e-6)


def test_epochs_of_steps_per_epoch_batches_cut_one_stream_of_passes_and_resume_at_any_batch():
    """With `steps_per_epoch` an epoch takes the next batches of an unbroken stream of passes (pass k shuffled by
    `resumed_seed(seed, k)`, as the epochs of one pass each are): no batch of a pass is skipped or served twice
    where an epoch ends, and a run resumed at any batch of any epoch serves the batches the uninterrupted run
    would have served."""
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 50, rng.integers(1, 12)) for _ in range(80)]
    targets = [rng.integers(4, 50, rng.integers(1, 12)) for _ in range(80)]

    def sources_of(batches):
        return [np.asarray(b[0]["source"] if isinstance(b[0], dict) else b[0]).tolist() for b in batches]

    per_pass = len(PackedBatches(sources, targets, 64, seed=5))
    passes = [sources_of(PackedBatches(sources, targets, 64, seed=5).batches(k)) for k in range(3)]
    assert per_pass > 6 and passes[0] != passes[1]
    steps = per_pass // 2 + 1  # epoch 2 ends inside the second pass, epoch 4 inside the third
    batches = PackedBatches(sources, targets, 64, seed=5, steps_per_epoch=steps)
    assert len(batches) == steps
    epochs = [sources_of(batches.batches(epoch)) for epoch in range(5)]
    assert sum(epochs, []) == sum(passes, [])[:5 * steps]
    for epoch, done in ((1, 2), (3, steps - 1), (4, 1)):
        resumed = PackedBatches(sources, targets, 64, seed=5, steps_per_epoch=steps, resumed_at=(epoch, done))
        resumed.callback.on_epoch_begin(epoch)  # what `fit` reads: the epoch's rest, then the next epoch whole
        assert sources_of(resumed[i] for i in range(steps - done)) == epochs[epoch][done:]
        resumed.callback.on_epoch_begin(epoch + 1)
        assert sources_of(resumed[i] for i in range(steps)) == sources_of(batches.batches(epoch + 1))


def test_batches_reject_bad_input():
    with pytest.raises(ValueError, match="2 source but 1 target"):
        make_batches([[4], [5]], [[6]], 64)
    with pytest.raises(ValueError, match="more than tokens_per_batch=16"):
        make_batches([list(range(4, 30))], [[5]], 16)
    assert make_batches([], [], 64) == []


def test_packed_arrays_round_trip_and_name_missing_files(tmp_path):
    sequences = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])]
    save_arrays(tmp_path / "arrays", {"train": (sequences, sequences[::-1])})
    loaded = load_arrays(tmp_path / "arrays")
    assert [s.tolist() for s in loaded["train"][0]] == [[5, 6, 7], [8], [9, 10]]
    assert [s.tolist() for s in loaded["train"][1]] == [[9, 10], [8], [5, 6, 7]]
    assert "valid" not in loaded
    with pytest.raises(FileNotFoundError, match="keras-transformer pack"):
        load_arrays(tmp_path / "missing")
    with pytest.raises(ValueError, match="lengths add up to 3"):
        arrays_to_ragged(np.array([1, 2]), np.array([1, 2]))


def test_pack_writes_the_pairs_the_vocabulary_reads_back(packed):
    from keras_transformer.data import tokenizers
    workdir, counts, folder = packed
    assert (workdir / "model.yaml").is_file() and (workdir / "data" / "vocab").is_dir()
    splits = load_arrays(workdir / ARRAYS_FILE)
    source_tokenizer, target_tokenizer = tokenizers.load_tokenizers(workdir / "data" / "vocab")
    # Training pairs with a side over max_length - 1 = 63 tokens are dropped, as the training pipeline does;
    # validation pairs are all kept (truncated if needed).
    lengths = [source_tokenizer.tokenize((folder / f"train.{lang}").read_text(encoding="utf-8").splitlines())
               .row_lengths().numpy() for lang in ("en", "de")]
    fitting = int(np.sum(np.maximum(*lengths) <= 63))
    assert 300 < fitting < 400  # the small vocabulary makes some sentences long
    assert counts["train_pairs"] == len(splits["train"][0]) == fitting and counts["valid_pairs"] == 40
    # The stored ids decode to the original sentences (SentencePiece is lossless on this text).
    originals = (folder / "val.de").read_text(encoding="utf-8").splitlines()
    ids = splits["valid"][1]
    width = max(len(s) for s in ids)
    padded = np.zeros((len(ids), width + 1), np.int32)
    for i, s in enumerate(ids):
        padded[i, :len(s)] = s
        padded[i, len(s)] = 3  # eos
    decoded = [t.decode("utf-8") for t in target_tokenizer.detokenize(padded).numpy()]
    truncated = [i for i, s in enumerate(ids) if len(s) == 63]
    assert len(truncated) < 10
    for i, (text, original) in enumerate(zip(decoded, originals)):
        if i in truncated:  # an over-long validation side is cut at 63 tokens: a prefix of the sentence
            assert original.startswith(text) and len(text) < len(original.strip())
        else:
            assert text == original.strip()
    assert counts["train_target_tokens"] == sum(len(t) + 1 for t in splits["train"][1])



def test_training_reads_the_packed_ids_through_a_memory_map_and_an_unreleased_arrays_npz_is_named(packed,
                                                                                                   copy_packed):
    from keras_transformer.packed.data import OLD_ARRAYS_FILE, PackedSequences, ragged_to_arrays
    workdir = copy_packed()
    experiment = packed_experiment(workdir)
    _, batches = packed_data(workdir, experiment)
    sources, targets = batches._pairs
    assert isinstance(sources, PackedSequences) and isinstance(sources.values, np.memmap)  # ids stay on disk
    assert isinstance(targets.values, np.memmap) and str(sources.values.filename).endswith("train_source_values.npy")
    # the batches gathered per step from the map are those make_batches forms from the pairs in memory
    lists = [[np.array(s) for s in side] for side in (sources, targets)]
    expected = make_batches(*lists, batches.tokens_per_batch, rng=np.random.default_rng(resumed_seed(3, 0)),
                            pad_rows=True)
    assert [[a.tolist() for a in b] for b in batches.batches(0)] == [[a.tolist() for a in b] for b in expected]
    # A folder packed in the unreleased format (one arrays.npz) gets one line saying to pack it again.
    splits = load_arrays(workdir)
    import shutil
    shutil.rmtree(workdir / ARRAYS_FILE)
    old = {f"{split}_{side}_{part}": array for split, pair in splits.items() for side, sequences in
           zip(("source", "target"), pair) for part, array in zip(("values", "lengths"), ragged_to_arrays(sequences))}
    np.savez_compressed(workdir / OLD_ARRAYS_FILE, **old)
    message = (rf"^{workdir / OLD_ARRAYS_FILE} was packed by an unreleased version of keras_transformer, which is no "
               rf"longer read: run `keras-transformer pack --config \.\.\. --workdir {workdir}` again\.$")
    with pytest.raises(FileNotFoundError, match=message):
        packed_data(workdir, packed_experiment(workdir))
    with pytest.raises(FileNotFoundError, match=message):
        load_arrays(workdir / OLD_ARRAYS_FILE)
    assert arrays_path(workdir) is None  # what the loader reads as a packed workdir


def test_pack_reads_only_the_first_max_train_pairs_and_refuses_weighted_corpora(packed, tmp_path):
    """docs/data.md: `data.max_train_pairs` holds for every pass, `pack`'s included; a mixture of corpora has no
    end, which one fixed set of arrays cannot hold."""
    import shutil

    workdir, counts, folder = packed
    experiment = packed_experiment(workdir).to_dict()
    experiment["data"]["max_train_pairs"] = 100
    shutil.copytree(workdir / "data", tmp_path / "run" / "data")  # the same vocabulary
    capped = training.pack_arrays(experiment, tmp_path / "run")
    assert counts["train_pairs"] > 100 and 0 < capped["train_pairs"] <= 100
    assert capped["valid_pairs"] == counts["valid_pairs"]  # validation is not capped
    first = load_arrays(workdir)["train"]
    kept = load_arrays(tmp_path / "run")["train"]
    assert [ids.tolist() for ids in kept[0]] == [ids.tolist() for ids in first[0][:len(kept[0])]]  # the first pairs
    mixed = packed_experiment(workdir).to_dict()
    data = mixed["data"]
    data["corpora"] = [{"name": "a", "source": data.pop("train_source"), "target": data.pop("train_target")}]
    with pytest.raises(ConfigError, match="pack writes one fixed set of pairs.*data.corpora"):
        training.pack_arrays(mixed, tmp_path / "mixed")


def test_pack_streams_the_corpus_a_chunk_at_a_time(packed, tmp_path, monkeypatch):
    from keras_transformer.data import pipeline
    workdir, counts, folder = packed
    tokenized, tokenize = [], pipeline.tokenize_corpus
    monkeypatch.setattr(pipeline, "tokenize_corpus", lambda tok, texts: (tokenized.append(len(texts)),
                                                                         tokenize(tok, texts))[1])
    monkeypatch.setattr(training, "PACK_CHUNK", 64)
    experiment = packed_experiment(workdir)  # the packed fixture's experiment, its vocabulary copied
    import shutil
    shutil.copytree(workdir / "data", tmp_path / "run" / "data")
    assert training.pack_arrays(experiment, tmp_path / "run") == counts
    assert max(tokenized) <= 64 and sum(tokenized) == 2 * (400 + 40)  # never more than a chunk at once
    chunked, whole = load_arrays(tmp_path / "run"), load_arrays(workdir)
    for split in ("train", "valid"):
        for side in (0, 1):
            assert [s.tolist() for s in chunked[split][side]] == [s.tolist() for s in whole[split][side]]
    from keras_transformer.files import is_temporary
    assert not [p.name for p in (tmp_path / "run").iterdir() if is_temporary(p.name)]  # no staging folder left

@pytest.fixture(scope="module")
def trained(packed, tmp_path_factory):
    """A copy of the packed workdir trained by `train_arrays` for 2 epochs, then resumed to a third: `(workdir,
    first, second, seeds, history_after_first)`, the two calls' results, the seeds each call gave
    `keras.utils.set_random_seed`, and history.csv's rows after the first call. Read-only (several tests use it)."""
    import shutil
    workdir = shutil.copytree(packed[0], tmp_path_factory.mktemp("trained") / "run")
    seeds, set_random_seed = [], keras.utils.set_random_seed
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(keras.utils, "set_random_seed",
                            lambda seed: (seeds.append(seed), set_random_seed(seed)))
        first = train_arrays(workdir, epochs=2, jit_compile=False)
        with open(workdir / "history.csv", encoding="utf-8") as f:
            history_after_first = list(csv.DictReader(f))
        # Running again with more epochs resumes after epoch 2.
        second = train_arrays(workdir, epochs=3, jit_compile=False)
    return workdir, first, second, seeds, history_after_first


@pytest.mark.slow
def test_train_arrays_trains_resumes_and_feeds_the_workdir_commands(trained):
    """Slow: reads a packed run of three real epochs (the `trained` fixture); resume, history and averaging need
    epochs."""
    workdir, first, second, seeds, _ = trained
    assert [p.name for p in first["checkpoints"]] == ["ckpt-0001.weights.h5", "ckpt-0002.weights.h5"]
    assert first["average"] == workdir / "averaged.weights.h5"  # the file `keras-transformer average` writes
    # Running again with more epochs resumes after epoch 2: one more epoch, the update count goes on.
    assert [p.name for p in second["checkpoints"]] == ["ckpt-0003.weights.h5"]
    # The resumed run seeds its dropout apart from the first run's, which it would otherwise repeat.
    assert seeds == [3, resumed_seed(3, 2)] and seeds[1] != 3
    with open(workdir / "history.csv", encoding="utf-8") as f:
        history = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in history] == [1, 2, 3]
    per_epoch = first["updates"] // 2
    assert [int(r["step"]) for r in history] == [per_epoch, 2 * per_epoch, 3 * per_epoch]
    losses = [float(r["loss"]) for r in history]
    assert losses[2] < losses[0] and float(history[2]["val_loss"]) < float(history[0]["val_loss"])
    # The workdir serves the TensorFlow-side commands: the averaged weights translate through load_translator.
    translator = load_translator(workdir, checkpoint=second["average"], beam_size=2)
    assert len(translator(["A man is riding a bike.", "Two dogs."])) == 2
    # The average is the mean of the last two epoch checkpoints.
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model
    model = build_model(TransformerConfig.from_yaml(workdir / "model.yaml"))
    checkpoints = [workdir / "checkpoints" / f"ckpt-000{i}.weights.h5" for i in (2, 3)]
    weights = []
    for path in checkpoints + [second["average"]]:
        model.load_weights(str(path))
        weights.append(model.get_weights())
    for a, b, mean in zip(*weights):
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_packed_fine_tuning_run_takes_the_checkpoint_s_vocabulary_weights_and_update_count(packed, copy_packed,
                                                                                                 tmp_path):
    """training.init_checkpoint and training.initial_updates in the packed experiment: pack takes the vocabulary
    of the run that wrote the weights (not one learned at the config's size), and train_arrays starts from those
    weights and that update count without being told again."""
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model
    folder = packed[2]
    start = copy_packed("start")  # a packed run, vocabulary 600, and a checkpoint of its model
    model = build_model(TransformerConfig.from_yaml(start / "model.yaml"))
    (start / "checkpoints").mkdir()
    checkpoint = start / "checkpoints" / "ckpt-0001.weights.h5"
    model.save_weights(str(checkpoint))
    scale = 1e-9  # too small a learning rate to move the weights: the run must end where it started
    experiment = {
        "model": {"preset": "tiny", "num_layers": 1, "dropout": 0.0},
        "data": {"kind": "text", "train_source": str(folder / "train.en"), "train_target": str(folder / "train.de"),
                 "valid_source": str(folder / "val.en"), "valid_target": str(folder / "val.de"),
                 "vocab_size": 300, "tokens_per_batch": 512, "max_length": 64},
        "training": {"warmup_steps": 20, "learning_rate_scale": scale, "epochs": 1, "seed": 3,
                     "init_checkpoint": str(checkpoint), "initial_updates": 40},
    }
    training.pack_arrays(experiment, tmp_path / "tuned")
    tuned = tmp_path / "tuned"
    assert [p.read_bytes() for p in sorted((tuned / "data" / "vocab").iterdir())] == \
        [p.read_bytes() for p in sorted((start / "data" / "vocab").iterdir())]
    assert TransformerConfig.from_yaml(tuned / "model.yaml").vocab_size == 600
    result = train_arrays(tuned, jit_compile=False, average_last=0)
    model_after = build_model(TransformerConfig.from_yaml(tuned / "model.yaml"))
    model_after.load_weights(str(result["checkpoints"][-1]))
    for before, after in zip(model.get_weights(), model_after.get_weights()):
        np.testing.assert_allclose(after, before, atol=1e-5)
    with open(tuned / "history.csv", encoding="utf-8") as f:
        row = next(csv.DictReader(f))
    step = int(row["step"])  # the optimizer's count: the 40 given, then this run's
    assert step == 40 + result["updates"]
    d_model = model.get_layer("shared_embedding").embeddings.shape[1]
    expected = scale * d_model ** -0.5 * min(step ** -0.5, step * 20 ** -1.5)
    assert float(row["learning_rate"]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_cooldown_epochs_bring_the_learning_rate_linearly_to_zero_at_the_last_update(copy_packed):
    """Slow: the learning rate is read from three trained epochs' history, the only place the cooldown shows."""
    from keras_transformer.config import TransformerConfig
    workdir = copy_packed()
    too_long = r"training.cooldown_epochs \(3\) is more than training.epochs \(2\)"
    with pytest.raises(ConfigError, match=too_long):
        train_arrays(workdir, epochs=2, cooldown_epochs=3, jit_compile=False)
    import yaml
    experiment = yaml.safe_load((workdir / "experiment.yaml").read_text(encoding="utf-8"))
    assert "cooldown_epochs" in experiment["training"]  # pack writes the key, which is the default here
    experiment["training"]["cooldown_epochs"] = 3
    (workdir / "experiment.yaml").write_text(yaml.safe_dump(experiment), encoding="utf-8")
    with pytest.raises(ConfigError, match=too_long):
        train_arrays(workdir, epochs=2, jit_compile=False)  # the file's own 3, the call's 2
    _set_training(workdir, cooldown_epochs=2)  # a file that `train` could not read either is refused, file named
    train_arrays(workdir, epochs=3, cooldown_epochs=2, initial_updates=50, jit_compile=False,
                 average_last=None)
    with open(workdir / "history.csv", encoding="utf-8") as f:
        history = list(csv.DictReader(f))
    updates = [int(r["step"]) for r in history]  # after each epoch, counted from 50
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    settings = packed_experiment(workdir).training
    start, end = updates[0], updates[2]  # the cooldown spans epochs 2 and 3

    def expected(step):
        noam = settings.learning_rate_scale * config.d_model ** -0.5 * min(step ** -0.5,
                                                                           step * settings.warmup_steps ** -1.5)
        return noam * min(max((end - step) / (end - start), 0.0), 1.0)
    assert updates[0] > 50 and [float(r["learning_rate"]) for r in history] == pytest.approx(
        [expected(u) for u in updates], rel=1e-5, abs=1e-12)
    assert float(history[1]["learning_rate"]) > 0 and float(history[2]["learning_rate"]) == 0.0


def test_train_arrays_names_a_workdir_that_was_not_packed(tmp_path):
    with pytest.raises(FileNotFoundError, match="keras-transformer pack"):
        train_arrays(tmp_path)


def test_command_line_reports_bad_input_without_a_traceback(tmp_path, capsys):
    for argv in ([str(tmp_path)], [str(tmp_path), "--evaluate", "src.txt", "ref.txt"]):
        assert cli.main(["train-packed", *argv]) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err
    assert "is not a model folder" in err


def test_pack_command_refuses_data_without_text(tmp_path, capsys):
    import pathlib

    from keras_transformer import cli
    tiny = pathlib.Path(__file__).resolve().parents[1] / "configs" / "tiny_copy.yaml"  # synthetic data
    status = cli.main(["pack", "--config", str(tiny), "--workdir", str(tmp_path / "run")])
    assert status == 2
    assert "pack needs data.kind: text" in capsys.readouterr().err


@pytest.mark.parametrize("setting, message", [
    ("data.subword_dropout=0.1", "data.subword_dropout=0.1: packed arrays hold one fixed segmentation"),
    ("training.rdrop_alpha=5", "training.rdrop_alpha=5: training from packed arrays"),
])
def test_pack_command_refuses_options_arrays_cannot_train(tmp_path, capsys, setting, message):
    import pathlib

    from keras_transformer import cli
    recipe = pathlib.Path(__file__).resolve().parents[1] / "configs" / "multi30k_en_de.yaml"
    status = cli.main(["pack", "--config", str(recipe), "--workdir", str(tmp_path / "run"), "--set", setting])
    assert status == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "data" / "vocab").exists()  # refused before any vocabulary work


@pytest.mark.slow
def test_train_packed_script_trains_side_by_side_and_averages(copy_packed, trained, tmp_path):
    """Slow: runs examples/train_packed.sh itself, three training processes under a time limit, as users run it."""
    import os
    import pathlib
    import shutil
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    copies = [copy_packed("a"), copy_packed("b")]
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(root), KERAS_BACKEND="tensorflow",
               ARRAYS_OPTIONS="--no-jit")
    # A time limit stops a run between epochs: what finished is kept and averaged; rerunning resumes. Run on a
    # workdir that finished 3 of its epochs (the `trained` run, its average removed), beside the two runs below.
    finished = shutil.copytree(trained[0], tmp_path / "finished")
    (finished / "averaged.weights.h5").unlink()
    limited = subprocess.Popen(["bash", str(root / "examples" / "train_packed.sh"), "50", "1", "2", str(finished)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        done = subprocess.run(["bash", str(root / "examples" / "train_packed.sh"), "2", "600", "2",
                               *map(str, copies)], env=env, capture_output=True, text=True, timeout=900)
        limited_output = limited.communicate(timeout=900)
    finally:
        if limited.poll() is None:
            limited.kill()
            limited.wait()
    assert done.returncode == 0, done.stdout + done.stderr
    for copy in copies:
        with open(copy / "history.csv", encoding="utf-8") as f:
            assert [int(r["epoch"]) for r in csv.DictReader(f)] == [1, 2]
        assert (copy / "averaged.weights.h5").is_file()
    assert limited.returncode == 0, "".join(limited_output)
    with open(finished / "history.csv", encoding="utf-8") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [1, 2, 3]
    assert (finished / "averaged.weights.h5").is_file()
    bad = subprocess.run(["bash", str(root / "examples" / "train_packed.sh"), "1", "10", "1", str(tmp_path)],
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a packed workdir" in bad.stderr


@pytest.mark.slow
def test_scoring_without_tensorflow_matches_the_translator(packed, trained, tmp_path, capsys):
    """Slow: decodes a trained model twice, with the TensorFlow Translator and without TensorFlow, and compares."""
    from keras_transformer.data import tokenizers
    from keras_transformer.evaluation import read_lines
    folder = packed[2]
    copy, checkpoint = trained[0], trained[2]["checkpoints"][-1]  # the trained run's newest epoch checkpoint
    # 12 sentences and max_extra 8: a barely trained model's translations run to the length limit, and each decoder
    # below would spend half a minute on all 40 at the default of 50 extra tokens.
    for lang in ("en", "de"):
        (tmp_path / f"val.{lang}").write_text("".join(f"{line}\n" for line in read_lines(folder / f"val.{lang}")[:12]),
                                              encoding="utf-8")
    folder = tmp_path
    lines = read_lines(folder / "val.en")
    assert len(lines) == 12
    # SentencePiece through the `sentencepiece` package gives the ids of the tensorflow-text tokenizer.
    source_processor, target_processor = sentencepiece_processors(copy / "data" / "vocab")
    tokenizer, _ = tokenizers.load_tokenizers(copy / "data" / "vocab")
    assert [source_processor.encode(line) for line in lines] == tokenizer.tokenize(lines).to_list()
    # Same translations as the TensorFlow Translator.
    translator = load_translator(copy, checkpoint=checkpoint, beam_size=2, alpha=0.6, max_extra=8)
    expected = translator(lines + ["   "])
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model
    model = build_model(TransformerConfig.from_yaml(copy / "model.yaml"))
    model.load_weights(str(checkpoint))
    got = arrays.translate_lines(model, lines + ["   "], source_processor, target_processor, beam_size=2, alpha=0.6,
                                 max_extra=8, batch_size=16)
    assert got[-1] == "" and sum(a == b for a, b in zip(got, expected)) >= len(lines) - 1
    with pytest.raises(FileNotFoundError, match="Checkpoint not found"):
        arrays.evaluate_arrays(copy, copy / "missing.weights.h5", folder / "val.en", folder / "val.de")
    # The command line (evaluate_arrays with the newest epoch checkpoint) writes those translations and prints the
    # scores evaluate_translations gives them.
    import json

    from keras_transformer.evaluation import evaluate_translations, one_line
    assert cli.main(["train-packed", str(copy), "--evaluate", str(folder / "val.en"), str(folder / "val.de"),
                     "--beam-size", "2", "--alpha", "0.6", "--max-extra", "8",
                     "--output", str(tmp_path / "hyp.txt")]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    hypotheses = read_lines(tmp_path / "hyp.txt")
    assert hypotheses == [one_line(line) for line in got[:-1]]
    scores = evaluate_translations(hypotheses, read_lines(folder / "val.de"))
    assert printed == {k: round(v, 2) for k, v in scores.items()}
    assert scores["bleu"] == pytest.approx(evaluate_translations(expected[:-1], read_lines(folder / "val.de"))["bleu"],
                                           abs=0.5)


def _set_training(workdir, **values):
    """Changes fields of the training section of a packed workdir's experiment.yaml (None deletes one)."""
    import yaml
    experiment = yaml.safe_load((workdir / "experiment.yaml").read_text(encoding="utf-8"))
    for key, value in values.items():
        if value is None:
            experiment["training"].pop(key, None)
        else:
            experiment["training"][key] = value
    (workdir / "experiment.yaml").write_text(yaml.safe_dump(experiment), encoding="utf-8")


def test_the_packed_path_reads_the_experiment_with_train_s_defaults(copy_packed):
    """A key the workdir's experiment.yaml lacks takes the `train` command's default (TrainingSection's), not
    another one of the packed path's own."""
    from keras_transformer.experiment import TrainingSection, load_experiment
    workdir = copy_packed()
    _set_training(workdir, seed=None, epochs=None)
    experiment = packed_experiment(workdir)
    assert (experiment.training.seed, experiment.training.epochs) == (1234, 10)
    assert experiment == load_experiment(workdir / "experiment.yaml")
    assert (experiment.training.seed, experiment.training.epochs) == (TrainingSection().seed, TrainingSection().epochs)
    # Arguments replace the fields they name, and nothing else.
    changed = packed_experiment(workdir, epochs=3, seed=7, tokens_per_batch=1024, cooldown_epochs=0)
    assert (changed.training.epochs, changed.training.seed, changed.data.data_config().tokens_per_batch) == (3, 7, 1024)
    assert changed.training.cooldown_epochs is None and changed.model == experiment.model


@pytest.mark.parametrize("setting, value, message", [
    ("strategy", "mirrored", "training.strategy='mirrored': training from packed arrays runs on one device"),
    ("communication", "ring", "training.communication='ring': training from packed arrays runs on one device"),
    ("rdrop_alpha", 5, "training.rdrop_alpha=5: training from packed arrays does not implement R-Drop"),
])
def test_settings_the_packed_path_cannot_apply_are_refused_by_name(copy_packed, setting, value, message):
    workdir = copy_packed()
    _set_training(workdir, **{setting: value})
    with pytest.raises(ConfigError, match=message):
        train_arrays(workdir, jit_compile=False)
    assert not (workdir / "checkpoints").exists()


@pytest.mark.slow
def test_clipnorm_and_gradient_accumulation_apply_on_the_packed_path(copy_packed, monkeypatch):
    """training.clipnorm and training.gradient_accumulation_steps reach the optimizer as `train` builds it."""
    from keras_transformer.config import TransformerConfig
    from keras_transformer.trainer import loop
    from keras_transformer.trainer.optimizers import make_optimizer
    workdir = copy_packed()
    _set_training(workdir, clipnorm=0.25, gradient_accumulation_steps=2)
    models, compile_model = [], loop.compile_model
    monkeypatch.setattr(loop, "compile_model", lambda *a, **k: models.append(compile_model(*a, **k)) or models[-1])
    result = train_arrays(workdir, epochs=1, jit_compile=False, average_last=0)
    optimizer = models[0].optimizer.get_config()
    expected = make_optimizer(TransformerConfig.from_yaml(workdir / "model.yaml"),
                              packed_experiment(workdir).training).get_config()
    assert (optimizer["clipnorm"], optimizer["gradient_accumulation_steps"]) == (0.25, 2)
    assert {k: v for k, v in optimizer.items() if k not in ("learning_rate", "name")} == \
        {k: v for k, v in expected.items() if k not in ("learning_rate", "name")}
    assert result["batches"] == len(packed_data(workdir, packed_experiment(workdir))[1])
    assert result["updates"] == result["batches"] // 2  # one update every 2 batches


@pytest.mark.slow  # two train_arrays calls
def test_accumulating_two_half_batches_is_one_whole_batch_update_for_update_on_the_packed_path(copy_packed,
                                                                                               monkeypatch):
    """The packed path's twin of test_training's: 16 pairs of one length in one batch a pass, or with
    training.gradient_accumulation_steps: 2 in two batches of 8 (half the token budget), give the same `step` and
    `learning_rate` after every update (the Noam rate at that update, cooldown included) and the same weights.
    Every pair has 6 target tokens, so both halves hold as many labels (the loss is a mean over tokens), and each
    pass's two halves are the whole batch's pairs, whichever order the pass shuffles them in; dropout is off, and
    Adam's epsilon 1e-6 (see test_training's twin)."""
    from keras_transformer.config import TransformerConfig
    from keras_transformer.trainer import loop
    rng = np.random.default_rng(0)
    pairs = ([rng.integers(4, 600, 5) for _ in range(16)], [rng.integers(4, 600, 6) for _ in range(16)])
    models, compile_model = [], loop.compile_model
    monkeypatch.setattr(loop, "compile_model", lambda *a, **k: models.append(compile_model(*a, **k)) or models[-1])

    def run(name, tokens_per_batch, accumulation):
        workdir = copy_packed(name)
        save_arrays(workdir / ARRAYS_FILE, {"train": pairs})  # width 8: 16 pairs in 128 positions
        config = TransformerConfig.from_yaml(workdir / "model.yaml")
        _set_training(workdir, gradient_accumulation_steps=accumulation, validation=False, cooldown_epochs=1,
                      epsilon=1e-6)
        result = train_arrays(workdir, epochs=3, tokens_per_batch=tokens_per_batch, jit_compile=False,
                              average_last=0)
        assert (result["updates"], result["batches"]) == (3, 3 * accumulation)
        with open(workdir / "history.csv", encoding="utf-8") as f:
            return list(csv.DictReader(f)), config, packed_experiment(workdir).training

    whole_rows, config, settings = run("whole", 128, 1)
    halves_rows, _, _ = run("halves", 64, 2)
    assert config.dropout == config.attention_dropout == config.ffn_dropout == 0
    noam = noam_learning_rates(config, settings, (1, 2)) + [0.0]  # the cooldown reaches 0 at the last update
    for rows in (whole_rows, halves_rows):
        assert [int(row["step"]) for row in rows] == [1, 2, 3]
        np.testing.assert_allclose([float(row["learning_rate"]) for row in rows], noam, rtol=1e-5, atol=1e-12)
    whole, halves = models
    assert int(halves.optimizer.iterations) == 3
    for a, b in zip(whole.get_weights(), halves.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


class _Killed(Exception):
    """Stands for a process killed after a batch (its backup, if one was due, written)."""


def _kill_after_batches(monkeypatch, count):
    """Makes the next training stop with `_Killed` at its `count`-th batch end, after the backup's own batch end."""
    from keras_transformer.trainer.backup import ResumableBackup

    seen, on_batch_end = [], ResumableBackup.on_train_batch_end

    def kill(self, batch, logs=None):
        on_batch_end(self, batch, logs)
        seen.append(batch)
        if len(seen) == count:
            raise _Killed
    monkeypatch.setattr(ResumableBackup, "on_train_batch_end", kill)
    return _Killed


@pytest.mark.slow
def test_a_run_interrupted_inside_an_epoch_resumes_to_the_uninterrupted_run_s_weights(trained, copy_packed,
                                                                                        monkeypatch):
    """With training.backup_every_steps the packed path backs up inside an epoch; a run killed there resumes
    with the batches the epoch had left, in the same order, and ends where an uninterrupted run ends (the
    `trained` run's first call: the same packed workdir and seed, two epochs, no backups inside an epoch)."""
    from keras_transformer.trainer.backup import backup_position
    whole, expected = trained[0], trained[4]
    broken = copy_packed("broken")
    _set_training(broken, backup_every_steps=2)
    assert [int(r["epoch"]) for r in expected] == [1, 2]
    per_epoch = int(expected[0]["step"])
    assert per_epoch > 6

    Killed = _kill_after_batches(monkeypatch, per_epoch + 5)  # batch 5 of epoch 2
    with pytest.raises(Killed):
        train_arrays(broken, jit_compile=False, average_last=0)
    monkeypatch.undo()
    assert backup_position(broken / "backup") == (1, 4)  # the backup of batch 4 of epoch 2 (0-based epoch 1)
    resumed = train_arrays(broken, jit_compile=False, average_last=0)
    assert resumed["updates"] == per_epoch - 4 and [p.name for p in resumed["checkpoints"]] == ["ckpt-0002.weights.h5"]
    with open(broken / "history.csv", encoding="utf-8") as f:
        got = list(csv.DictReader(f))
    assert [int(r["step"]) for r in got] == [int(r["step"]) for r in expected] == [per_epoch, 2 * per_epoch]
    for row, reference in zip(got, expected):  # epoch 2's row averages all of its batches, both processes'
        assert float(row["loss"]) == pytest.approx(float(reference["loss"]), rel=1e-4)
        assert float(row["val_loss"]) == pytest.approx(float(reference["val_loss"]), rel=1e-4)
    _assert_same_final_weights(whole, broken)


@pytest.mark.slow
def test_sigterm_inside_an_epoch_backs_up_that_batch_and_the_same_command_ends_with_the_uninterrupted_weights(
        trained, copy_packed, tmp_path):
    """SIGTERM to a packed-path training process inside its first epoch, with backups only at epoch ends: the
    batch being trained finishes, a backup at it is written, the process says where it stopped in one line and
    exits with status 143; the same command trains the batches the epoch had left and ends where the
    uninterrupted run (`trained`'s first call) ends."""
    from keras_transformer.trainer.backup import backup_position
    whole, expected = trained[0], trained[4]
    per_epoch = int(expected[0]["step"])
    broken = copy_packed("broken")
    command = ["train-packed", str(broken), "--epochs", "2", "--no-jit", "--average-last", "0"]
    status, err = sigterm_at_update("keras_transformer.cli", command, 3, tmp_path)
    assert status == 143, err[-3000:]
    lines = [line for line in err.splitlines() if ": error:" in line]
    assert lines == [f"keras-transformer train-packed: error: stopped by SIGTERM at epoch 1, batch 3 (the "
                     f"backup in {broken / 'backup'} resumes there); run the same command again to resume."]
    assert "Traceback" not in err
    assert backup_position(broken / "backup") == (0, 3)
    assert cli.main(command) == 0  # the same command
    assert [int(r["step"]) for r in _history(broken)] == [per_epoch, 2 * per_epoch]
    _assert_same_final_weights(whole, broken)


def _assert_same_final_weights(whole, broken):
    """The two workdirs' second epoch checkpoints hold the same weights (to float rounding)."""
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import build_model
    model = build_model(TransformerConfig.from_yaml(whole / "model.yaml"))
    weights = []
    for workdir in (whole, broken):
        model.load_weights(str(workdir / "checkpoints" / "ckpt-0002.weights.h5"))
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_steps_per_epoch_trains_that_many_updates_an_epoch_and_a_resume_across_a_pass_s_end_is_exact(copy_packed,
                                                                                                    monkeypatch):
    """training.steps_per_epoch applies on the packed path: an epoch of N updates takes the next N batches of
    the stream of passes, so the second epoch crosses the end of the first pass. A run killed inside it resumes
    with the batches the epoch had left, across that end, and ends with the weights of the uninterrupted run: with
    training.ema_decay, its raw weights and their moving averages both."""
    from keras_transformer.trainer.backup import backup_position
    whole, broken = copy_packed("whole"), copy_packed("broken")
    per_pass = len(packed_data(whole, packed_experiment(whole))[1])
    steps = per_pass // 2 + 1
    assert steps + 2 < per_pass < 2 * steps
    for workdir in (whole, broken):
        _set_training(workdir, steps_per_epoch=steps, backup_every_steps=1, ema_decay=0.9)
    result = train_arrays(whole, jit_compile=False, average_last=0)
    assert result["updates"] == 2 * steps
    expected = _history(whole)
    assert [int(r["step"]) for r in expected] == [steps, 2 * steps]

    Killed = _kill_after_batches(monkeypatch, steps + 2)  # batch 2 of epoch 2
    with pytest.raises(Killed):
        train_arrays(broken, jit_compile=False, average_last=0)
    monkeypatch.undo()
    assert backup_position(broken / "backup") == (1, 2)
    resumed = train_arrays(broken, jit_compile=False, average_last=0)
    assert resumed["updates"] == steps - 2
    got = _history(broken)
    assert [int(r["step"]) for r in got] == [steps, 2 * steps]
    assert float(got[1]["loss"]) == pytest.approx(float(expected[1]["loss"]), rel=1e-4)
    _assert_same_final_weights(whole, broken)  # the checkpoints: the moving averages (training.ema_decay)
    (whole_raw, whole_average), (broken_raw, broken_average) = (backup_weights(w, 0.9) for w in (whole, broken))
    for raw, average, other_raw, other_average in zip(whole_raw, whole_average, broken_raw, broken_average):
        np.testing.assert_allclose(other_raw, raw, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(other_average, average, rtol=1e-4, atol=1e-5)
    assert not np.allclose(whole_raw[0], whole_average[0], atol=1e-4)


def _history(workdir):
    with open(workdir / "history.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))
