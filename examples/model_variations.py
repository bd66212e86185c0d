"""The paper's model variations (Table 3) and a small ablation, at Multi30k scale on the validation split.

Every row trains the same number of updates from scratch on Multi30k En-De
train (one shared BPE vocabulary, learned once and cached in the workdir), then
reports on the 1,014 validation pairs:

- perplexity: exp of the mean per-subword negative log-likelihood of the
  references under teacher forcing (no label smoothing, padding excluded);
- BLEU: greedy decoding (``--beam`` for beam search), cased sacreBLEU on
  detokenized text, and the lowercased Moses-tokenized Multi30k protocol
  against ``val.lc.norm.tok.de``;
- parameters (shared matrices counted once) and wall time.

Rows (``--rows``):

- ``table3``: the paper's Table 3 rows scaled to Multi30k around a base of
  4+4 layers, d_model 128, 4 heads, d_ff 512, dropout 0.3 (close to the
  project's Multi30k recipe): (A) number of heads at constant compute,
  (B) smaller key size, (C) depth and width, (D) dropout and label smoothing,
  (E) learned positions;
- ``ablation``: pre- vs post-norm, tied vs untied embeddings, label smoothing
  0 vs 0.1 (issue 7);
- ``all``: both (the base and "label smoothing 0" rows are shared).

The budget is a fixed number of updates per row (``--updates``), the same for
every row, with the Noam schedule warmed up over the first ``--warmup``
updates. A short budget favours small, lightly regularised models: read the
table as "what each change does early in training", not as converged results.

Results are appended to ``workdir/results.jsonl`` as rows finish; running the
same command again skips finished rows (same budget), so an interrupted run
resumes. Each row's weights, config and vocabulary are kept in
``workdir/rows/<row>/`` (loadable with `keras_transformer.load_translator`).

Usage::

    python examples/model_variations.py --rows all --updates 150 --workdir runs/model_variations
    python examples/model_variations.py --rows ablation --updates 20 --train-subset 2000 --val-subset 100  # smoke

Example (Python):

>>> rows = select_rows("ablation")   # doctest: +SKIP
>>> [row.name for row in rows]       # doctest: +SKIP
['base', 'pre_norm', 'untied', 'no_label_smoothing']
"""

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer import evaluation  # noqa: E402
from keras_transformer.data import pipeline  # noqa: E402
from keras_transformer.experiment import DataConfig, TrainingSection  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

# The base row: close to the project's Multi30k recipe (4+4 layers, d_model 128, dropout 0.3).
BASE = dict(num_layers=4, d_model=128, num_heads=4, d_ff=512, dropout=0.3, position="sinusoidal",
            norm_first=False, tie_embeddings="all", max_length=128)
BASE_TRAINING = dict(label_smoothing=0.1)  # its training settings besides the budget's schedule (`row_config`)


@dataclasses.dataclass(frozen=True)
class Row:
    """One model variation: its name, Table 3 group, changes to `BASE`, and the paper's finding."""

    name: str  # short id, also the folder name under workdir/rows
    group: str  # "base", "A".."E" (Table 3) or "ablation"
    changes: dict  # TransformerConfig fields that differ from BASE, or TrainingSection ones from BASE_TRAINING
    trend: str  # what the paper (or the literature) found for this change


ROWS = [
    Row("base", "base", {}, "reference (paper base: dev PPL 4.92, BLEU 25.8)"),
    # (A) heads at constant compute: d_k = d_v = d_model / h.
    Row("heads_1", "A", {"num_heads": 1}, "single head 0.9 BLEU worse than the best (24.9)"),
    Row("heads_8", "A", {"num_heads": 8}, "more heads with smaller d_k: fine up to a point, h=32 drops (25.4)"),
    # (B) smaller key size, values unchanged.
    Row("key_dim_16", "B", {"key_dim": 16, "value_dim": 32}, "reducing d_k hurts (d_k 16: PPL 5.16, BLEU 25.1)"),
    # (C) depth and width.
    Row("layers_2", "C", {"num_layers": 2}, "shallower is worse (N=2: PPL 6.11, BLEU 23.7)"),
    Row("layers_6", "C", {"num_layers": 6}, "deeper is better (N=8: PPL 4.88, BLEU 25.5)"),
    Row("d_model_256", "C", {"d_model": 256, "d_ff": 1024},
        "wider is better (d_model 1024: PPL 4.66, BLEU 26.0)"),
    # (D) dropout and label smoothing.
    Row("dropout_0", "D", {"dropout": 0.0}, "no dropout overfits: clearly worse (PPL 5.77, BLEU 24.6)"),
    Row("dropout_0.1", "D", {"dropout": 0.1}, "dropout 0.1 vs 0.2: about the same (25.8 vs 25.5)"),
    Row("no_label_smoothing", "D", {"label_smoothing": 0.0},
        "no smoothing: better PPL (4.67) but worse BLEU (25.3)"),
    # (E) learned positions.
    Row("learned_positions", "E", {"position": "learned"}, "learned positions nearly identical (PPL 4.92, BLEU 25.7)"),
    # Ablation (issue 7): normalization placement and weight tying.
    Row("pre_norm", "ablation", {"norm_first": True},
        "not in the paper (post-norm); pre-norm trains more stably, often a little worse when both converge"),
    Row("untied", "ablation", {"tie_embeddings": "none"},
        "paper ties embeddings and softmax (Press & Wolf 2017): fewer parameters, same or better quality"),
]
ROW_SETS = {
    "table3": [row.name for row in ROWS if row.group != "ablation"],
    "ablation": ["base", "pre_norm", "untied", "no_label_smoothing"],
    "all": [row.name for row in ROWS],
}


def select_rows(selection):
    """The rows for ``--rows``: a set name (``table3``, ``ablation``, ``all``) or comma-separated row names.

    Example:

    >>> [row.name for row in select_rows("base,untied")]
    ['base', 'untied']
    """
    names = ROW_SETS.get(selection, selection.split(","))
    by_name = {row.name: row for row in ROWS}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(f"Unknown row(s) {unknown}; choose from {sorted(ROW_SETS)} or {sorted(by_name)}.")
    return [by_name[name] for name in names]


# ------------------------------------------------------------------ data


@dataclasses.dataclass
class Data:
    """The shared vocabulary and the text the rows are trained and scored on."""

    tokenizer: object  # the shared SubwordTokenizer
    train_files: tuple  # (source, target) paths
    val_sources: list  # English validation sentences
    val_references: list  # German references (raw)
    val_tokenized: list  # lc.norm.tok German references (the Multi30k protocol)
    val_dataset: object  # teacher-forced batches for perplexity


def prepare_data(args):
    """Learns (once, cached in ``workdir/vocab``) the shared vocabulary and reads the validation split."""
    workdir = pathlib.Path(args.workdir)
    train_source, train_target = args.data / "train.en.gz", args.data / "train.de.gz"
    if args.train_subset:  # a smaller training file for smoke runs
        subset = workdir / f"train_subset_{args.train_subset}"
        subset.mkdir(parents=True, exist_ok=True)
        for source, name in ((train_source, "train.en"), (train_target, "train.de")):
            lines = evaluation.read_lines(source)[: args.train_subset]
            (subset / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        train_source, train_target = subset / "train.en", subset / "train.de"
    config = DataConfig(train_source=str(args.data / "train.en.gz"), train_target=str(args.data / "train.de.gz"),
                                 vocab_size=args.vocab_size, shared_vocab=True)
    tokenizer, _ = pipeline.load_or_train_tokenizers(config, workdir / "vocab")
    n = args.val_subset or None
    val_sources = evaluation.read_lines(args.data / "val.en.gz")[:n]
    val_references = evaluation.read_lines(args.data / "val.de.gz")[:n]
    val_tokenized = evaluation.read_lines(args.data / "val.lc.norm.tok.de.gz")[:n]
    val_dataset, _ = pipeline.make_dataset_from_texts(val_sources, val_references, tokenizer, tokenizer,
                                                      tokens_per_batch=args.tokens_per_batch, max_length=128,
                                                      training=False)
    return Data(tokenizer, (train_source, train_target), val_sources, val_references, val_tokenized, val_dataset)


# ------------------------------------------------------------------ one row


def row_config(row, args, vocab_size):
    """`(TransformerConfig, TrainingSection)` of a row: `BASE` and `BASE_TRAINING` with the row's changes, and
    the budget's schedule.

    The Noam schedule keeps its shape (so lr still scales with d_model^-0.5, as
    in the paper), warmed up over ``args.warmup`` updates; `learning_rate_scale`
    puts the base row's peak at ``args.peak_lr``.
    """
    scale = args.peak_lr / (BASE["d_model"] ** -0.5 * args.warmup ** -0.5)
    training_keys = {field.name for field in dataclasses.fields(TrainingSection)}
    model = {**BASE, **{key: value for key, value in row.changes.items() if key not in training_keys}}
    training = {**BASE_TRAINING, **{key: value for key, value in row.changes.items() if key in training_keys}}
    return (kt.TransformerConfig.from_dict({**model, "vocab_size": vocab_size}),
            TrainingSection(**training, warmup_steps=args.warmup, learning_rate_scale=scale))


def perplexity(model, dataset, pad_id=0):
    """exp(mean NLL per reference subword) under teacher forcing, in float64, padding excluded."""
    total, count = 0.0, 0
    for inputs, labels in dataset:
        logits = np.asarray(model(inputs, training=False), dtype="float64")  # (B, T, V)
        labels = np.asarray(labels)
        log_norm = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)  # (B, T)
        gold = np.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]  # (B, T)
        mask = labels != pad_id
        total += float(np.sum((log_norm - gold)[mask]))
        count += int(mask.sum())
    return math.exp(total / count)


class Progress(keras.callbacks.Callback):
    """Prints the running loss every `every` updates."""

    def __init__(self, name, every):
        super().__init__()
        self.name, self.every, self.start = name, every, time.time()

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every == 0:
            print(f"  [{self.name}] update {batch + 1}: loss {logs['loss']:.3f} "
                  f"({time.time() - self.start:.0f} s)", flush=True)


def run_row(row, args, data):
    """Trains one row for the budget and scores it on the validation split; returns a dict of results."""
    from keras_transformer.engines.tensorflow import Translator

    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)
    config, training = row_config(row, args, data.tokenizer.vocab_size)
    train, summary = pipeline.make_dataset(*data.train_files, data.tokenizer, data.tokenizer,
                                           tokens_per_batch=args.tokens_per_batch, max_length=config.max_length,
                                           training=True, seed=args.seed)
    model = kt.build_model(config)
    model.compile(optimizer=kt.make_optimizer(config, training),
                  loss=kt.LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=config.pad_id),
                  jit_compile=args.jit_compile)
    start = time.time()
    history = model.fit(train.repeat(), steps_per_epoch=args.updates, epochs=1, verbose=0,
                        callbacks=[Progress(row.name, args.log_every)])
    train_seconds = time.time() - start

    start = time.time()
    ppl = perplexity(model, data.val_dataset, config.pad_id)
    translator = Translator(model, data.tokenizer, beam_size=args.beam, alpha=0.6 if args.beam > 1 else 0.0,
                            max_extra=50)
    hypotheses = translator.translate_lines(data.val_sources, batch_size=args.decode_batch)
    scores = evaluation.evaluate_translations(hypotheses, data.val_references, lang="de",
                                              tokenized_references=data.val_tokenized)
    eval_seconds = time.time() - start

    folder = pathlib.Path(args.workdir) / "rows" / row.name
    folder.mkdir(parents=True, exist_ok=True)
    config.save_yaml(folder / "model.yaml")
    model.save_weights(folder / "model.weights.h5")
    data.tokenizer.save(folder / "vocab")
    (folder / "val.hyp.de").write_text("".join(evaluation.one_line(h) + "\n" for h in hypotheses), encoding="utf-8")
    keras.config.set_dtype_policy("float32")
    return {"row": row.name, "group": row.group, "updates": args.updates, "tokens_per_batch": args.tokens_per_batch,
            "params": int(model.count_params()), "train_loss": float(history.history["loss"][-1]),
            "val_ppl": ppl, "bleu": scores["bleu"], "bleu_multi30k": scores["bleu_multi30k"],
            "train_seconds": train_seconds, "eval_seconds": eval_seconds, "precision": args.precision,
            "jit_compile": args.jit_compile, "beam": args.beam, "train_pairs": summary.kept,
            "load_average": os.getloadavg()[0], "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "example": hypotheses[0]}


# ------------------------------------------------------------------ table


def describe(row):
    """The row's change in words, e.g. "h=1, d_k=128"."""
    if not row.changes:
        return "4+4 layers, d_model 128, h=4 (d_k 32), d_ff 512, dropout 0.3, ls 0.1"
    parts = []
    for key, value in row.changes.items():
        if key == "num_heads":
            parts.append(f"h={value}, d_k={BASE['d_model'] // value}")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def format_table(results, rows):
    """A Markdown table of the results of `rows` (those that have finished), in row order."""
    base = results.get("base")
    lines = ["| row | change | params | val PPL | BLEU (sacreBLEU) | BLEU (lc.tok) | minutes | paper's trend |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        result = results.get(row.name)
        if result is None:
            continue
        delta = ""
        if base is not None and row.name != "base":
            delta = f" ({result['bleu'] - base['bleu']:+.1f})"
        minutes = (result["train_seconds"] + result["eval_seconds"]) / 60
        label = "base" if row.group == "base" else f"{row.group}: {row.name}"
        lines.append(f"| {label} | {describe(row)} | {result['params'] / 1e6:.2f}M | {result['val_ppl']:.2f} | "
                     f"{result['bleu']:.1f}{delta} | {result['bleu_multi30k']:.1f} | {minutes:.1f} | {row.trend} |")
    return "\n".join(lines)


def read_results(path, updates):
    """Finished rows of `path` (results.jsonl) trained with the same budget, by row name."""
    results = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                result = json.loads(line)
                if result["updates"] == updates:
                    results[result["row"]] = result
    return results


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", default="all", help="table3, ablation, all, or comma-separated row names")
    parser.add_argument("--updates", type=int, default=150, help="training updates per row (the budget)")
    parser.add_argument("--warmup", type=int, default=None, help="Noam warmup updates (default: updates // 6)")
    parser.add_argument("--peak-lr", type=float, default=1.5e-3, help="the base row's peak learning rate")
    parser.add_argument("--tokens-per-batch", type=int, default=2048, help="source and target positions per batch")
    parser.add_argument("--vocab-size", type=int, default=8000, help="shared BPE vocabulary size")
    parser.add_argument("--beam", type=int, default=1, help="beam size for BLEU (1: greedy)")
    parser.add_argument("--decode-batch", type=int, default=256, help="sentences per decoding batch")
    parser.add_argument("--precision", default="mixed_bfloat16", help="Keras dtype policy")
    parser.add_argument("--jit-compile", action="store_true",
                        help="XLA-compile the train step (one compilation per batch shape: slow to start)")
    parser.add_argument("--train-subset", type=int, default=0, help="train on the first N pairs only (smoke runs)")
    parser.add_argument("--val-subset", type=int, default=0, help="score the first N validation pairs only")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N updates")
    parser.add_argument("--data", type=pathlib.Path, default=MULTI30K, help="the Multi30k folder")
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "model_variations"))
    args = parser.parse_args(argv)
    args.warmup = args.warmup or max(1, args.updates // 6)
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = select_rows(args.rows)
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    results_path = workdir / "results.jsonl"
    results = read_results(results_path, args.updates)
    print(f"{datetime.date.today()}: {len(rows)} row(s), {args.updates} updates of <= {args.tokens_per_batch} "
          f"tokens each (warmup {args.warmup}, base peak lr {args.peak_lr}), {args.precision}, "
          f"jit_compile={args.jit_compile}, BLEU with {'greedy' if args.beam == 1 else f'beam {args.beam}'} "
          f"decoding on {args.val_subset or 'all'} validation pairs", flush=True)
    data = prepare_data(args)
    for row in rows:
        if row.name in results:
            print(f"{row.name}: done before, skipped", flush=True)
            continue
        print(f"{row.name}: {describe(row)}", flush=True)
        result = run_row(row, args, data)
        results[row.name] = result
        with open(results_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
        print(f"{row.name}: {result['params'] / 1e6:.2f}M params, val PPL {result['val_ppl']:.2f}, "
              f"BLEU {result['bleu']:.1f} (lc.tok {result['bleu_multi30k']:.1f}), "
              f"train {result['train_seconds']:.0f} s, "
              f"eval {result['eval_seconds']:.0f} s; e.g. {result['example']!r}", flush=True)
    print()
    print(format_table(results, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
