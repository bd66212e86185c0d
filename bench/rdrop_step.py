"""What R-Drop costs a training step at equal compute: the plain loss on n pairs against R-Drop on n / 2 pairs, each
run twice.

Three copies of one model (the Multi30k recipe's by default: 4+4 layers, d_model 128, a shared 8,000-piece
vocabulary, so the output layer and the loss are a large share of a step) train in one process, one step of each
in turn (the order rotates every step), every step on the same number of positions:

    plain     LabelSmoothedCrossEntropy on a batch of n pairs (the recipe's step)
    rdrop     RDropLoss on n / 2 pairs, each repeated in place (`data.build.repeat_rows`): `training.rdrop_alpha`
              with half the recipe's tokens per batch; both passes' cross-entropy and the divergence in one pass,
              the gradient written out (losses.rdrop_cross_entropy)
    autodiff  the same loss, the divergence computed apart from the cross-entropy, as log_softmax and sums left
              to autodiff (the baseline the fused loss replaces)

Prints a table: median step time, target positions/s, and the paired median ratio of each step time to plain's
(taken under the same machine load, so usable on a noisy machine).

    python bench/rdrop_step.py --steps 30
    python bench/rdrop_step.py --config configs/multi30k_en_de.yaml --batch-size 128 --length 24 --alpha 5
"""

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from distillation_step import make_batches, print_table, time_in_turn  # noqa: E402  (this folder)
from keras import ops  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.experiment import load_experiment  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("plain", "rdrop", "autodiff")


class AutodiffRDropLoss(kt.RDropLoss):
    """The divergence as `sum((p - q) * (log p - log q))` from log_softmax, left to autodiff."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        cross_entropy = self.masked_mean(self.call(y_true, y_pred), y_true)
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        shape = ops.shape(log_probs)
        pairs = ops.reshape(log_probs, (-1, 2, shape[1], shape[2]))
        difference = pairs[:, 0] - pairs[:, 1]
        divergence = ops.sum((ops.exp(pairs[:, 0]) - ops.exp(pairs[:, 1])) * difference, axis=-1)
        labels = ops.reshape(y_true, (-1, 2, shape[1]))[:, 0]
        return cross_entropy + self.alpha / 4.0 * self.masked_mean(divergence, labels)


def repeated(batch):
    """The first half of a batch's pairs, each twice in adjacent rows: as many positions as the whole batch."""
    (source, decoder_in), labels = batch
    half = len(labels) // 2
    return ((np.repeat(source[:half], 2, 0), np.repeat(decoder_in[:half], 2, 0)), np.repeat(labels[:half], 2, 0))


def build(config, training, impl, alpha):
    keras.utils.set_random_seed(0)
    model = kt.build_model(config)
    if impl == "plain":
        loss = kt.LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=config.pad_id)
    else:
        cls = AutodiffRDropLoss if impl == "autodiff" else kt.RDropLoss
        loss = cls(alpha, training.label_smoothing, pad_id=config.pad_id)
    model.compile(optimizer=kt.make_optimizer(config, training), loss=loss)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "multi30k_en_de.yaml"))
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=128, help="pairs of the plain step (even)")
    parser.add_argument("--length", type=int, default=24, help="longest source and target in a batch")
    parser.add_argument("--alpha", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each (after 3 warm-up steps)")
    args = parser.parse_args(argv)
    if args.batch_size < 2 or args.batch_size % 2:
        parser.error(f"--batch-size must be an even number >= 2, got {args.batch_size}")

    experiment = load_experiment(args.config)
    config, training = experiment.model_config(args.vocab_size), experiment.training
    batches = [(inputs, labels) for inputs, labels, _ in make_batches(4, config, args.batch_size, args.length, 1)]
    models = {impl: build(config, training, impl, args.alpha) for impl in IMPLS}
    pairs = [repeated(batch) for batch in batches]

    def step(impl, index):
        inputs, labels = (batches if impl == "plain" else pairs)[index % len(batches)]
        models[impl].train_on_batch(list(inputs), labels)

    times = time_in_turn(IMPLS, step, args.steps)
    positions = statistics.mean(int((b[1] != 0).sum()) for b in batches)
    print(f"model: {config.num_layers}+{config.num_layers} layers, d_model {config.d_model}, vocab "
          f"{config.vocab_size}; {args.batch_size} rows x {args.length} (~{positions:.0f} target positions) a step, "
          f"alpha {args.alpha}, {args.steps} steps each")
    print_table(times, positions, "target positions")


if __name__ == "__main__":
    main()
