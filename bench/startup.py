"""What a fresh process pays before its first result: a short training run and a first translation.

(The shipped model's first request by serving path, with and without warm-up: bench/first_request.py.)

    .venv/bin/python bench/startup.py [--trees . ../other-checkout] [--rounds 3]

Each round starts, for each source tree in turn (alternating, so machine noise falls on all alike), one fresh
Python process with that tree first on `sys.path`, which times:
- `import keras_transformer` and then TensorFlow and Keras,
- `train`: `configs/tiny_copy.yaml` for one epoch of 64 examples (model building, tracing the training and
  validation steps, two batches, the checkpoint and backup files),
- `translate`: a `Translator` (beam 4) over an untrained tiny model: two sentences twice (a translator's first
  `EAGER_SENTENCES` sentences are decoded eagerly, without tracing), then twelve sentences twice (the first call
  traces the search, the second runs the traced graph alone).
The table gives each tree's median per phase and, with two trees, the ratio of the first tree's median to the
second's.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

WORKER = r"""
import json, pathlib, sys, tempfile, time
tree = pathlib.Path(sys.argv[1])
start = time.perf_counter()
import keras_transformer
import tensorflow as tf
import keras
times = {"import": time.perf_counter() - start}
assert pathlib.Path(keras_transformer.__file__).resolve().is_relative_to(tree.resolve()), keras_transformer.__file__
from keras_transformer import training
from keras_transformer.experiment import load_experiment
from keras_transformer.engines.tensorflow import Translator

work = pathlib.Path(tempfile.mkdtemp())
settings = ["data.train_examples=64", "data.val_examples=32", "data.batch_size=32", "training.epochs=1",
            "training.verbose=0", "training.tensorboard=false"]
start = time.perf_counter()
training.train(load_experiment(tree / "configs" / "tiny_copy.yaml", settings), work / "run")
times["train"] = time.perf_counter() - start


class Words(tf.Module):  # "w4".."w31" <-> ids 4..31: a tokenizer without a vocabulary file
    pad_id, unk_id, bos_id, eos_id, vocab_size = 0, 1, 2, 3, 32

    def __init__(self):
        super().__init__()
        self.words = tf.constant(["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, 32)])
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(self.words, tf.range(32, dtype=tf.int32)), default_value=1)

    def tokenize(self, strings):
        return tf.ragged.map_flat_values(self.table.lookup, tf.strings.split(tf.convert_to_tensor(strings)))

    def detokenize(self, ids):
        ids = tf.cast(ids, tf.int32)
        keep = (tf.math.cumsum(tf.cast(ids == 3, tf.int32), axis=1) == 0) & (ids != 0) & (ids != 2)
        return tf.strings.reduce_join(tf.gather(self.words, tf.ragged.boolean_mask(ids, keep)), axis=1,
                                      separator=" ")


model = keras_transformer.build_model(keras_transformer.TransformerConfig.preset("tiny", vocab_size=32))
translator = Translator(model, Words(), beam_size=4, max_extra=10)
sentences = ["w4 w5 w6 w7", "w8 w9"]
for phase, batch in (("first translation", sentences), ("second translation", sentences),
                     ("first traced", sentences * 6), ("traced again", sentences * 6)):
    start = time.perf_counter()
    translator(batch)
    times[phase] = time.perf_counter() - start
print(json.dumps(times))
"""

PHASES = ("import", "train", "first translation", "second translation", "first traced", "traced again")


def run(tree):
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", WORKER, str(tree)], env=env, cwd=tree, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=[str(REPO)], help="source trees to compare (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = [pathlib.Path(t).resolve() for t in args.trees]
    for tree in trees:
        if not (tree / "keras_transformer" / "__init__.py").is_file():
            parser.error(f"{tree} is not a keras_transformer checkout")
    results = {tree: [] for tree in trees}
    for round_index in range(args.rounds):
        for tree in trees:
            results[tree].append(run(tree))
            print(f"round {round_index + 1} {tree.name}: " + ", ".join(
                f"{k} {v:.2f} s" for k, v in results[tree][-1].items()), file=sys.stderr)

    header = ["phase (median s)"] + [tree.name for tree in trees] + (["ratio"] if len(trees) == 2 else [])
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for phase in PHASES:
        medians = [statistics.median(r[phase] for r in results[tree]) for tree in trees]
        row = [phase] + [f"{m:.2f}" for m in medians]
        if len(trees) == 2:
            row.append(f"{medians[0] / medians[1]:.2f}x")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
