"""What the teacher term costs a training step: plain loss, distillation by autodiff, distillation fused.

Three copies of one model (the Multi30k recipe's by default: 4+4 layers, d_model 128, a shared 8,000-piece
vocabulary, so the output layer and the loss are a large share of a step) train in one process, one step of each
in turn on the same batches (the order rotates every step):

    plain     LabelSmoothedCrossEntropy on the reference ids (an undistilled run)
    autodiff  (1 - w) * label-smoothed CE + w * teacher CE, the teacher term written as log_softmax + gather and
              differentiated by autodiff (how DistillationLoss first computed it)
    fused     DistillationLoss: both terms in one pass with the gradient written out
              (losses.smoothed_cross_entropy with soft targets)

Teacher labels are random top-k ids with random probabilities per target position, packed as
packed.data.pack_labels does. Prints a table: median step time and target tokens/s of each, and the paired
median ratio of each step time to plain's (taken under the same machine load, so usable on a noisy machine).

    python bench/distillation_step.py --steps 30
    python bench/distillation_step.py --config configs/multi30k_en_de.yaml --top-k 8 --batch-size 128 --length 24
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.experiment import load_experiment  # noqa: E402
from keras_transformer.packed.data import pack_labels  # noqa: E402
from keras_transformer.trainer import distillation  # noqa: E402
from keras_transformer.trainer.losses import smoothed_cross_entropy  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("plain", "autodiff", "fused")


class AutodiffDistillationLoss(distillation.DistillationLoss):
    """The teacher term as log_softmax + gather, left to autodiff: the baseline the fused loss replaced."""

    def call(self, y_true, y_pred):
        labels, ids, probabilities = distillation.unpack_labels(y_true)
        reference = smoothed_cross_entropy(labels, y_pred, self.label_smoothing)
        log_q = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        probabilities = probabilities / ops.maximum(ops.sum(probabilities, axis=-1, keepdims=True), 1e-9)
        teacher = -ops.sum(probabilities * ops.take_along_axis(log_q, ids, axis=-1), axis=-1)
        return (1.0 - self.distill_weight) * reference + self.distill_weight * teacher


def make_batches(count, config, batch_size, length, top_k, seed=0):
    """`count` batches `((source, decoder input), plain labels, packed labels)`; lengths uniform in
    [length/2, length]."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        source = np.zeros((batch_size, length), "int32")
        decoder_in = np.zeros((batch_size, length), "int32")
        labels = np.zeros((batch_size, length), "int32")
        for i in range(batch_size):
            n, m = rng.integers(length // 2, length + 1, 2)
            source[i, :n] = np.append(rng.integers(4, config.vocab_size, n - 1), config.eos_id)
            sentence = np.append(rng.integers(4, config.vocab_size, m - 1), config.eos_id)
            labels[i, :m] = sentence
            decoder_in[i, 0] = config.bos_id
            decoder_in[i, 1:m] = sentence[:-1]
        ids = np.stack([rng.choice(np.arange(4, config.vocab_size), top_k, replace=False)
                        for _ in range(batch_size * length)]).reshape(batch_size, length, top_k)
        probabilities = rng.dirichlet(np.ones(top_k), (batch_size, length)).astype("float32")
        packed = pack_labels(labels, ids, probabilities * (labels != 0)[..., None])
        batches.append(((source, decoder_in), labels, packed))
    return batches


def time_in_turn(impls, step, steps, warmup=3):
    """Runs `step(impl, index)` for every impl in turn, `warmup + steps` times, the order rotating every time;
    returns `{impl: [seconds of each timed step]}`."""
    times = {impl: [] for impl in impls}
    for index in range(steps + warmup):
        for impl in impls[index % len(impls):] + impls[:index % len(impls)]:
            start = time.perf_counter()
            step(impl, index)
            if index >= warmup:
                times[impl].append(time.perf_counter() - start)
    return times


def print_table(times, count, what):
    """A markdown table: each impl's median step, `count` `what` per second, and its paired median step-time
    ratio to the first impl's."""
    first = next(iter(times))
    print(f"| loss | median step (s) | {what}/s | step time / {first}'s (paired median) |")
    print("| --- | ---: | ---: | ---: |")
    for impl, seconds in times.items():
        median = statistics.median(seconds)
        ratio = statistics.median(a / b for a, b in zip(seconds, times[first]))
        print(f"| {impl} | {median:.3f} | {count / median:,.0f} | {ratio:.2f}x |")


def build(config, training, impl, weight):
    keras.utils.set_random_seed(0)
    model = kt.build_model(config)
    if impl == "plain":
        loss = kt.LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=config.pad_id)
    else:
        cls = AutodiffDistillationLoss if impl == "autodiff" else distillation.DistillationLoss
        loss = cls(training.label_smoothing, weight, pad_id=config.pad_id)
    model.compile(optimizer=kt.make_optimizer(config, training), loss=loss)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "multi30k_en_de.yaml"))
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--length", type=int, default=24, help="longest source and target in a batch")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--distill-weight", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each (after 3 warm-up steps)")
    args = parser.parse_args(argv)

    experiment = load_experiment(args.config)
    config, training = experiment.model_config(args.vocab_size), experiment.training
    batches = make_batches(4, config, args.batch_size, args.length, args.top_k)
    models = {impl: build(config, training, impl, args.distill_weight) for impl in IMPLS}

    def step(impl, index):
        inputs, labels, packed = batches[index % len(batches)]
        models[impl].train_on_batch(list(inputs), labels if impl == "plain" else packed)

    times = time_in_turn(IMPLS, step, args.steps)
    tokens = statistics.mean(int((b[1] != 0).sum()) for b in batches)
    print(f"model: {config.num_layers}+{config.num_layers} layers, d_model {config.d_model}, vocab "
          f"{config.vocab_size}; batches {args.batch_size} x {args.length} (~{tokens:.0f} target tokens), "
          f"top-{args.top_k}, w {args.distill_weight}, {args.steps} steps each")
    print_table(times, tokens, "target tokens")


if __name__ == "__main__":
    main()
