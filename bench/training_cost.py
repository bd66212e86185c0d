"""Wall time and target tokens/s of a finished training workdir, from its TensorBoard epoch events.

    python bench/training_cost.py runs/en_de_pre --target ../shared/data/multi30k/train.de.gz

Prints one table row per workdir: epochs, training minutes (epoch-to-epoch gaps over 6 minutes, i.e. pauses
between resumed runs, count as one median epoch), median epoch, target tokens per epoch (the workdir's
vocabulary over the training targets, plus one eos each) and target tokens/s.
"""

import argparse
import glob
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from keras_transformer.data.tokenizers import load_tokenizers  # noqa: E402
from keras_transformer.evaluation import read_lines  # noqa: E402


def epoch_times(workdir):
    """{epoch: wall time} of the `epoch_loss` events in workdir/logs/train."""
    times = {}
    for path in sorted(glob.glob(os.path.join(workdir, "logs", "train", "events*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            if any(value.tag == "epoch_loss" for value in event.summary.value):
                times[event.step] = event.wall_time
    if len(times) < 2:
        raise SystemExit(f"{workdir}: fewer than two epochs in logs/train; nothing to measure.")
    return times


def target_tokens(workdir, target_file):
    """Subword tokens of the training targets with the workdir's vocabulary, one eos per sentence included."""
    _, tokenizer = load_tokenizers(os.path.join(workdir, "data", "vocab"))
    lines = read_lines(target_file)
    total = 0
    for start in range(0, len(lines), 4096):
        total += int(tf.reduce_sum(tokenizer.tokenize(tf.constant(lines[start:start + 4096])).row_lengths()))
    return total + len(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="+")
    parser.add_argument("--target", action="append", required=True, help="training target file, one per workdir")
    args = parser.parse_args()
    if len(args.target) != len(args.workdir):
        parser.error("give one --target per workdir")
    print("| workdir | epochs | training min | median epoch min | target tokens/epoch | target tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for workdir, target in zip(args.workdir, args.target):
        times = epoch_times(workdir)
        steps = sorted(times)
        gaps = [times[b] - times[a] for a, b in zip(steps, steps[1:])]
        median = statistics.median(gaps)
        seconds = median + sum(gap if gap <= 360 else median for gap in gaps)  # first epoch ~ one median epoch
        tokens = target_tokens(workdir, target)
        print(f"| {workdir} | {len(steps)} | {seconds / 60:.0f} | {median / 60:.2f} | {tokens:,} | "
              f"{tokens * len(steps) / seconds:,.0f} |")


if __name__ == "__main__":
    main()
