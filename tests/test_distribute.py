"""Strategy selection and batch scaling; data-parallel training that matches one device, in and across processes.

The multi-device tests run in subprocesses: logical CPU devices and a
multi-worker cluster must be configured before TensorFlow starts, which the
test process has long done.
"""

import collections
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_transformer.experiment import DISTRIBUTION_STRATEGIES
from keras_transformer.trainer import distribute

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny_copy.yaml"


def _env(**extra):
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)
    return env


# ------------------------------------------------------------------ selection (no strategy is built)
def test_auto_picks_multi_worker_when_tf_config_names_several_workers(monkeypatch):
    cluster = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    assert distribute.resolve_strategy_name("auto") == "multi_worker"


def test_auto_ignores_a_one_worker_tf_config_and_picks_tpu_when_announced(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    assert distribute.resolve_strategy_name("auto") == "tpu"


def test_auto_on_this_machine_is_default_without_gpus(monkeypatch):
    import tensorflow as tf
    for name in ("TF_CONFIG",) + distribute._TPU_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(distribute, "_TPU_DEVICE", "/nonexistent/accel0")
    gpus = len(tf.config.list_physical_devices("GPU"))
    assert distribute.resolve_strategy_name("auto") == ("mirrored" if gpus > 1 else "default")


def test_explicit_names_are_kept_and_unknown_ones_rejected():
    for name in DISTRIBUTION_STRATEGIES[1:]:
        assert distribute.resolve_strategy_name(name) == name
    with pytest.raises(ValueError, match="Unknown strategy 'horovod'"):
        distribute.resolve_strategy_name("horovod")


def test_bad_tf_config_is_reported(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        distribute.resolve_strategy_name("auto")


def test_global_batch_scales_with_replicas_as_documented():
    assert distribute.global_batch_size(64, 4) == 256  # per replica (default)
    assert distribute.global_batch_size(4096, 8, "global") == 4096
    with pytest.raises(ValueError, match="does not split evenly over 3 replicas"):
        distribute.global_batch_size(64, 3, "global")
    with pytest.raises(ValueError, match="batch_scaling"):
        distribute.global_batch_size(64, 2, "sometimes")


def test_default_strategy_is_the_chief():
    assert distribute.task_info(distribute.make_strategy("default")) == (None, 0, True)


# ------------------------------------------------------------------ MirroredStrategy on 2 logical CPUs
# Fixed-length sentences give every replica the same number of tokens, so the mean of the replicas'
# losses is exactly the loss of the whole batch; no shuffling and no dropout make both runs see the
# same arithmetic. Adam's epsilon = 1 makes each update proportional to the gradient (not its sign),
# so a gradient summed instead of averaged over replicas would show in the losses.
_MIRRORED = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_transformer import training
    from keras_transformer.experiment import load_experiment
    common = ["data.train_examples=128", "data.val_examples=32", "data.min_length=6", "data.max_length=6",
              "data.batch_size=32", "data.shuffle=false", "training.batch_scaling=global", "training.epochs=3",
              "training.verbose=0", "training.tensorboard=false", "training.validation=false",
              "training.epsilon=1.0", "training.learning_rate_scale=20", "training.clipnorm=null",
              # One layer each side halves the tracing; its larger first losses fall fast with a 4-step warm-up.
              "model.num_layers=1", "training.warmup_steps=4",
              # The weights compared are the moving averages the run ends with, swapped in and out of mirrored
              # variables at every checkpoint.
              "training.ema_decay=0.5"]
    runs = {"mirrored": ["training.strategy=mirrored", "training.devices=['/cpu:0', '/cpu:1']"],
            "one_device": ["training.strategy=one_device", "training.devices=['/cpu:0']"]}
    out = {}
    for name, extra in runs.items():
        result = training.train(load_experiment(sys.argv[1], common + extra), sys.argv[2] + "/" + name)
        out[name] = {"replicas": result.strategy.num_replicas_in_sync, "loss": result.history["loss"],
                     "weights": [w.tolist() for w in result.model.get_weights()[:4]]}
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_mirrored_over_two_cpus_gives_the_losses_of_one_device(tmp_path):
    """Slow: a fresh process with two logical CPUs (fixed at TensorFlow's start) trains mirrored and on one device."""
    completed = subprocess.run([sys.executable, "-c", _MIRRORED, str(TINY), str(tmp_path)], cwd=REPO,
                               env=_env(), capture_output=True, text=True, timeout=480)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    runs = json.loads(lines[-1][len("RESULT "):])
    mirrored, single = runs["mirrored"], runs["one_device"]
    assert (mirrored["replicas"], single["replicas"]) == (2, 1)
    assert single["loss"][0] < 1.5 * np.log(24)  # a real cross-entropy, not a replica multiple of it
    assert single["loss"][-1] < single["loss"][0] - 0.2  # it learned something
    np.testing.assert_allclose(mirrored["loss"], single["loss"], rtol=1e-4)
    for a, b in zip(mirrored["weights"], single["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


# ------------------------------------------------------------------ MultiWorkerMirroredStrategy, 2 processes
def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_multi_worker_training_on_two_processes_ends_with_identical_weights(tmp_path):
    """Slow: two `train` processes talk over TF_CONFIG's cluster; multi-worker training needs separate processes."""
    import h5py

    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--config", str(TINY),
               "--workdir", str(tmp_path), "--set", "training.strategy=auto", "--set", "training.epochs=2",
               "--set", "data.train_examples=128", "--set", "data.val_examples=32", "--set", "data.batch_size=32",
               # one layer each side halves the tracing (its larger first losses fall fast with a 4-step warm-up);
               # two steps an epoch
               "--set", "model.num_layers=1", "--set", "training.warmup_steps=4",
               "--set", "training.verbose=2", "--set", "training.tensorboard=false"]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(subprocess.Popen(command, cwd=REPO, env=_env(TF_CONFIG=json.dumps(tf_config)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=480)[0])  # bounded, generous for a busy CI machine
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    assert "MultiWorkerMirroredStrategy" in outputs[0] or "CollectiveAllReduceStrategy" in outputs[0]
    assert "2 replica(s)" in outputs[0]

    # The chief writes into the workdir, the other worker into workdir/worker-1.
    chief, other = tmp_path / "checkpoints", tmp_path / "worker-1" / "checkpoints"
    assert sorted(p.name for p in chief.glob("ckpt-*")) == ["ckpt-0001.weights.h5", "ckpt-0002.weights.h5"]

    def weights(path):
        values = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, item: values.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset)
                         else None)
        return values

    first, second, start = (weights(chief / "ckpt-0002.weights.h5"), weights(other / "ckpt-0002.weights.h5"),
                            weights(chief / "ckpt-0001.weights.h5"))
    assert first.keys() == second.keys() and len(first) > 20
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    assert any(not np.array_equal(first[name], start[name]) for name in first)  # the second epoch trained
    # Both workers report the same loss, and it is a real cross-entropy (not a replica multiple of it).
    for history in (tmp_path / "history.csv", tmp_path / "worker-1" / "history.csv"):
        assert history.is_file()
    chief_rows = (tmp_path / "history.csv").read_text().splitlines()
    assert chief_rows == (tmp_path / "worker-1" / "history.csv").read_text().splitlines()
    header, first_row = chief_rows[0].split(","), chief_rows[1].split(",")
    assert float(first_row[header.index("loss")]) < 1.5 * np.log(24)


# Each worker builds its training data as `train` does (`build_data` under the real strategy, the chief learning
# the vocabulary while the other waits for it) and iterates it as `fit` does (`experimental_distribute_dataset`,
# which hands each replica half of every local batch, both workers in step), recording the pairs of each step until
# it has as many as its shard holds: every other line of the corpus. The same processes then build the data once
# more with sharding turned off (`input_shard` made to answer "one worker"), which the same check must reject.
# The first 1,000 pairs of Multi30k's validation split, in windows of 250 lines: under two replicas a window's batch
# sizes are even, and an odd window would leave its last pair out (`batching.batch_plan`).
_WORKER = textwrap.dedent("""
    import gzip, json, sys
    from keras_transformer.trainer import distribute
    strategy = distribute.make_strategy("multi_worker")  # first: it configures TensorFlow's runtime
    from keras_transformer.data import build
    from keras_transformer.data.tokenizers import EOS_ID
    from keras_transformer.experiment import as_experiment
    corpus, workdir = sys.argv[1], sys.argv[2]
    data = as_experiment({"data": {"kind": "text", "train_source": corpus + "/val.en.gz",
                                   "train_target": corpus + "/val.de.gz", "max_train_pairs": 1000,
                                   "vocab_size": 600, "window": 250,
                                   "tokens_per_batch": 2048, "max_length": 256}}).data
    _, _, is_chief = distribute.task_info(strategy)
    workers, index = build.input_shard(strategy)
    count = len(range(index, 1000, workers))  # the lines of this worker's shard

    def pairs_of_one_shard():
        train = build.build_data(data, workdir + "/data", strategy, seed=0, wait_for_chief=not is_chief,
                                 steps_per_epoch=5)
        seen = []
        # The same number of steps on both workers (each step is collective), enough for two passes of a shard.
        for _, (inputs, labels) in zip(range(40), strategy.experimental_distribute_dataset(train.train)):
            if len(seen) < count:
                sides = (strategy.experimental_local_results(t)[0].numpy() for t in (inputs["source"], labels))
                seen += [[[int(i) for i in side if i] for side in pair] for pair in zip(*sides)]
        return train, seen

    train, sharded = pairs_of_one_shard()
    build.input_shard = lambda strategy: (1, 0)  # the control: every worker reads every line
    _, unsharded = pairs_of_one_shard()
    tokenizer = train.tokenizers[0]
    sides = [[line.decode().rstrip("\\n") for line in gzip.open(corpus + "/val." + lang + ".gz")]
             for lang in ("en", "de")]
    rows = [tokenizer.tokenize(side[:1000]).to_list() for side in sides]
    with open(workdir + "/result" + str(index) + ".json", "w") as f:
        json.dump({"shard": [workers, index], "replicas": strategy.num_replicas_in_sync,
                   "sharded": sharded, "unsharded": unsharded,
                   "corpus": [[s + [EOS_ID], t + [EOS_ID]] for s, t in zip(*rows)]}, f)
""")


def _one_pass_each(pairs, corpus):
    """Whether the workers' pairs together are `corpus` (a multiset: its duplicate lines as often as there)."""
    counts = [collections.Counter(json.dumps(pair) for pair in worker) for worker in pairs]
    return sum(counts, collections.Counter()) == collections.Counter(json.dumps(pair) for pair in corpus)


@pytest.mark.slow
def test_two_worker_processes_read_disjoint_shards_that_together_are_the_corpus(tmp_path, multi30k_dir):
    """Slow: two worker processes each read their shard of Multi30k; the split is only real across processes."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(subprocess.Popen([sys.executable, "-c", _WORKER, str(multi30k_dir), str(tmp_path)],
                                          cwd=REPO, env=_env(TF_CONFIG=json.dumps(tf_config)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=240)[0])  # a worker left alone would wait for its peer
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    results = []
    for index, (process, output) in enumerate(zip(processes, outputs)):
        result = tmp_path / f"result{index}.json"
        assert process.returncode == 0 and result.exists(), output[-3000:]
        results.append(json.loads(result.read_text()))
    corpus = results[0]["corpus"]
    assert len(corpus) == 1000 and results[1]["corpus"] == corpus
    assert [result["shard"] for result in results] == [[2, 0], [2, 1]]
    assert [result["replicas"] for result in results] == [2, 2]
    # One pass of each shard: every other line, exactly (no batch crosses into the next pass).
    assert [len(result["sharded"]) for result in results] == [500, 500]
    assert _one_pass_each([result["sharded"] for result in results], corpus)
    # Without the shards, the workers read the same lines in the same order: pairs twice, others never.
    assert [len(result["unsharded"]) for result in results] == [500, 500]
    assert not _one_pass_each([result["unsharded"] for result in results], corpus)
