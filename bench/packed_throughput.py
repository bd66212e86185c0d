"""Training throughput on the packed path (`keras-transformer train-packed`), one checkout against another, alternating.

    .venv/bin/python bench/packed_throughput.py --trees . ../main [--rounds 3] [--steps 60]

Each tree first packs Multi30k's training and validation pairs with the stock EN-DE recipe
(`configs/multi30k_en_de.yaml`, its 8k vocabulary) into a workdir of its own, in its own format (not timed).
Then each round runs, for each tree in turn (alternating, so machine noise falls on all alike), one fresh
Python process with that tree first on `sys.path` that trains a fresh copy of its workdir for one epoch of
`--steps` updates (`train_arrays`, TensorFlow backend, no XLA, as the recipe trains) and reports the wall time of
the updates after the first (a Keras callback: building, tracing and the first batch are left out) and of the
whole call. The table gives each tree's median per column and, with two trees, the ratio of the first tree's
median to the second's (below 1: the first is faster).
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"

PACK = r"""
import sys
from keras_transformer import training
from keras_transformer.experiment import load_experiment
data = sys.argv[3]
settings = [f"data.{key}={data}/{name}" for key, name in (
    ("train_source", "train.en.gz"), ("train_target", "train.de.gz"), ("valid_source", "val.en.gz"),
    ("valid_target", "val.de.gz"), ("valid_tokenized_target", "val.lc.norm.tok.de.gz"),
    ("test_source", "test_2016_flickr.en.gz"), ("test_target", "test_2016_flickr.de.gz"),
    ("test_tokenized_target", "test_2016_flickr.lc.norm.tok.de.gz"))]
settings += ["training.bleu_every_epochs=null", "training.tensorboard=false", "training.verbose=0",
             f"training.steps_per_epoch={sys.argv[4]}"]
training.pack_arrays(load_experiment(sys.argv[1], settings), sys.argv[2])
"""

TRAIN = r"""
import json, pathlib, sys, time
start = time.perf_counter()
import keras
try:
    from keras_transformer.packed import training as trainer
except ImportError:  # a checkout from before the packed trainer moved to packed/training.py
    try:
        from keras_transformer.trainer import packed as trainer
    except ImportError:  # ... and from before it moved to trainer/packed.py
        from keras_transformer import arrays as trainer
tree = pathlib.Path(sys.argv[2])
assert pathlib.Path(trainer.__file__).resolve().is_relative_to(tree.resolve()), trainer.__file__
marks = []


class Clock(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        marks.append(time.perf_counter())


fit = keras.Model.fit


def timed_fit(self, *args, callbacks=None, **kwargs):
    return fit(self, *args, callbacks=list(callbacks or []) + [Clock()], **kwargs)


keras.Model.fit = timed_fit
trainer.train_arrays(sys.argv[1], epochs=1, jit_compile=False, precision="float32")
total = time.perf_counter() - start
print(json.dumps({"updates": (marks[-1] - marks[0]) / (len(marks) - 1), "call": total}))
"""


def run(tree, code, *args):
    env = dict(os.environ, PYTHONPATH=str(tree), KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, cwd=tempfile.gettempdir(),
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", type=pathlib.Path, default=[REPO])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="updates per measured run")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    folder = pathlib.Path(tempfile.mkdtemp(prefix="packed_throughput_"))
    try:
        packed = []
        for index, tree in enumerate(trees):
            workdir = folder / f"packed{index}"
            run(tree, PACK, tree / "configs" / "multi30k_en_de.yaml", workdir, DATA, args.steps)
            packed.append(workdir)
        results = {tree: [] for tree in trees}
        for round_ in range(args.rounds):
            for tree, workdir in zip(trees, packed):
                fresh = folder / "run"
                shutil.rmtree(fresh, ignore_errors=True)
                shutil.copytree(workdir, fresh)
                results[tree].append(json.loads(run(tree, TRAIN, fresh, tree)))
                print(f"round {round_ + 1}, {tree}: {results[tree][-1]}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    medians = {tree: {key: statistics.median(r[key] for r in rows) for key in ("updates", "call")}
               for tree, rows in results.items()}
    print(f"\n| tree | s per update (median of {args.rounds}) | whole call (s) |")
    print("| --- | ---: | ---: |")
    for tree, values in medians.items():
        print(f"| {tree} | {values['updates']:.3f} | {values['call']:.1f} |")
    if len(trees) == 2:
        first, second = (medians[tree] for tree in trees)
        print(f"| ratio first / second | {first['updates'] / second['updates']:.3f} | "
              f"{first['call'] / second['call']:.3f} |")


if __name__ == "__main__":
    main()
