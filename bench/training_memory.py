"""Peak memory of the training step: the EN-DE recipe's model, mixed_bfloat16, a given shared vocabulary.

    .venv/bin/python bench/training_memory.py --vocab-sizes 8000,32000 [--tree ../other-checkout ...]

Each run is a process of its own (`--tree` first on PYTHONPATH, default this checkout; several trees alternate):
the model of `configs/multi30k_en_de.yaml` (4+4 layers, d_model 128, relative positions) compiled as `train` does
(`LabelSmoothedCrossEntropy`, `MaskedAccuracy`, the Noam-scheduled Adam), then `keras.Model.fit` on 12 random
batches of about 4,096 target positions in six shapes (128x32, 256x16, 64x64, 100x40, 200x20, 80x51), with
`TF_CPU_ALLOCATOR_USE_BFC=true` so that TensorFlow's CPU allocator reports its peak of live tensor bytes
(`tf.config.experimental.get_memory_info`), which does not depend on how the C library hands memory back. With
`--no-logits-metric` the metric counts labels only (never reads the logits): what the step costs without the
metric's own work on the `(B, T, V)` logits.

Columns: tree, vocabulary, metric, TensorFlow's peak of live tensors (GB), the process's peak RSS (GB).
"""

import argparse
import os
import pathlib
import resource
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SHAPES = [(128, 32), (256, 16), (64, 64), (100, 40), (200, 20), (80, 51)]


def worker(vocab_size, logits_metric):
    """One run; prints `tensorflow_peak_bytes rss_peak_bytes`."""
    import keras
    import numpy as np
    import tensorflow as tf
    from keras import ops

    from keras_transformer.config import TransformerConfig
    from keras_transformer.experiment import TrainingSection
    from keras_transformer.model import build_model
    from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.trainer.metrics import MaskedAccuracy
    from keras_transformer.trainer.optimizers import make_optimizer

    class LabelCount(MaskedAccuracy):
        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(ops.sum(ops.cast(ops.not_equal(ops.cast(y_true, "int32"), 0), "float32")))

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    config = TransformerConfig.preset("small", vocab_size=vocab_size, num_layers=4, d_model=128, num_heads=4,
                                      d_ff=512, dropout=0.3, tie_embeddings="all",
                                      max_length=128, position="relative", max_relative_position=20)
    model = build_model(config)
    metric = MaskedAccuracy(pad_id=0) if logits_metric else LabelCount(pad_id=0)
    model.compile(optimizer=make_optimizer(config, TrainingSection(warmup_steps=500)),
                  loss=LabelSmoothedCrossEntropy(0.1, pad_id=0), metrics=[metric])
    model.optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(0)

    def batches():
        for step in range(2 * len(SHAPES)):
            rows, width = SHAPES[step % len(SHAPES)]
            ids = rng.integers(4, vocab_size, (3, rows, width)).astype("int32")
            yield {"source": ids[0], "target": ids[1]}, ids[2]

    spec = tf.TensorSpec((None, None), tf.int32)
    data = tf.data.Dataset.from_generator(batches, output_signature=({"source": spec, "target": spec}, spec))
    model.fit(data, epochs=1, verbose=0)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    print(peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab-sizes", default="8000,32000", help="comma-separated shared vocabulary sizes")
    parser.add_argument("--tree", type=pathlib.Path, action="append", default=None,
                        help="a checkout whose keras_transformer is measured (repeatable; default: this one)")
    parser.add_argument("--no-logits-metric", action="store_true",
                        help="a metric that counts labels only instead of MaskedAccuracy (argmax of the logits)")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(int(args.worker[0]), args.worker[1] == "1")
    trees = [tree.resolve() for tree in (args.tree or [REPO])]
    metric = "labels only" if args.no_logits_metric else "MaskedAccuracy"
    print("| tree | vocabulary | metric | TensorFlow peak (GB) | peak RSS (GB) |")
    print("| --- | ---: | --- | ---: | ---: |")
    for vocab_size in [int(size) for size in args.vocab_sizes.split(",")]:
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
                   "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
            run = subprocess.run([sys.executable, __file__, "--worker", str(vocab_size),
                                  "0" if args.no_logits_metric else "1"],
                                 env=env, capture_output=True, text=True, check=True)
            peak, rss = (int(value) for value in run.stdout.split()[-2:])
            print(f"| {tree.name} | {vocab_size} | {metric} | {peak / 1e9:.2f} | {rss / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
