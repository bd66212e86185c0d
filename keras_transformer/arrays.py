"""Training from packed token ids on any Keras backend: the path to a GPU machine without TensorFlow.

The `train` command's data pipeline is TensorFlow's (tf.data, tensorflow-text).
A machine with JAX or PyTorch and a GPU but no TensorFlow can still train the
same model from the same vocabulary, in two steps:

1. Where TensorFlow is installed, `keras-transformer pack --config C --workdir W`
   (`training.pack_arrays`) learns or loads the vocabulary exactly as `train`
   does and writes the tokenized training and validation pairs to
   `W/arrays.npz`, next to `experiment.yaml`, `model.yaml` and `data/vocab`.
2. On any backend, `python -m keras_transformer.arrays W` (`train_arrays`)
   trains from those arrays with token-budget batches built in numpy, writes
   one checkpoint per epoch to `W/checkpoints` (the `train` command's names),
   a resumable backup, `W/history.csv`, and the average of the last N epochs.

The workdir then serves every TensorFlow-side command unchanged:
`keras-transformer evaluate --model W --average N ...`, `export --workdir W`.

Batches: a pair's length is its longer side plus one (eos / bos), rounded up
to a multiple of `length_multiple`; the pairs are sorted by it and cut into
token-budget batches as the tf.data pipeline cuts them (`data.batching.batch_plan`):
a batch of width L (its longest rounded length) holds at most
`tokens_per_batch // L` pairs, and a width's leftover pairs start the next
batch, so only the epoch's last batch is partial. Batch widths are therefore
few (one per L), and with `pad_rows` so are the shapes, which is what XLA
(`jit_compile=True`, the default here, and the only fast way on a GPU) needs:
each new shape compiles once.

This module needs only keras, numpy and the package itself: no TensorFlow, which `training` imports only
inside the functions that use it (the checkpoint helpers reused here do not).
"""

import argparse
import csv
import json
import logging
import os
import pathlib
import time

import keras
import numpy as np
import yaml

from keras_transformer import decoding, distillation, evaluation
from keras_transformer.arguments import integer_at_least, number_at_least
from keras_transformer.config import TransformerConfig
from keras_transformer.data.packed import (ARRAYS_FILE, arrays_to_ragged, load_arrays, make_batches,  # noqa: F401
                                           ragged_to_arrays, save_arrays)
from keras_transformer.files import atomic_write
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.model import build_model
from keras_transformer.optimizers import make_optimizer
from keras_transformer.trainer.backup import resumed_seed
from keras_transformer.workdir import (average_checkpoints, latest_checkpoints, load_weights, save_weights,
                                       weights_only)

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ training
def _evaluate(model, batches):
    """Token-weighted validation loss and accuracy over `batches`."""
    total_loss = total_correct = total_tokens = 0.0
    for source, target_input, labels in batches:
        logs = model.test_on_batch({"source": source, "target": target_input}, labels, return_dict=True)
        tokens = float(np.count_nonzero(labels))
        total_loss += float(logs["loss"]) * tokens
        total_correct += float(logs.get("masked_accuracy", 0.0)) * tokens
        total_tokens += tokens
    return total_loss / max(total_tokens, 1.0), total_correct / max(total_tokens, 1.0)


def train_arrays(workdir, epochs=None, *, jit_compile=True, precision="float32", average_last=None,
                 length_multiple=8, tokens_per_batch=None, seed=None, keep_checkpoints=None, init_weights=None,
                 initial_updates=None, teacher=None, distill_weight=0.5, cooldown_epochs=None, verbose=1):
    """Trains the packed experiment in `workdir` (see `training.pack_arrays`), resuming a previous run.

    Args:
        workdir: a folder written by `pack_arrays` (`experiment.yaml`,
            `model.yaml`, `arrays.npz`).
        epochs: total epochs (default: the experiment's `training.epochs`).
        jit_compile: compile each step with XLA (the fast path on a GPU).
        precision: Keras dtype policy, e.g. `"mixed_bfloat16"` on a GPU.
        average_last: after training, average the last N epoch checkpoints into
            `checkpoints/average-last-N.weights.h5` (default: the experiment's
            `decoding.average_last`, if any).
        length_multiple: batch widths are multiples of it.
        tokens_per_batch: default: the experiment's `data.tokens_per_batch`.
        seed: default: the experiment's `training.seed`; epoch e shuffles with seed + e.
        keep_checkpoints: keep only the newest N epoch checkpoints (None: all).
        init_weights: start a new run from these weights (fine-tuning,
            distillation); ignored when resuming (default: the experiment's
            `training.init_checkpoint`, whose vocabulary `pack` took).
        initial_updates: a new run's optimizer starts at this update count, so
            the learning-rate schedule continues there (e.g. the updates the
            `init_weights` run made) instead of warming up again (default: the
            experiment's `training.initial_updates`, else 0).
        teacher: a `distillation.save_teacher` file made for this workdir:
            train with `distillation.DistillationLoss` towards it.
        distill_weight: the teacher term's weight w in that loss.
        cooldown_epochs: over the last K of the `epochs`, the learning rate
            falls linearly to zero (`schedules.LinearCooldown`), reaching it at
            the run's last update; the same arguments give the same schedule
            when the run resumes (default: the experiment's
            `training.cooldown_epochs`, if any).
        verbose: 1 logs a line per epoch.

    Returns:
        A dict: `history` (rows of `history.csv` written by this call),
        `checkpoints` (paths), `average` (path or None), `updates`, `seconds`,
        `target_tokens` (non-pad labels trained on by this call).

    Raises:
        FileNotFoundError: no `arrays.npz` / `model.yaml` in `workdir`, or
            no `init_weights` / `teacher` file.
        ValueError: a teacher file made for other training pairs.
    """

    workdir = pathlib.Path(workdir)
    for needed in ("model.yaml", "experiment.yaml"):
        if not (workdir / needed).is_file():
            raise FileNotFoundError(f"{workdir} is not a packed workdir: {workdir / needed} is missing "
                                    "(`keras-transformer pack` writes it).")
    experiment = yaml.safe_load((workdir / "experiment.yaml").read_text(encoding="utf-8")) or {}
    training_section, data_section = experiment.get("training", {}), experiment.get("data", {})
    epochs = int(epochs if epochs is not None else training_section.get("epochs", 1))
    seed = int(seed if seed is not None else training_section.get("seed", 0))
    if cooldown_epochs is None:
        cooldown_epochs = training_section.get("cooldown_epochs")
    if init_weights is None:
        init_weights = training_section.get("init_checkpoint")
    if initial_updates is None:
        initial_updates = training_section.get("initial_updates") or 0
    tokens_per_batch = int(tokens_per_batch or data_section.get("tokens_per_batch", 4096))
    if average_last is None:
        average_last = experiment.get("decoding", {}).get("average_last")
    splits = load_arrays(workdir / ARRAYS_FILE)
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    # pad_rows under XLA: one batch shape per width, so one compilation each
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id, pad_rows=jit_compile)
    teacher_arrays = distillation.load_teacher(teacher, splits["train"][1])[:2] if teacher else None
    valid_batches = (make_batches(*splits["valid"], tokens_per_batch, length_multiple=length_multiple, **special)
                     if "valid" in splits else None)

    cooldown = None
    if cooldown_epochs:
        if not 0 < int(cooldown_epochs) <= epochs:
            raise ValueError(f"cooldown_epochs must be between 1 and the run's {epochs} epochs, got {cooldown_epochs}.")
        counts = [len(make_batches(*splits["train"], tokens_per_batch, length_multiple=length_multiple,
                                   rng=np.random.default_rng(seed + epoch), **special)) for epoch in range(epochs)]
        first = epochs - int(cooldown_epochs)  # updates are counted from the new run's initial_updates
        cooldown = (int(initial_updates) + sum(counts[:first]), sum(counts[first:]))
        log.info("Cooldown: the learning rate falls linearly to 0 from update %d over %d updates", *cooldown)

    backup, state_path = workdir / "backup" / "arrays_latest.weights.h5", workdir / "backup" / "arrays_state.json"
    start_epoch = 0
    if state_path.is_file() and backup.is_file():
        start_epoch = int(json.loads(state_path.read_text())["epochs_done"])
    # Before the model is built: its dropout generators take their state from this seed. A resumed run gets a
    # seed of its own so that it does not repeat the first run's dropout masks (Keras does not save them).
    keras.utils.set_random_seed(resumed_seed(seed, start_epoch))
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        model = build_model(config)
        if teacher:
            loss = distillation.DistillationLoss(config.label_smoothing, distill_weight, pad_id=config.pad_id)
            metric = distillation.DistillationAccuracy(pad_id=config.pad_id)
        else:
            loss = LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id)
            metric = MaskedAccuracy(pad_id=config.pad_id)
        model.compile(optimizer=make_optimizer(config, cooldown=cooldown), loss=loss, metrics=[metric],
                      jit_compile=jit_compile)
        model.optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    weights_view = weights_only(model)  # epoch checkpoints hold the weights, not the optimizer (as `train` writes)

    if start_epoch:
        model.load_weights(str(backup))  # weights and optimizer state (step count included)
        log.info("Resuming after epoch %d from %s", start_epoch, backup)
    else:
        if init_weights:
            load_weights(weights_view, init_weights)  # weights only: the new run's optimizer starts fresh
            log.info("Starting from the weights in %s", init_weights)
        model.optimizer.iterations.assign(int(initial_updates))

    history_path, rows = workdir / "history.csv", []
    fields = ["epoch", "loss", "masked_accuracy", "val_loss", "val_masked_accuracy", "updates", "seconds",
              "target_tokens_per_s", "learning_rate"]
    checkpoints = []
    total_updates = total_tokens = 0
    seen_shapes = set()
    started = time.perf_counter()
    for epoch in range(start_epoch, epochs):
        batches = make_batches(*splits["train"], tokens_per_batch, length_multiple=length_multiple,
                               rng=np.random.default_rng(seed + epoch), teacher=teacher_arrays, **special)
        epoch_start = time.perf_counter()
        loss_sum = correct_sum = tokens = 0.0
        for source, target_input, labels in batches:
            new_shape = source.shape not in seen_shapes
            step_start = time.perf_counter()
            logs = model.train_on_batch({"source": source, "target": target_input}, labels, return_dict=True)
            if new_shape:  # the first step of a shape traces (and with XLA compiles) it: slow, worth knowing
                seen_shapes.add(source.shape)
                log.info("epoch %d: first batch of shape %s took %.1f s", epoch + 1, source.shape,
                         time.perf_counter() - step_start)
            count = float(np.count_nonzero(labels if labels.ndim == 2 else labels[..., 0]))
            loss_sum += float(logs["loss"]) * count
            correct_sum += float(logs["masked_accuracy"]) * count
            tokens += count
        seconds = time.perf_counter() - epoch_start
        if not np.isfinite(loss_sum):
            raise FloatingPointError(f"Training stopped: the loss became {loss_sum} in epoch {epoch + 1}; the last "
                                     f"good weights are in {workdir / 'checkpoints'}.")
        row = {"epoch": epoch + 1, "loss": loss_sum / tokens, "masked_accuracy": correct_sum / tokens,
               "val_loss": "", "val_masked_accuracy": "", "updates": int(model.optimizer.iterations.numpy()),
               "seconds": round(seconds, 2), "target_tokens_per_s": round(tokens / seconds, 1),
               "learning_rate": float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))}
        if valid_batches:
            row["val_loss"], row["val_masked_accuracy"] = _evaluate(model, valid_batches)
        checkpoint = workdir / "checkpoints" / f"ckpt-{epoch + 1:04d}.weights.h5"
        save_weights(model, checkpoint)
        atomic_write(backup, lambda path: model.save_weights(path))
        atomic_write(state_path, lambda path: pathlib.Path(path).write_text(json.dumps({"epochs_done": epoch + 1})))
        new_file = not history_path.is_file()
        with open(history_path, "a", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            if new_file:
                writer.writeheader()
            writer.writerow(row)
        rows.append(row)
        checkpoints.append(checkpoint)
        total_updates += len(batches)
        total_tokens += tokens
        if keep_checkpoints:
            existing = sorted((workdir / "checkpoints").glob("ckpt-[0-9][0-9][0-9][0-9].weights.h5"))
            for old in existing[:-int(keep_checkpoints)]:
                old.unlink()
        if verbose:
            log.info("epoch %d/%d: loss %.4f, accuracy %.4f, val_loss %s, %d updates, %.1f s, %.0f target tokens/s",
                     epoch + 1, epochs, row["loss"], row["masked_accuracy"], row["val_loss"], row["updates"],
                     seconds, row["target_tokens_per_s"])

    average_path = None
    if average_last:
        existing = sorted((workdir / "checkpoints").glob("ckpt-[0-9][0-9][0-9][0-9].weights.h5"))
        if existing:
            chosen = existing[-int(average_last):]
            average_checkpoints(chosen, weights_view)
            average_path = workdir / "checkpoints" / f"average-last-{int(average_last)}.weights.h5"
            save_weights(model, average_path)
            log.info("Averaged %d checkpoints (%s .. %s) into %s", len(chosen), chosen[0].name, chosen[-1].name,
                     average_path)
    return {"history": rows, "checkpoints": checkpoints, "average": average_path, "updates": total_updates,
            "seconds": time.perf_counter() - started, "target_tokens": int(total_tokens)}


# ------------------------------------------------------------------ scoring without TensorFlow
def _sentencepiece_processors(vocab_dir):
    """`(source, target)` SentencePiece processors of a workdir's `data/vocab` (shared or separate), no TensorFlow."""
    import sentencepiece  # the TensorFlow-free tokenizer, needed only for scoring here

    vocab_dir = pathlib.Path(vocab_dir)
    folders = [vocab_dir] if (vocab_dir / "tokenizer.json").is_file() else [vocab_dir / "source", vocab_dir / "target"]
    processors = []
    for folder in folders:
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"No tokenizer at {folder}: expected tokenizer.json (keras-transformer pack "
                                    "writes data/vocab).")
        settings = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        if settings.get("model_type") not in ("bpe", "unigram"):
            raise NotImplementedError(f"Scoring without TensorFlow reads SentencePiece vocabularies (bpe, unigram); "
                                      f"{folder} is {settings.get('model_type')!r}: use keras-transformer evaluate.")
        processors.append(sentencepiece.SentencePieceProcessor(model_file=str(folder / settings["model_file"])))
    return processors[0], processors[-1]


def translate_lines(model, lines, source_processor, target_processor, *, beam_size=4, alpha=0.6, max_extra=50,
                    batch_size=128, eos_id=3, pad_id=0, bos_id=2):
    """Beam search on raw sentences with SentencePiece processors, on any Keras backend (no TensorFlow).

    Does what `Translator.translate_lines` does: sentences are tokenized (at most
    `max_length - 1` tokens, then eos), decoded longest first in batches whose
    width is rounded up to a multiple of 8 (few shapes), and detokenized;
    blank lines translate to "".

    Args:
        model: a `build_model` model.
        lines: source sentences (str).
        source_processor, target_processor: `sentencepiece.SentencePieceProcessor`s.
        beam_size, alpha, max_extra: beam search settings (`decoding.beam_search`).
        batch_size: sentences per batch.
        eos_id, pad_id, bos_id: special ids.

    Returns:
        The translations, in the order of `lines`.
    """

    max_source = model.get_layer("source_position").max_length
    ids = [source_processor.encode(line)[:max_source - 1] + [eos_id] if line.strip() else [] for line in lines]
    order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: -len(ids[i]))
    translations = [""] * len(lines)
    for start in range(0, len(order), int(batch_size)):
        chunk = order[start:start + int(batch_size)]
        width = min(max_source, -(-len(ids[chunk[0]]) // 8) * 8)
        source = np.full((len(chunk), width), pad_id, np.int32)
        for row, index in enumerate(chunk):
            source[row, :len(ids[index])] = ids[index]
        tokens, _ = decoding.beam_search(model, source, beam_size=beam_size, alpha=alpha, max_extra=max_extra,
                                         pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
        tokens = keras.ops.convert_to_numpy(tokens)[:, 0]
        for row, index in enumerate(chunk):
            sentence = tokens[row].tolist()
            sentence = sentence[:sentence.index(eos_id)] if eos_id in sentence else sentence
            translations[index] = target_processor.decode([t for t in sentence if t not in (pad_id, bos_id)])
    return translations


def evaluate_arrays(workdir, checkpoint, source, reference, *, tokenized_reference=None, lang=None, beam_size=None,
                    alpha=None, max_extra=None, batch_size=128, output=None):
    """Translates `source` with a packed workdir's weights and scores it, without TensorFlow.

    The TensorFlow-free twin of `keras-transformer evaluate` for a machine that
    trains with `train_arrays` (a GPU machine with JAX): it reads the
    workdir's `model.yaml` and SentencePiece vocabulary, decodes with
    `decoding.beam_search` and scores with `evaluation.evaluate_translations`.
    Needs the `sentencepiece` package (and `sacremoses` for the Multi30k protocol).

    Args:
        workdir: a packed workdir (`keras-transformer pack`).
        checkpoint: a `.weights.h5` file (e.g. `checkpoints/average-last-10.weights.h5`).
        source, reference: text files, one sentence per line (plain or .gz).
        tokenized_reference, lang: optional `*.lc.norm.tok.*` references and
            the target language, for the published Multi30k protocol.
        beam_size, alpha, max_extra: default: the model config's decoding fields.
        batch_size: sentences decoded together.
        output: optional path to write the translations to.

    Returns:
        The dict of `evaluation.evaluate_translations` (cased and lowercased
        sacreBLEU, and `bleu_multi30k` with `tokenized_reference`).
    """

    workdir = pathlib.Path(workdir)
    config = TransformerConfig.from_yaml(workdir / "model.yaml")
    source_processor, target_processor = _sentencepiece_processors(workdir / "data" / "vocab")
    model = load_weights(build_model(config), checkpoint)
    lines = evaluation.read_lines(source)
    references = evaluation.read_lines(reference)
    hypotheses = translate_lines(
        model, lines, source_processor, target_processor,
        beam_size=config.beam_size if beam_size is None else beam_size,
        alpha=config.length_penalty if alpha is None else alpha,
        max_extra=config.max_decode_extra if max_extra is None else max_extra,
        batch_size=batch_size, eos_id=config.eos_id, pad_id=config.pad_id, bos_id=config.bos_id)
    hypotheses = [evaluation.one_line(h) for h in hypotheses]  # one line each in the output file, as scored
    if output:
        atomic_write(output, lambda path: pathlib.Path(path).write_text("".join(h + "\n" for h in hypotheses),
                                                                  encoding="utf-8"))
    tokenized = evaluation.read_lines(tokenized_reference) if tokenized_reference else None
    return evaluation.evaluate_translations(hypotheses, references, lang=lang, tokenized_references=tokenized)


def main(argv=None):
    """`python -m keras_transformer.arrays WORKDIR [--epochs N] [--precision P] ...`"""
    parser = argparse.ArgumentParser(prog="python -m keras_transformer.arrays",
                                     description="Train a packed workdir (keras-transformer pack) on any Keras backend.")
    positive, non_negative = integer_at_least(1), integer_at_least(0)
    parser.add_argument("workdir")
    parser.add_argument("--epochs", type=non_negative,
                        help="total epochs (default: the experiment's; a finished or smaller count trains nothing)")
    parser.add_argument("--precision", default="float32", help="Keras dtype policy, e.g. mixed_bfloat16 on a GPU")
    parser.add_argument("--no-jit", action="store_true", help="do not compile steps with XLA")
    parser.add_argument("--average-last", type=non_negative,
                        help="average the last N epoch checkpoints at the end (default: the experiment's; 0: none)")
    parser.add_argument("--tokens-per-batch", type=positive, help="default: the experiment's data.tokens_per_batch")
    parser.add_argument("--length-multiple", type=positive, default=8, help="batch widths are multiples of it")
    parser.add_argument("--keep-checkpoints", type=positive, help="keep only the newest N epoch checkpoints")
    parser.add_argument("--init-weights", help="start a new run from these weights (ignored when resuming; "
                                               "default: the experiment's training.init_checkpoint)")
    parser.add_argument("--initial-updates", type=non_negative,
                        help="a new run's schedule starts at this update count (e.g. the init run's updates; "
                             "default: the experiment's training.initial_updates, else 0)")
    parser.add_argument("--teacher", help="distil from this teacher file (python -m keras_transformer.distillation)")
    parser.add_argument("--distill-weight", type=float, default=0.5,
                        help="the teacher term's weight in the loss (default 0.5)")
    parser.add_argument("--cooldown-epochs", type=non_negative,
                        help="over the last K epochs the learning rate falls linearly to zero (default: the "
                             "experiment's training.cooldown_epochs; 0: none)")
    scoring = parser.add_argument_group("scoring instead of training (no TensorFlow needed)")
    scoring.add_argument("--evaluate", nargs=2, metavar=("SOURCE", "REFERENCE"),
                         help="translate SOURCE with --checkpoint and score it against REFERENCE")
    scoring.add_argument("--checkpoint", help="a .weights.h5 file (default: checkpoints/average-last-N.weights.h5 "
                         "with N from --average-last, else the newest epoch checkpoint)")
    scoring.add_argument("--tokenized-reference", help="*.lc.norm.tok.* references (Multi30k protocol)")
    scoring.add_argument("--lang", help="target language code, for the Multi30k protocol")
    scoring.add_argument("--beam-size", type=positive, help="default: the model config's")
    scoring.add_argument("--alpha", type=number_at_least(0),
                         help="length penalty exponent, >= 0; default: the model config's")
    scoring.add_argument("--max-extra", type=non_negative,
                         help="a translation's tokens beyond its source's length, at most; default: the model config's")
    scoring.add_argument("--output", help="write the translations to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        _run(args)
    except (FileNotFoundError, ValueError, NotImplementedError, FloatingPointError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")  # bad input: the message, not a traceback


def _run(args):
    """Scores (`--evaluate`) or trains, as `main` parsed."""
    if args.evaluate:
        folder = pathlib.Path(args.workdir) / "checkpoints"
        checkpoint = args.checkpoint or (folder / f"average-last-{args.average_last}.weights.h5" if args.average_last
                                         else latest_checkpoints(folder, 1)[0])
        scores = evaluate_arrays(args.workdir, checkpoint, *args.evaluate, tokenized_reference=args.tokenized_reference,
                                 lang=args.lang, beam_size=args.beam_size, alpha=args.alpha, max_extra=args.max_extra,
                                 output=args.output)
        print(json.dumps({k: round(v, 2) for k, v in scores.items()}))
        return
    result = train_arrays(args.workdir, args.epochs, jit_compile=not args.no_jit, precision=args.precision,
                          average_last=args.average_last, length_multiple=args.length_multiple,
                          tokens_per_batch=args.tokens_per_batch, keep_checkpoints=args.keep_checkpoints,
                          init_weights=args.init_weights, initial_updates=args.initial_updates, teacher=args.teacher,
                          cooldown_epochs=args.cooldown_epochs,
                          distill_weight=args.distill_weight)
    print(json.dumps({"backend": keras.config.backend(), "updates": result["updates"],
                      "seconds": round(result["seconds"], 1), "target_tokens": result["target_tokens"],
                      "average": str(result["average"]) if result["average"] else None}))


if __name__ == "__main__":
    main()
