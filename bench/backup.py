"""What a crash-safe backup costs against Keras' in-place one, per backup written and per resume.

    .venv/bin/python bench/backup.py [--models multi30k base] [--rounds 5]

For each model (the shipped Multi30k EN-DE architecture, and the paper's base model at a 37,000-token vocabulary)
with Adam's state built, each round writes one backup with Keras' `BackupAndRestore` (its `double_checkpoint`
copy of the previous file, then the weights rewritten in place) and one with `trainer.backup.ResumableBackup`
(weights and metadata written under temporary names and fsynced, BLAKE2b digest of the weights, the previous pair
linked aside, renames, folder fsync), alternating which goes first. It also times a resume: Keras' load of the
latest file against `ResumableBackup.restore` (digest check, then the same load). The table gives medians and the
ratio ours / Keras'.
"""

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import keras  # noqa: E402

from keras_transformer.config import TransformerConfig  # noqa: E402
from keras_transformer.model import build_model  # noqa: E402
from keras_transformer.trainer.backup import ResumableBackup  # noqa: E402

MODELS = {
    "multi30k": lambda: TransformerConfig.from_yaml(REPO / "saved_models" / "multi30k_en_de" / "assets.extra" /
                                                    "model.yaml"),
    "base": lambda: TransformerConfig.preset("base", vocab_size=37000),
}


def _compiled(config):
    model = build_model(config)
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(name, rounds):
    model = _compiled(MODELS[name]())
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-backup-"))
    try:
        keras_backup = keras.callbacks.BackupAndRestore(str(root / "keras"), double_checkpoint=True,
                                                        delete_checkpoint=False)
        keras_backup.set_model(model)
        ours = ResumableBackup(root / "ours")
        ours.set_model(model)
        keras_backup._save_model()  # a first backup each, so that every timed one sets a previous one aside
        ours.save(1, 0)
        times = {"keras save": [], "ours save": [], "keras resume": [], "ours resume": []}
        for index in range(rounds):
            pairs = [("keras save", keras_backup._save_model), ("ours save", lambda: ours.save(index + 2, 0))]
            for label, call in (pairs if index % 2 == 0 else pairs[::-1]):
                times[label].append(_timed(call))
            loads = [("keras resume", lambda: model.load_weights(str(root / "keras" / "latest.weights.h5"))),
                     ("ours resume", ours.restore)]
            for label, call in (loads if index % 2 == 0 else loads[::-1]):
                times[label].append(_timed(call))
        size = (root / "ours" / "latest.weights.h5").stat().st_size
        return size, {label: statistics.median(values) for label, values in times.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| model | backup file | Keras save | ours save | ratio | Keras resume | ours resume | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models:
        size, median = measure(name, args.rounds)
        print(f"| {name} | {size / 2 ** 20:.0f} MiB | {median['keras save'] * 1000:.0f} ms | "
              f"{median['ours save'] * 1000:.0f} ms | {median['ours save'] / median['keras save']:.2f} | "
              f"{median['keras resume'] * 1000:.0f} ms | {median['ours resume'] * 1000:.0f} ms | "
              f"{median['ours resume'] / median['keras resume']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
