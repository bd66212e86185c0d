"""Training from an experiment config: `train(config, workdir)`, `train_and_evaluate` and `pack_arrays`.

The user-facing functions of training, as the `train` and `pack` commands
run them. The YAML schema they read is `keras_transformer.experiment`; the loop
they hand their data to is `keras_transformer.trainer.loop`. Everything a run
writes lives in `workdir`:

```
workdir/
  experiment.yaml        the resolved experiment config (all four sections, every field)
  model.yaml             the TransformerConfig (`TransformerConfig.from_yaml`)
  data/                  built once: synthetic.npz, or vocab/ (the learned tokenizers)
  checkpoints/           ckpt-0001.weights.h5, ... one per epoch (weights only, no optimizer state);
                         step-XXXXXXXX.weights.h5 every N steps if asked; best.weights.h5 (best val_bleu)
  backup/                `ResumableBackup` state (weights + optimizer + epoch and batch): the same command
                         resumes here, its dropout and shuffling seeded by `resumed_seed(training.seed, ...)`
  logs/                  TensorBoard
  history.csv            one row per epoch, `epoch` (1-based) first; appended across resumes, never going back
  test.hyp.txt, test_scores.yaml   test translations and BLEU (`train_and_evaluate`, text data only)
  worker-1/ ...          the same files of the other workers of a multi-worker cluster
```

Run the same command again after any interruption (Ctrl-C, SIGKILL, a lost
machine) and training continues from the last backup: the last finished epoch,
or with `training.backup_every_steps` the last backed-up batch, after which the
interrupted epoch trains only the batches it had left (the run ends with the
updates of an uninterrupted one). Running it after training finished does
nothing (it logs how many epochs the workdir has); raise `training.epochs` to
train further.

Each name it uses comes from the module that defines it: `experiment.load_experiment`,
`errors.ConfigError`, `keras_transformer.load_translator`, ... (none is re-exported here).
"""

import dataclasses
import itertools
import logging
import os
import pathlib
import shutil
import time
import typing

import keras

from keras_transformer.data import corpus, pipeline, textfile
from keras_transformer.data.build import build_data, repeat_rows, tfds_pairs, tokenizers_for
from keras_transformer.engines.loader import load_translator
from keras_transformer.engines.tensorflow import Translator
from keras_transformer.errors import ConfigError
from keras_transformer.experiment import (
    DataSection,
    ExperimentConfig,
    as_experiment,
    changed_experiment,
    check_same_experiment,
    write_yaml,
)
from keras_transformer.files import exclusive_lock, remove_stale_temporaries, staging_folder
from keras_transformer.inference import evaluate
from keras_transformer.packed.data import ARRAYS_FILE, OLD_ARRAYS_FILE, ArraysWriter
from keras_transformer.trainer import distribute
from keras_transformer.trainer.backup import backup_position, backup_stream, resumed_seed
from keras_transformer.trainer.loop import TrainingData, TrainingResult, check_fresh_start, fit_experiment, summary
from keras_transformer.trainer.malloc import limit_malloc_arenas
from keras_transformer.trainer.precision import resolve_precision
from keras_transformer.workdir.checkpoints import write_model_file
from keras_transformer.workdir.layout import MODEL_CONFIG, adopt_vocabulary
from keras_transformer.workdir.provenance import IMPORT_RECORD, run_provenance, write_provenance

__all__ = ["pack_arrays", "train", "train_and_evaluate"]

log = logging.getLogger("keras_transformer")


def train(config: typing.Any, workdir: str | os.PathLike[str]) -> TrainingResult:
    """Trains the experiment `config` in `workdir`, resuming whatever an earlier run left there.

    Steps: pick the strategy (`training.strategy`) and the dtype policy; take
    the workdir's writer lock (`files.exclusive_lock`: a second run on it fails
    at once) and remove what a killed run left half-written; build the data and
    vocabulary once (kept in `workdir/data`); build and compile the model under
    the strategy scope (paper's Adam + Noam schedule, label-smoothed loss, token
    accuracy); restore the newest whole backup; `model.fit` with the resumable
    backup, per-epoch checkpoints, TensorBoard, `history.csv`, the progress bar
    and the guard that stops a non-finite loss before anything of its epoch is
    saved (docs/training.md, "What survives what").

    Under `multi_worker`, the chief writes to `workdir`; every other worker
    writes its checkpoints, backup, logs and history to `workdir/worker-<id>`
    (and locks that folder).

    Args:
        config: an `ExperimentConfig`, a dict of sections, or a YAML path.
        workdir: the run's folder (created if needed).

    Returns:
        A `TrainingResult`.

    Raises:
        ConfigError: a bad config, a missing data file, a workdir that holds another experiment, or one with
            epoch checkpoints but no backup.
        CheckpointError: an unreadable `training.init_checkpoint`, or no whole backup (the files are named).
        WorkdirBusyError: another process is writing to the workdir (it is named).
        FloatingPointError: the loss or a weight became non-finite (training stopped; nothing of that epoch
            was saved).

    Example:

    >>> result = train("configs/tiny_copy.yaml", "/tmp/kt_tiny")   # doctest: +SKIP
    >>> result.history["masked_accuracy"][-1] > 0.9                 # doctest: +SKIP
    True
    """
    experiment = as_experiment(config)
    experiment.check_model()  # before any data work: a bad model section or a missing file fails in seconds
    experiment.check_files()
    experiment.check_memory()  # before anything is written: a model this machine cannot hold
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    training = experiment.training
    limit_malloc_arenas(1)  # before TensorFlow's threads allocate: their freed memory is shared (trainer.malloc)

    # The strategy comes first: multi-worker and TPU strategies must configure TensorFlow before it runs ops.
    strategy = distribute.make_strategy(training.strategy, devices=training.devices,
                                        communication=training.communication)
    _, task_id, is_chief = distribute.task_info(strategy)
    output = workdir if is_chief else workdir / f"worker-{task_id}"
    output.mkdir(parents=True, exist_ok=True)
    log.info("Strategy: %s", distribute.describe(strategy))

    with exclusive_lock(output, "train"):  # one writer per workdir; the lock goes with this process
        for folder in (output, output / "checkpoints", output / "backup", output / "data"):
            remove_stale_temporaries(folder)  # what a killed run left half-written
        # A resumed run draws its dropout masks and its shuffling from a seed of its own: seeded as the first
        # run, it would repeat the first run's noise, example for example (Keras does not save the dropout state).
        resumed_at = backup_position(output / "backup")
        untrained = False
        if resumed_at == (0, 0):
            check_fresh_start(output)
            untrained = is_chief and not any((output / "checkpoints").glob("*.weights.h5"))
            if untrained:
                _replace_untrained_run(experiment, output)
        keras.utils.set_random_seed(resumed_seed(training.seed, *resumed_at))
        if resumed_at != (0, 0):
            log.info("Resuming from %s at epoch %d%s: dropout reseeded from training.seed and the position; text "
                     "data goes on where its stream stood", output / "backup", resumed_at[0] + 1,
                     f", batch {resumed_at[1] + 1}" if resumed_at[1] else "")
        policy = resolve_precision(training.policy, strategy)
        previous_policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            return _train(experiment, workdir, output, strategy, is_chief, policy, resumed_at, untrained)
        finally:
            keras.config.set_dtype_policy(previous_policy)


def _replace_untrained_run(experiment: ExperimentConfig, output: pathlib.Path) -> None:
    """Lets a run that never saved an update (no backup, no checkpoint: it stopped in its first epoch, or ran out
    of memory) start again with another model or data config: with another data config, its data folder (the
    vocabulary learned from the old data) is moved aside, then deleted, and built again; its model.yaml and
    experiment.yaml are replaced (atomically) when the new run writes its own."""
    changed = changed_experiment(output / "experiment.yaml", experiment.to_dict(), sections=("data",))
    if changed and (output / "data").exists():
        log.info("%s holds a run that never trained, with another data config (%s): its data and vocabulary are "
                 "built again", output, "; ".join(changed))
        aside = staging_folder(output / "data")
        os.replace(output / "data", aside)  # one rename: the old vocabulary is gone, or still whole
        shutil.rmtree(aside, ignore_errors=True)


def _train(experiment: ExperimentConfig, workdir: pathlib.Path, output: pathlib.Path, strategy: typing.Any,
           is_chief: bool, policy: str, resumed_at: tuple[int, int] = (0, 0),
           untrained: bool = False) -> TrainingResult:
    training = experiment.training
    if training.init_checkpoint and experiment.data.kind != "synthetic" and is_chief:
        adopt_vocabulary(training.init_checkpoint, workdir / "data" / "vocab")
    data = build_data(experiment.data, workdir / "data", strategy, training.batch_scaling, seed=training.seed,
                      wait_for_chief=not is_chief, resumed_at=resumed_at, steps_per_epoch=training.steps_per_epoch,
                      stream_start=backup_stream(output / "backup") if resumed_at != (0, 0) else None)
    model_config = experiment.model_config(data.model_fields())
    if training.rdrop_alpha:  # validation too: without dropout the copies agree, and the loss is the plain one
        data = dataclasses.replace(data, train=repeat_rows(data.train),
                                   validation=None if data.validation is None else repeat_rows(data.validation))
        log.info("R-Drop: every example runs twice per batch, alpha %g", training.rdrop_alpha)
    resolved = experiment.to_dict()
    resolved["model"] = model_config.to_dict()
    if not untrained:
        check_same_experiment(output / "experiment.yaml", resolved)
    elif changed_experiment(output / "experiment.yaml", resolved):  # a run that never trained: replaced
        log.info("%s holds a run that never trained, with another config: its model.yaml and experiment.yaml are "
                 "replaced", output)
    write_yaml(output / "experiment.yaml", resolved)
    write_model_file(output / MODEL_CONFIG, model_config, experiment.decoding.options)
    _carry_provenance(experiment, output)
    log.info("Model: %s; dtype policy %s", summary(model_config), policy)
    def make_translator(model: typing.Any, **options: typing.Any) -> Translator:
        # BLEU on validation decodes with the model being trained.
        # One search per batch of translate_lines (which bounds it): a model still learning runs its translations
        # to their length limit, and would pay for every chunk's full loop in turn (Translator, chunk_size).
        return Translator(model, *data.tokenizers, **{"chunk_size": 0, **options})
    try:
        return fit_experiment(experiment, model_config, data, output, strategy=strategy, resumed_at=resumed_at,
                              make_translator=make_translator if data.tokenizers is not None else None,
                              prepare=distribute.apply_keras_workarounds)
    except Exception as error:  # noqa: BLE001 - tf.data errors carry the reader's CorpusError as text
        data_error = pipeline.stream_error(error)
        if data_error is None:
            raise
        raise data_error from None


def _carry_provenance(experiment: ExperimentConfig, output: pathlib.Path) -> None:
    """A run from an import's weights or architecture keeps its import record (`workdir.provenance`): the
    source, the licence and the original files' hashes go on to its averages and exports."""
    record = run_provenance(experiment.training.init_checkpoint, experiment.model_from)
    if record is not None and not (output / IMPORT_RECORD).is_file():  # a resumed run keeps its own
        write_provenance(output, record)


def train_and_evaluate(config: typing.Any, workdir: str | os.PathLike[str]) -> tuple[TrainingResult, dict[str, float]]:
    """Trains (or resumes), then translates and scores the test data if the config names any.

    This is what `keras-transformer train` runs. The test translations go to
    `workdir/test.hyp.txt` and the scores to `workdir/test_scores.yaml`; with
    `decoding.average_last: N` the last N epoch checkpoints are averaged first
    (the paper's final models).

    Args:
        config: an `ExperimentConfig`, a dict of sections, or a YAML path.
        workdir: the run's folder.

    Returns:
        `(result, scores)`: a `TrainingResult` and a dict of BLEU scores (empty
        without test data or on non-chief workers).

    Example:

    >>> result, scores = train_and_evaluate("configs/multi30k_en_de.yaml", "runs/en_de")  # doctest: +SKIP
    >>> sorted(scores)                                                                   # doctest: +SKIP
    ['bleu', 'bleu_lowercase', 'bleu_multi30k', 'chrf', 'length_ratio']
    """
    experiment = as_experiment(config)
    result = train(experiment, workdir)
    data = experiment.data
    if data.kind == "synthetic" or pathlib.Path(result.workdir) != pathlib.Path(workdir):
        return result, {}
    with exclusive_lock(workdir, "train"):
        return result, _evaluate_test(experiment, workdir, result)


def _evaluate_test(experiment: ExperimentConfig, workdir: str | os.PathLike[str],
                   result: TrainingResult) -> dict[str, float]:
    """The test scores of a trained run (`train_and_evaluate`), written into `workdir`; {} without test data."""
    data = experiment.data
    sources: typing.Any
    references: typing.Any
    if data.kind == "text" and data.test_source:
        sources, references = data.test_source, data.test_target
    elif data.kind == "tfds" and data.tfds_test_split:
        sources, references = tfds_pairs(data, data.tfds_test_split)
    else:
        return {}
    decoding = experiment.decoding
    if decoding.average_last:
        translator = load_translator(workdir, average=decoding.average_last)
    else:
        source_tokenizer, target_tokenizer = result.tokenizers
        translator = Translator(result.model, source_tokenizer, target_tokenizer, decoding.options)
    scores = evaluate(translator, sources, references, tokenized_reference=data.test_tokenized_target,
                      lang=data.pipeline.get("target_language"), batch_size=decoding.batch_size,
                      output=pathlib.Path(workdir) / "test.hyp.txt")
    write_yaml(pathlib.Path(workdir) / "test_scores.yaml", scores)
    log.info("Test scores: %s", ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
    return scores


def pack_arrays(config: typing.Any, workdir: str | os.PathLike[str]) -> dict[str, int]:
    """Tokenizes an experiment's text data into `workdir/arrays/`, for `keras-transformer train-packed`.

    This is `keras-transformer pack`: the TensorFlow half of training on a
    machine without TensorFlow (a GPU machine with JAX, say). It learns or
    loads the vocabulary in `workdir/data/vocab` exactly as `train` does,
    tokenizes the training pairs (over-long ones dropped, as in training) and
    the validation pairs (over-long sides truncated), and writes them with
    `experiment.yaml` and `model.yaml`. The files are read, tokenized and
    written a chunk of pairs at a time (`PACK_CHUNK`), so packing holds one chunk
    in memory whatever the corpus size; the `.npy` files of `arrays/`
    (`packed.data.ArraysWriter`) are renamed into place when complete, and an
    unreleased version's `arrays.npz` is removed then. The folder then travels;
    `keras-transformer train-packed WORKDIR` trains it on any backend and
    every command that takes a workdir (evaluate, translate, export) reads the
    result here.

    Args:
        config: an `ExperimentConfig`, a dict of sections, or a YAML path (`data.kind: text`).
        workdir: the folder to write.

    Returns:
        A dict of counts: `train_pairs`, `valid_pairs`, `train_target_tokens`.

    Raises:
        ConfigError: not text data, or a workdir that holds another experiment.
    """
    experiment = as_experiment(config)
    section = experiment.data
    if section.kind != "text":
        raise ConfigError(f"pack needs data.kind: text (files), got {section.kind!r}.")
    if section.pipeline.get("corpora") is not None:
        raise ConfigError("pack writes one fixed set of pairs from data.train_source / train_target; data.corpora "
                          "mixes its corpora by weight without end, which packed arrays cannot hold: train them with "
                          "keras-transformer train.")
    experiment.check_model()
    experiment.check_files()  # the data files and training.init_checkpoint
    workdir = pathlib.Path(workdir)
    with exclusive_lock(workdir, "pack"):
        for folder in (workdir, workdir / "data"):
            remove_stale_temporaries(folder)
        return _pack(experiment, section, workdir)


PACK_CHUNK = 100_000  # sentence pairs `pack` reads, tokenizes and writes at a time


def _parallel_chunks(source_file: typing.Any, target_file: typing.Any, errors: str, size: int,
                     limit: typing.Optional[int] = None) -> typing.Iterator[tuple[list[str], list[str], typing.Any]]:
    """Streams two aligned files as `(sources, targets, summary)` chunks of at most `size` lines each, pairs with
    an empty side dropped as `corpus.read_parallel_corpus` drops them (the chunk's `CorpusSummary` counts them).
    With `limit`, only the first `limit` line pairs are read, as if the files ended there (`max_train_pairs`).

    Raises:
        corpus.CorpusError: invalid UTF-8 (file and line named), or one file ending before the other (both files
            and both line counts named).
    """
    names = os.fspath(source_file), os.fspath(target_file)
    with textfile.open_binary(source_file) as source_handle, textfile.open_binary(target_file) as target_handle:
        lines = [textfile.iter_stream(source_handle, names[0], errors),
                 textfile.iter_stream(target_handle, names[1], errors)]
        read = 0
        while True:
            take = size if limit is None else min(size, limit - read)
            try:
                chunk = list(itertools.islice(itertools.zip_longest(*lines), take)) if take > 0 else []
            except textfile.InvalidUTF8Error as error:
                raise corpus.CorpusError(f"{error}; fix the file or read it with errors='replace' to replace bad "
                                         "bytes with U+FFFD.") from None
            if not chunk:
                return
            if chunk[-1][0] is None or chunk[-1][1] is None:  # one file ended: count the other's remaining lines
                ended = 0 if chunk[-1][0] is None else 1
                counts = [read + sum(1 for pair in chunk if pair[side] is not None) for side in (0, 1)]
                counts[1 - ended] += sum(1 for _ in lines[1 - ended])
                raise corpus.CorpusError(
                    f"Misaligned parallel corpus: {names[0]} has {counts[0]} lines but {names[1]} has {counts[1]}; "
                    "line N of one file must translate line N of the other.")
            read += len(chunk)
            kept = [(s, t) for (s, s_bad), (t, t_bad) in chunk if s.strip() and t.strip()]
            replaced = sum(1 for (s, s_bad), (t, t_bad) in chunk if (s_bad or t_bad) and s.strip() and t.strip())
            summary = corpus.CorpusSummary(names[0], names[1], lines=len(chunk), empty=len(chunk) - len(kept),
                                           replaced=replaced)
            yield [s for s, _ in kept], [t for _, t in kept], summary


def _pack(experiment: ExperimentConfig, section: DataSection, workdir: pathlib.Path) -> dict[str, int]:
    data_config = section.data_config(tokenizer_dir=workdir / "data" / "vocab", seed=experiment.training.seed)
    if data_config.subword_dropout:
        raise ConfigError(f"data.subword_dropout={data_config.subword_dropout}: packed arrays hold one fixed "
                          "segmentation, so BPE-dropout cannot apply to them; train with keras-transformer train, "
                          "or pack with --set data.subword_dropout=0.")
    if experiment.training.rdrop_alpha:
        raise ConfigError(f"training.rdrop_alpha={experiment.training.rdrop_alpha}: training from packed arrays "
                          "(keras-transformer train-packed) does not implement R-Drop; train with keras-transformer "
                          "train, or pack with --set training.rdrop_alpha=null.")
    if experiment.training.init_checkpoint:
        adopt_vocabulary(experiment.training.init_checkpoint, workdir / "data" / "vocab")
    source_tokenizer, target_tokenizer = tokenizers_for(section, data_config, workdir / "data" / "vocab", False)
    vocabulary = TrainingData(None, None, source_tokenizer.vocab_size, target_tokenizer.vocab_size,
                              tokenizers=(source_tokenizer, target_tokenizer))
    model_config = experiment.model_config(vocabulary.model_fields())
    resolved = experiment.to_dict()
    resolved["model"] = model_config.to_dict()
    check_same_experiment(workdir / "experiment.yaml", resolved)

    counts = {"train_target_tokens": 0}
    with ArraysWriter(workdir / ARRAYS_FILE) as writer:
        for split, source_file, target_file, mode, limit in (
                ("train", data_config.train_source, data_config.train_target, "filter", data_config.max_train_pairs),
                ("valid", data_config.valid_source, data_config.valid_target, "truncate", None)):
            if source_file is None:
                continue
            start, summary = time.perf_counter(), corpus.CorpusSummary(os.fspath(source_file),
                                                                       os.fspath(typing.cast(str, target_file)))
            writer.add(split, [], [])  # the split's files exist even when no pair is kept
            for sources, targets, read in _parallel_chunks(source_file, target_file, data_config.errors, PACK_CHUNK,
                                                           limit):
                summary = dataclasses.replace(summary, lines=summary.lines + read.lines,
                                              empty=summary.empty + read.empty,
                                              replaced=summary.replaced + read.replaced)
                if not sources:
                    continue
                source_ids, target_ids, summary = corpus.limit_length(
                    pipeline.tokenize_corpus(source_tokenizer, sources),
                    pipeline.tokenize_corpus(target_tokenizer, targets), data_config.max_length, mode, summary)
                sides = [(ids.flat_values.numpy(), ids.row_lengths().numpy()) for ids in (source_ids, target_ids)]
                writer.add(split, *sides)
                if split == "train":
                    counts["train_target_tokens"] += int(sides[1][1].sum()) + len(sides[1][1])
            counts[f"{split}_pairs"] = summary.kept
            log.info("Packed %s in %.0f s: %s", split, time.perf_counter() - start, summary)
    (workdir / OLD_ARRAYS_FILE).unlink(missing_ok=True)  # an unreleased format's, replaced by arrays/
    write_yaml(workdir / "experiment.yaml", resolved)
    write_model_file(workdir / MODEL_CONFIG, model_config, experiment.decoding.options)
    _carry_provenance(experiment, workdir)
    return counts
