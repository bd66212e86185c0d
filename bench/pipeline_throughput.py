"""Data pipeline throughput on Multi30k, its padding, and its speed against a training step.

Measures, on the Multi30k En-De training split (29,000 pairs) with a shared
8,000-id SentencePiece BPE vocabulary learned in the script:

* build time of `make_dataset` (read the gzip files, tokenize both sides,
  length filter, batch plan);
* pipeline throughput in sentences/s and batches/s: the first epoch (which also
  traces the pipeline's functions) and the median of the following epochs,
  iterating the dataset alone (no model);
* padding fraction of the token-budget batches against shuffled fixed
  64-sentence batches of the same examples padded to their longest;
* the training step rate of the ``small`` preset (`build_model`,
  `LabelSmoothedCrossEntropy`, `make_optimizer`, ``train_on_batch`` on pipeline
  batches, after warm-up steps that trace the step function), and the ratio
  pipeline batches/s / training steps/s. The issue asks for at least 10x.

The machine is shared and noisy: the pipeline is timed before and after the
training steps and the slower of the two medians is used for the ratio.

Usage:

    python bench/pipeline_throughput.py                       # 4096-token batches, as DataConfig's default
    python bench/pipeline_throughput.py --tokens-per-batch 2048 --epochs 5 --train-steps 10
    python bench/pipeline_throughput.py --bucket-width 8              # lengths sorted in groups of 8
"""

import argparse
import os
import pathlib
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.data.corpus import read_parallel_corpus  # noqa: E402
from keras_transformer.data.pipeline import batch_statistics, make_dataset  # noqa: E402
from keras_transformer.data.tokenizers import SubwordTokenizer  # noqa: E402
from keras_transformer.experiment import TrainingSection  # noqa: E402

MULTI30K = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def time_epochs(dataset, epochs):
    """Seconds, sentences and batches of each full pass over `dataset`."""
    results = []
    for _ in range(epochs):
        start = time.perf_counter()
        sentences = batches = 0
        for _, labels in dataset:
            sentences += int(labels.shape[0])
            batches += 1
        results.append((time.perf_counter() - start, sentences, batches))
    return results


def fixed_batches(tokenizer, english, german, batch_size=64, seed=0):
    """The same examples in shuffled fixed-size batches, padded to the longest of each batch."""
    source = tokenizer.tokenize(english)
    target = tokenizer.tokenize(german)
    dataset = tf.data.Dataset.from_tensor_slices((source, target)).shuffle(len(english), seed=seed)
    dataset = dataset.map(lambda s, t: ({"source": tf.concat([s, [3]], 0), "target": tf.concat([[2], t], 0)},
                                        tf.concat([t, [3]], 0)))
    return dataset.padded_batch(batch_size)


def training_step_rate(dataset, vocab_size, steps, warmup):
    """Median seconds per `train_on_batch` of the small preset on pipeline batches."""
    import keras

    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.preset("small", vocab_size=vocab_size)
    model = kt.build_model(config)
    training = TrainingSection()  # the paper's Adam, label smoothing 0.1; the small preset's warm-up (4000)
    model.compile(optimizer=kt.make_optimizer(config, training),
                  loss=kt.LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=config.pad_id))
    times, sentences, tokens = [], [], []
    for step, (inputs, labels) in enumerate(dataset.take(warmup + steps)):
        start = time.perf_counter()
        model.train_on_batch(inputs, labels)
        if step >= warmup:
            times.append(time.perf_counter() - start)
            sentences.append(int(labels.shape[0]))
            tokens.append(int(np.count_nonzero(labels.numpy())))
    return statistics.median(times), statistics.mean(sentences), statistics.mean(tokens)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(MULTI30K), help="folder with train.en.gz and train.de.gz")
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--bucket-width", type=int, default=1, help="lengths per bucket (DataConfig.bucket_width)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=4,
                        help="pipeline passes per measurement (the first traces the pipeline)")
    parser.add_argument("--train-steps", type=int, default=8, help="timed training steps (after warm-up)")
    parser.add_argument("--warmup-steps", type=int, default=4, help="untimed training steps that trace the step")
    args = parser.parse_args()
    data = pathlib.Path(args.data)

    english, german, _ = read_parallel_corpus(data / "train.en.gz", data / "train.de.gz")
    start = time.perf_counter()
    tokenizer = SubwordTokenizer.train(english + german, args.vocab_size)
    learn_seconds = time.perf_counter() - start

    start = time.perf_counter()
    dataset, summary = make_dataset(data / "train.en.gz", data / "train.de.gz", tokenizer, tokenizer,
                                    tokens_per_batch=args.tokens_per_batch, max_length=args.max_length,
                                    bucket_width=args.bucket_width, seed=0)
    build_seconds = time.perf_counter() - start

    before = time_epochs(dataset, args.epochs)
    step_seconds, step_sentences, step_tokens = training_step_rate(dataset, tokenizer.vocab_size,
                                                                   args.train_steps, args.warmup_steps)
    after = time_epochs(dataset, args.epochs)

    budget_stats = batch_statistics(dataset)
    fixed_stats = batch_statistics(fixed_batches(tokenizer, english, german))

    def rates(results):
        later = results[1:] or results
        seconds = statistics.median(r[0] for r in later)
        return later[0][1] / seconds, later[0][2] / seconds

    first_sentences = before[0][1] / before[0][0]
    sentences_before, batches_before = rates(before)
    sentences_after, batches_after = rates(after)
    batches_per_s = min(batches_before, batches_after)
    steps_per_s = 1.0 / step_seconds

    print(f"Multi30k En-De train, shared BPE vocabulary {tokenizer.vocab_size} (learned in {learn_seconds:.1f} s), "
          f"tokens_per_batch={args.tokens_per_batch}, max_length={args.max_length}, bucket_width={args.bucket_width}")
    print(f"{summary}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU, TensorFlow {tf.__version__}, "
          f"GPU: {bool(tf.config.list_physical_devices('GPU'))}")
    print()
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| make_dataset build (read, tokenize, filter, plan) | {build_seconds:.2f} s |")
    print(f"| pipeline, first epoch (traces the pipeline) | {first_sentences:,.0f} sentences/s |")
    print(f"| pipeline, later epochs (median; before / after training) | {sentences_before:,.0f} / "
          f"{sentences_after:,.0f} sentences/s |")
    print(f"| pipeline batches/s (slower of before / after) | {batches_per_s:,.1f} |")
    print(f"| batches per epoch, mean sentences per batch | {budget_stats.batches}, "
          f"{budget_stats.sentences / budget_stats.batches:.1f} |")
    print(f"| padding, token-budget batches | {budget_stats.padding_fraction:.1%} |")
    print(f"| padding, fixed 64-sentence batches | {fixed_stats.padding_fraction:.1%} |")
    print(f"| padding ratio (budget / fixed) | {budget_stats.padding_fraction / fixed_stats.padding_fraction:.2f} |")
    print(f"| largest batch, source / target positions | {budget_stats.max_source_positions} / "
          f"{budget_stats.max_target_positions} (budget {args.tokens_per_batch}) |")
    print(f"| small preset training step (median of {args.train_steps}) | {step_seconds:.2f} s "
          f"({step_sentences:.0f} sentences, {step_tokens:.0f} target tokens) |")
    print(f"| training rate | {steps_per_s:.2f} steps/s, {steps_per_s * step_sentences:,.0f} sentences/s |")
    print(f"| pipeline / training (batches/s over steps/s) | {batches_per_s / steps_per_s:,.0f}x (target >= 10x) |")


if __name__ == "__main__":
    main()
