"""The streamed text pipeline against the in-memory one it replaced, on Multi30k: padding, batches, training speed.

The in-memory pipeline is `keras_transformer/data/pipeline.py` as a git revision
has it (`--baseline`, default `main`), loaded beside the current one (it uses
only `corpus.read_parallel_corpus`/`limit_length` and `batching.batch_plan`,
which the current package still has). Both build the training batches of the
same files with the same settings (the stock EN-DE recipe's by default:
`configs/multi30k_en_de.yaml`, 4096 tokens a batch, max length 128).

Printed, one table:

* batches an epoch, padding (share of padded positions), largest batch in
  positions per side: one epoch of each;
* training speed: one model (the recipe's, built once) trains alternately one
  whole epoch of each dataset (`model.fit(dataset, epochs=1)`), `--rounds`
  times, old first in odd rounds and new first in even ones; each epoch's
  non-pad target tokens per second, and the median of the per-round ratios
  new / old (the paired figure to quote on a shared machine). An epoch of the
  streamed pipeline includes reading and tokenizing its window again at the
  epoch's start, which is the cost to see.

Usage:

    python bench/stream_vs_memory.py --rounds 3
    python bench/stream_vs_memory.py --rounds 2 --steps 40    # the first 40 batches of each epoch only
"""

import argparse
import importlib.util
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer.data import pipeline  # noqa: E402
from keras_transformer.data.tokenizers import load_tokenizers  # noqa: E402
from keras_transformer.experiment import load_experiment  # noqa: E402
from keras_transformer.trainer.loop import TrainingData, compile_model  # noqa: E402


def old_pipeline(revision):
    """The pipeline module of `revision`, imported as `old_pipeline`."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:keras_transformer/data/pipeline.py"],
                            check=True, capture_output=True, text=True).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "old_pipeline.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("old_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def epoch_tokens(dataset, steps):
    """Non-pad target tokens of the first `steps` batches of one pass (all with None)."""
    batches = dataset if steps is None else dataset.take(steps)
    return sum(int(np.count_nonzero(labels)) for _, labels in batches.as_numpy_iterator())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "multi30k_en_de.yaml"))
    parser.add_argument("--vocab", default=str(REPO / "saved_models" / "multi30k_en_de" / "assets.extra" / "vocab"))
    parser.add_argument("--baseline", default="main", help="git revision of the in-memory pipeline")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="batches of each epoch to train (default: all)")
    args = parser.parse_args()

    os.chdir(REPO)  # the recipe's data paths are relative to the repository
    experiment = load_experiment(args.config)
    config = experiment.data.data_config()
    source_tokenizer, target_tokenizer = load_tokenizers(args.vocab)
    options = dict(tokens_per_batch=config.tokens_per_batch, max_length=config.max_length,
                   bucket_width=config.bucket_width, num_replicas=1, seed=experiment.training.seed)
    old = old_pipeline(args.baseline)
    start = time.perf_counter()
    old_train, _ = old.make_dataset(config.train_source, config.train_target, source_tokenizer, target_tokenizer,
                                    **options)
    old_build = time.perf_counter() - start
    new_train, _ = pipeline.make_dataset(config.train_source, config.train_target, source_tokenizer,
                                         target_tokenizer, window=config.window, **options)
    datasets = {"in memory (" + args.baseline + ")": old_train, "streamed": new_train}

    rows = {}
    for name, dataset in datasets.items():
        start = time.perf_counter()
        stats = pipeline.batch_statistics(dataset)
        rows[name] = dict(stats=stats, first_pass=time.perf_counter() - start)

    vocabulary = TrainingData(None, None, source_tokenizer.vocab_size, target_tokenizer.vocab_size,
                              tokenizers=(source_tokenizer, target_tokenizer))
    model_config = experiment.model_config(vocabulary.model_fields())
    keras.utils.set_random_seed(0)
    model = compile_model(experiment, model_config, vocabulary)
    model.fit(old_train.take(3), epochs=1, verbose=0)  # trace the step for a few shapes first
    speeds = {name: [] for name in datasets}
    for round_number in range(args.rounds):
        order = list(datasets) if round_number % 2 == 0 else list(datasets)[::-1]
        for name in order:
            dataset = datasets[name] if args.steps is None else datasets[name].take(args.steps)
            tokens = epoch_tokens(dataset, None)  # counted beforehand: not part of the timed epoch
            start = time.perf_counter()
            model.fit(dataset, epochs=1, verbose=0)
            speeds[name].append(tokens / (time.perf_counter() - start))
    old_name, new_name = datasets
    ratios = [new / old for new, old in zip(speeds[new_name], speeds[old_name])]

    print(f"\n{experiment.data.pipeline.get('train_source')} / {experiment.data.pipeline.get('train_target')}, "
          f"{config.tokens_per_batch} tokens a batch, max length {config.max_length}, bucket width "
          f"{config.bucket_width}; in-memory build (read, tokenize, plan) {old_build:.1f} s\n")
    print("| pipeline | batches an epoch | pairs | padding | largest batch (source / target positions) | "
          "first pass (s) | training, target tokens/s per round |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, row in rows.items():
        stats = row["stats"]
        print(f"| {name} | {stats.batches} | {stats.sentences} | {stats.padding_fraction:.1%} | "
              f"{stats.max_source_positions} / {stats.max_target_positions} | {row['first_pass']:.1f} | "
              f"{', '.join(f'{speed:.0f}' for speed in speeds[name])} |")
    print(f"\nstreamed / in memory, training speed per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
