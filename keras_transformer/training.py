"""Training from an experiment config: `train(config, workdir)` and the YAML schema it reads.

An experiment config has four sections, each a frozen dataclass below:

```yaml
model:      # TransformerConfig fields, or `preset: tiny|small|base|big` plus overrides
  preset: tiny
data:       # where sentence pairs come from (DataSection)
  kind: synthetic
training:   # epochs, strategy, precision, checkpoints (TrainingSection)
  epochs: 8
decoding:   # beam search settings written into the saved TransformerConfig (DecodingSection)
  beam_size: 4
```

`load_experiment(paths, overrides)` reads one or more YAML files (later files
override earlier ones key by key) and then `--set section.key=value` overrides
(later values win). Unknown keys are rejected with the key named.

`train(config, workdir)` is what `keras-transformer train` calls. Everything it
writes lives in `workdir`:

```
workdir/
  experiment.yaml        the resolved experiment config (all four sections, every field)
  model.yaml             the TransformerConfig (`TransformerConfig.from_yaml`)
  data/                  built once: synthetic arrays, or the vocabulary (tokenizer assets)
  checkpoints/           ckpt-0001.weights.h5, ... one per epoch (weights only); step-*.weights.h5 if asked
  backup/                BackupAndRestore state: running the same command again resumes here
  logs/                  TensorBoard
  history.csv            one row per epoch, `epoch` first; appended across resumes, epochs never go back
```

Run the same command again after any interruption (Ctrl-C, SIGKILL, a lost
machine) and training continues from the last finished epoch. Running it after
training finished does nothing; raise `training.epochs` to train further.

This module is TensorFlow-specific (tf.data, tf.distribute); the model code never imports it.
"""

import csv
import dataclasses
import difflib
import logging
import os
import pathlib
import time
import typing

import keras
import numpy as np
import yaml

from keras_transformer.config import TransformerConfig

log = logging.getLogger("keras_transformer")

DATA_KINDS = ("synthetic", "text", "tfds")
PRECISIONS = ("float32", "auto", "mixed_float16", "mixed_bfloat16")
SECTIONS = ("model", "data", "training", "decoding")


class ConfigError(ValueError):
    """An experiment config that cannot be used; the message names the key or file."""


class CheckpointError(RuntimeError):
    """A checkpoint or training backup that is missing or cannot be read; the message names the file."""


# ------------------------------------------------------------------ config schema
@dataclasses.dataclass(frozen=True)
class DataSection:
    """Where the sentence pairs come from and how they are batched.

    `kind: synthetic` trains on the copy/reverse task of
    `keras_transformer.data.synthetic` (no files, no tokenizer). `kind: text`
    reads parallel text files; `kind: tfds` reads a TensorFlow Datasets
    translation set (needs `pip install tensorflow-datasets` and internet).
    Both text kinds learn a subword vocabulary once, store it in
    `workdir/data/vocab`, and batch with `keras_transformer.data.pipeline`.

    Example:

    >>> DataSection(kind="synthetic", task="reverse").vocab_size
    32
    """

    kind: str = "synthetic"  # "synthetic", "text" (parallel files) or "tfds" (TensorFlow Datasets)
    # --- synthetic task ---------------------------------------------------------
    task: str = "copy"  # "copy" or "reverse"
    vocab_size: int = 32  # synthetic vocabulary, reserved ids included
    train_examples: int = 2000  # synthetic training pairs
    val_examples: int = 256  # synthetic validation pairs
    min_length: int = 3  # shortest synthetic sequence
    max_length: int = 10  # longest synthetic sequence
    seed: int = 0  # seed of the synthetic pairs
    batch_size: int = 64  # synthetic: sentences per batch (see training.batch_scaling)
    shuffle: bool = True  # synthetic: reshuffle the training pairs every epoch
    # --- parallel text files (kind: text) ---------------------------------------
    train_source: typing.Optional[str] = None  # plain or .gz, one sentence per line
    train_target: typing.Optional[str] = None
    val_source: typing.Optional[str] = None
    val_target: typing.Optional[str] = None
    test_source: typing.Optional[str] = None  # evaluated with BLEU after training, if given
    test_target: typing.Optional[str] = None
    # --- TensorFlow Datasets (kind: tfds) ---------------------------------------
    tfds_name: typing.Optional[str] = None  # e.g. "wmt14_translate/de-en"
    tfds_train_split: str = "train"
    tfds_val_split: str = "validation"
    tfds_test_split: str = "test"
    source_language: typing.Optional[str] = None  # tfds feature of the source side, e.g. "en"
    target_language: typing.Optional[str] = None  # tfds feature of the target side, e.g. "de"
    tfds_max_examples: typing.Optional[int] = None  # read at most this many training pairs
    # --- tokenizer and tf.data pipeline (kind: text or tfds) ---------------------
    pipeline: dict = dataclasses.field(default_factory=dict)  # fields of data.pipeline.DataConfig

    def validate(self):
        """Raises `ConfigError` naming the first bad field."""
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"data.kind must be one of {DATA_KINDS}, got {self.kind!r}.")
        if self.kind == "synthetic":
            from keras_transformer.data.synthetic import TASKS
            if self.task not in TASKS:
                raise ConfigError(f"data.task must be one of {TASKS}, got {self.task!r}.")
            for name in ("vocab_size", "train_examples", "val_examples", "min_length", "max_length",
                         "batch_size"):
                if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                    raise ConfigError(f"data.{name} must be a positive integer, got {getattr(self, name)!r}.")
            if self.min_length > self.max_length:
                raise ConfigError(f"data.min_length={self.min_length} exceeds data.max_length={self.max_length}.")
        if self.kind == "text":
            for name in ("train_source", "train_target"):
                if not getattr(self, name):
                    raise ConfigError(f"data.kind 'text' needs data.{name} (a file path).")
            if bool(self.val_source) != bool(self.val_target):
                raise ConfigError("data.val_source and data.val_target must be given together.")
            if bool(self.test_source) != bool(self.test_target):
                raise ConfigError("data.test_source and data.test_target must be given together.")
        if self.kind == "tfds":
            for name in ("tfds_name", "source_language", "target_language"):
                if not getattr(self, name):
                    raise ConfigError(f"data.kind 'tfds' needs data.{name}.")
        if not isinstance(self.pipeline, dict):
            raise ConfigError(f"data.pipeline must be a mapping of DataConfig fields, got {self.pipeline!r}.")


@dataclasses.dataclass(frozen=True)
class TrainingSection:
    """How to train: length, hardware, precision, checkpoints.

    Example:

    >>> TrainingSection(epochs=3, strategy="mirrored").batch_scaling
    'per_replica'
    """

    epochs: int = 10  # epochs in total (a resumed run counts the ones already done)
    steps_per_epoch: typing.Optional[int] = None  # None: one pass over the training data
    strategy: str = "auto"  # see keras_transformer.distribute.STRATEGIES
    devices: typing.Optional[list] = None  # devices for "mirrored" / "one_device", e.g. ["/gpu:0", "/gpu:1"]
    communication: str = "auto"  # multi_worker all-reduce: "auto", "ring" or "nccl"
    batch_scaling: str = "per_replica"  # data batch sizes are "per_replica" or "global" (docs/distributed.md)
    mixed_precision: typing.Any = "float32"  # "float32", "auto", "mixed_float16", "mixed_bfloat16" (or bool)
    jit_compile: typing.Any = "auto"  # XLA: true, false or "auto" (Keras decides)
    steps_per_execution: int = 1  # batches per tf.function call (fewer Python round trips)
    gradient_accumulation_steps: int = 1  # accumulate gradients over this many batches per update
    clipnorm: typing.Optional[float] = None  # clip each gradient to this norm
    seed: int = 1234  # keras.utils.set_random_seed: initial weights, dropout, shuffling
    checkpoint_every_steps: typing.Optional[int] = None  # also write checkpoints/step-XXXXXXXX.weights.h5
    keep_step_checkpoints: int = 3  # how many step checkpoints to keep
    keep_checkpoints: typing.Optional[int] = None  # epoch checkpoints to keep; None keeps all (for averaging)
    backup_every_steps: typing.Optional[int] = None  # BackupAndRestore every N batches; None: each epoch
    init_checkpoint: typing.Optional[str] = None  # start from these weights (fine-tuning)
    validation: bool = True  # evaluate on the validation data after each epoch
    tensorboard: bool = True  # write TensorBoard logs to workdir/logs
    verbose: typing.Any = "auto"  # Keras progress: "auto", 0 (silent), 1 (bar), 2 (one line per epoch)

    def validate(self):
        """Raises `ConfigError` naming the first bad field."""
        from keras_transformer import distribute
        if not isinstance(self.epochs, int) or self.epochs <= 0:
            raise ConfigError(f"training.epochs must be a positive integer, got {self.epochs!r}.")
        if self.strategy not in distribute.STRATEGIES:
            raise ConfigError(f"training.strategy must be one of {distribute.STRATEGIES}, got {self.strategy!r}.")
        if self.batch_scaling not in distribute.BATCH_SCALINGS:
            raise ConfigError(f"training.batch_scaling must be one of {distribute.BATCH_SCALINGS}, "
                              f"got {self.batch_scaling!r}.")
        if self.mixed_precision not in PRECISIONS + (True, False, None):
            raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS} or a bool, "
                              f"got {self.mixed_precision!r}.")
        if self.jit_compile not in (True, False, "auto"):
            raise ConfigError(f"training.jit_compile must be true, false or 'auto', got {self.jit_compile!r}.")
        if self.verbose not in ("auto", 0, 1, 2):
            raise ConfigError(f"training.verbose must be 'auto', 0, 1 or 2, got {self.verbose!r}.")
        for name in ("steps_per_epoch", "checkpoint_every_steps", "keep_checkpoints", "backup_every_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(f"training.{name} must be a positive integer or null, got {value!r}.")
        for name in ("steps_per_execution", "gradient_accumulation_steps", "keep_step_checkpoints"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"training.{name} must be a positive integer, got {value!r}.")

    @property
    def policy(self):
        """The requested dtype policy name, before "auto" is resolved for the device."""
        if self.mixed_precision in (False, None):
            return "float32"
        if self.mixed_precision is True:
            return "auto"
        return self.mixed_precision


@dataclasses.dataclass(frozen=True)
class DecodingSection:
    """Decoding settings; non-null values replace the TransformerConfig's decoding fields.

    They are written into `workdir/model.yaml`, so evaluation, translation and
    export use them.

    Example:

    >>> DecodingSection(beam_size=5).overrides()
    {'beam_size': 5}
    """

    beam_size: typing.Optional[int] = None  # beam width; 1 means greedy (paper: 4)
    length_penalty: typing.Optional[float] = None  # GNMT alpha (paper: 0.6)
    max_decode_extra: typing.Optional[int] = None  # decode at most source length + this (paper: 50)
    batch_size: int = 64  # sentences decoded together when evaluating

    def validate(self):
        """Raises `ConfigError` naming the first bad field."""
        if not isinstance(self.batch_size, int) or self.batch_size <= 0:
            raise ConfigError(f"decoding.batch_size must be a positive integer, got {self.batch_size!r}.")

    def overrides(self):
        """The TransformerConfig fields this section sets."""
        names = ("beam_size", "length_penalty", "max_decode_extra")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: `model` (a dict of TransformerConfig fields and an optional
    `preset`), `data`, `training` and `decoding`.

    Example:

    >>> experiment = ExperimentConfig.from_dict({"model": {"preset": "tiny"}, "training": {"epochs": 2}})
    >>> experiment.training.epochs, experiment.data.kind
    (2, 'synthetic')
    """

    model: dict = dataclasses.field(default_factory=dict)
    data: DataSection = dataclasses.field(default_factory=DataSection)
    training: TrainingSection = dataclasses.field(default_factory=TrainingSection)
    decoding: DecodingSection = dataclasses.field(default_factory=DecodingSection)

    @classmethod
    def from_dict(cls, values):
        """Builds and validates an experiment from nested dicts, rejecting unknown keys by name."""
        values = dict(values or {})
        _reject_unknown(values, SECTIONS, "")
        model = dict(values.get("model") or {})
        _reject_unknown(model, [f.name for f in dataclasses.fields(TransformerConfig)] + ["preset"], "model.")
        if "preset" in model:
            from keras_transformer.config import PRESETS
            if model["preset"] not in PRESETS:
                raise ConfigError(f"model.preset must be one of {sorted(PRESETS)}, got {model['preset']!r}.")
        sections = {}
        for name, section_class in (("data", DataSection), ("training", TrainingSection),
                                    ("decoding", DecodingSection)):
            section_values = values.get(name) or {}
            if not isinstance(section_values, dict):
                raise ConfigError(f"Section {name!r} must be a mapping, got {section_values!r}.")
            _reject_unknown(section_values, [f.name for f in dataclasses.fields(section_class)], f"{name}.")
            sections[name] = section_class(**section_values)
            sections[name].validate()
        return cls(model=model, **sections)

    def to_dict(self):
        """Nested plain dicts (YAML-friendly)."""
        return {"model": dict(self.model), "data": dataclasses.asdict(self.data),
                "training": dataclasses.asdict(self.training), "decoding": dataclasses.asdict(self.decoding)}

    def model_config(self, vocab_size=None):
        """The `TransformerConfig`: preset (if any), then the model fields, then the decoding overrides.

        Args:
            vocab_size: the data's vocabulary size, used when the model section gives none.
        """
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        if vocab_size is not None:
            given = fields.get("vocab_size")
            if given is not None and given < vocab_size:
                raise ConfigError(f"model.vocab_size={given} is smaller than the data's vocabulary ({vocab_size}).")
            fields.setdefault("vocab_size", vocab_size)
        fields.update(self.decoding.overrides())
        try:
            if preset is not None:
                return TransformerConfig.preset(preset, **fields)
            return TransformerConfig.from_dict(fields)
        except ValueError as error:
            raise ConfigError(f"model: {error}") from error


def _reject_unknown(values, known, prefix):
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'The experiment config'} must be a mapping, got {values!r}.")
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" Did you mean {prefix}{close[0]!r}?" if close else ""
            raise ConfigError(f"Unknown config key {prefix}{key!r}.{hint} "
                              f"Known keys{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(known)}.")


def _deep_merge(base, update):
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "pipeline":
            merged[key] = _deep_merge(merged[key], value)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def parse_override(text):
    """Parses one `--set` argument `section.key=value` into `(["section", "key"], value)`.

    The value is read as YAML, so `3`, `0.1`, `true`, `null` and `[a, b]` get their types.

    Example:

    >>> parse_override("training.epochs=3")
    (['training', 'epochs'], 3)
    >>> parse_override("model.preset=tiny")
    (['model', 'preset'], 'tiny')
    """
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}.")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".")]
    if len(path) < 2 or not all(path):
        raise ConfigError(f"--set key must look like section.key (e.g. training.epochs), got {key!r}.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML ({error}).") from error
    return path, value


def load_experiment(paths=(), overrides=()):
    """Reads YAML experiment files and `--set` overrides into an `ExperimentConfig`.

    Args:
        paths: YAML files (a single path is accepted too); later files override earlier ones.
        overrides: `"section.key=value"` strings applied in order, so later ones win.

    Returns:
        A validated `ExperimentConfig`.

    Raises:
        ConfigError: a missing or unreadable file, an unknown key (named), or a bad value.

    Example:

    >>> experiment = load_experiment("configs/tiny_copy.yaml", ["training.epochs=2", "training.epochs=3"])
    >>> experiment.training.epochs
    3
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    values = {}
    for path in paths:
        path = pathlib.Path(path)
        if not path.is_file():
            raise ConfigError(f"Config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML ({error}).") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping with sections {SECTIONS}, got {type(loaded).__name__}.")
        try:
            ExperimentConfig.from_dict(loaded)  # name the file that holds a bad key
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from error
        values = _deep_merge(values, loaded)
    for text in overrides:
        keys, value = parse_override(text)
        target = values
        for key in keys[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[keys[-1]] = value
    return ExperimentConfig.from_dict(values)


def as_experiment(config):
    """Accepts an `ExperimentConfig`, a dict or a YAML path and returns an `ExperimentConfig`."""
    if isinstance(config, ExperimentConfig):
        return config
    if isinstance(config, dict):
        return ExperimentConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return load_experiment([config])
    raise TypeError(f"Expected an ExperimentConfig, a dict or a YAML path, got {type(config).__name__}.")


# ------------------------------------------------------------------ checkpoints
def load_weights(model, path):
    """Loads a `.weights.h5` checkpoint into `model`, with errors that name the file.

    Args:
        model: a model from `build_model`.
        path: a checkpoint such as `workdir/checkpoints/ckpt-0008.weights.h5`.

    Raises:
        CheckpointError: the file is missing, is not a readable HDF5 weights file,
            or holds weights of another shape (another config).

    Example:

    >>> import tempfile, keras
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> load_weights(model, tempfile.mkdtemp() + "/missing.weights.h5")
    Traceback (most recent call last):
    ...
    keras_transformer.training.CheckpointError: Checkpoint not found: .../missing.weights.h5
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint not found: {path}")
    try:
        model.load_weights(str(path))
    except OSError as error:
        raise CheckpointError(f"Checkpoint {path} is corrupt or truncated and cannot be read ({error}).") from error
    except ValueError as error:
        raise CheckpointError(f"Checkpoint {path} does not match this model "
                              f"(was it written with another config?): {error}") from error


def epoch_checkpoints(workdir):
    """The per-epoch checkpoints in `workdir/checkpoints`, oldest first.

    Example:

    >>> epoch_checkpoints("/nonexistent")
    []
    """
    return sorted(pathlib.Path(workdir, "checkpoints").glob("ckpt-[0-9][0-9][0-9][0-9].weights.h5"))


def _atomic_save_weights(model, path):
    """Writes weights next to `path` and renames, so a kill never leaves a half-written checkpoint."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name[:-len('.weights.h5')]}.tmp.weights.h5")
    model.save_weights(str(temporary), overwrite=True)
    os.replace(temporary, path)


# ------------------------------------------------------------------ callbacks
class EpochCheckpoint(keras.callbacks.Callback):
    """Saves `checkpoints/ckpt-{epoch:04d}.weights.h5` (1-based) at the end of each epoch.

    Each file is written under a temporary name and renamed, so an interrupted
    run never leaves a truncated checkpoint. With `keep` only the newest `keep`
    files stay.

    Args:
        directory: the checkpoint folder.
        keep: how many epoch checkpoints to keep; None keeps all.
    """

    def __init__(self, directory, keep=None):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        _atomic_save_weights(self.model, self.directory / f"ckpt-{epoch + 1:04d}.weights.h5")
        if self.keep:
            for old in epoch_checkpoints(self.directory.parent)[:-self.keep]:
                old.unlink(missing_ok=True)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves `checkpoints/step-{step:08d}.weights.h5` every `every` optimizer steps, keeping the last `keep`."""

    def __init__(self, directory, every, keep=3):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.every = int(every)
        self.keep = int(keep)
        self._step = 0

    def on_train_begin(self, logs=None):
        self._step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every == 0:
            _atomic_save_weights(self.model, self.directory / f"step-{self._step:08d}.weights.h5")
            for old in sorted(self.directory.glob("step-[0-9]*.weights.h5"))[:-self.keep]:
                old.unlink(missing_ok=True)


class LearningRateLogger(keras.callbacks.Callback):
    """Adds `learning_rate` and the optimizer `step` to the epoch logs (for history.csv and TensorBoard)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        optimizer = self.model.optimizer
        logs.setdefault("learning_rate", float(np.asarray(optimizer.learning_rate)))
        logs["step"] = int(optimizer.iterations.numpy())


class HistoryCSV(keras.callbacks.Callback):
    """Writes `history.csv`: one row per finished epoch, column `epoch` (1-based) first.

    Rows are appended across resumed runs. When a run resumes at epoch `e`, rows
    for epochs after `e` (written by a run killed before its backup was saved)
    are dropped before training goes on, so the `epoch` column never goes back.

    Args:
        path: the CSV file.
    """

    def __init__(self, path):
        super().__init__()
        self.path = pathlib.Path(path)
        self._started = None

    def _read(self):
        if not self.path.is_file():
            return [], []
        with open(self.path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            return list(reader.fieldnames or []), list(reader)

    def _write(self, header, rows):
        temporary = self.path.with_suffix(".csv.tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=header, restval="")
            writer.writeheader()
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)

    def on_epoch_begin(self, epoch, logs=None):
        if self._started is None:
            self._started = epoch
            header, rows = self._read()
            kept = [row for row in rows if row.get("epoch", "").isdigit() and int(row["epoch"]) <= epoch]
            if len(kept) != len(rows):
                self._write(header, kept)

    def on_epoch_end(self, epoch, logs=None):
        header, rows = self._read()
        row = {"epoch": epoch + 1}
        row.update({key: _plain(value) for key, value in (logs or {}).items()})
        new_header = ["epoch"] + sorted(set(header[1:]) | (set(row) - {"epoch"}))
        rows.append(row)
        self._write(new_header, rows)


def _plain(value):
    value = np.asarray(value)
    return value.item() if value.size == 1 else value.tolist()


def _backup_callback(backup_dir, save_freq):
    class BackupAndRestore(keras.callbacks.BackupAndRestore):
        """Keras' BackupAndRestore whose restore errors name the backup file."""

        def on_train_begin(self, logs=None):
            try:
                super().on_train_begin(logs)
            except (OSError, ValueError, KeyError) as error:
                raise CheckpointError(
                    f"Cannot resume: the training backup {self._weights_path} (or "
                    f"{self._training_metadata_path}) is corrupt or does not match this model ({error}). "
                    f"Delete {self.backup_dir} to start again from scratch, or set training.init_checkpoint "
                    f"to a checkpoint in checkpoints/ to start from saved weights.") from error

    return BackupAndRestore(str(backup_dir), save_freq=save_freq, double_checkpoint=True,
                            delete_checkpoint=False)


# ------------------------------------------------------------------ data
@dataclasses.dataclass
class TrainingData:
    """What `build_data` returns: datasets of `({"source", "target"}, labels)` and the vocabulary size."""

    train: typing.Any
    validation: typing.Any
    vocab_size: int
    tokenizers: typing.Any = None  # the data pipeline's tokenizers for text data; None for synthetic


def _synthetic_arrays(section, data_dir):
    """Builds the synthetic pairs once and keeps them in `data_dir/synthetic.npz`."""
    from keras_transformer.data.synthetic import make_arrays, synthetic_pairs
    path = pathlib.Path(data_dir) / "synthetic.npz"
    if path.is_file():
        with np.load(path) as arrays:
            return {name: arrays[name] for name in arrays.files}
    total = section.train_examples + section.val_examples
    sources, targets = synthetic_pairs(section.task, total, section.vocab_size, section.min_length,
                                       section.max_length, seed=section.seed)
    inputs, labels = make_arrays(sources, targets)
    n = section.train_examples
    arrays = {"train_source": inputs["source"][:n], "train_target": inputs["target"][:n], "train_labels": labels[:n],
              "val_source": inputs["source"][n:], "val_target": inputs["target"][n:], "val_labels": labels[n:]}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(".synthetic.tmp.npz")
    np.savez(temporary, **arrays)
    os.replace(temporary, path)
    return arrays


def _synthetic_data(section, data_dir, global_batch, seed, num_replicas):
    import tensorflow as tf
    arrays = _synthetic_arrays(section, data_dir)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA

    def dataset(prefix, shuffle):
        ds = tf.data.Dataset.from_tensor_slices(
            ({"source": arrays[f"{prefix}_source"], "target": arrays[f"{prefix}_target"]},
             arrays[f"{prefix}_labels"]))
        if shuffle and section.shuffle:
            ds = ds.shuffle(len(arrays[f"{prefix}_labels"]), seed=seed, reshuffle_each_iteration=True)
        # Equal batches keep every replica busy and make one step the same work on 1 or N devices.
        return ds.batch(global_batch, drop_remainder=shuffle or num_replicas > 1).prefetch(2).with_options(options)

    if len(arrays["train_labels"]) < global_batch:
        raise ConfigError(f"data.train_examples={len(arrays['train_labels'])} is smaller than one global batch "
                          f"({global_batch}); lower data.batch_size or add examples.")
    validation = dataset("val", False) if len(arrays["val_labels"]) >= global_batch else None
    return TrainingData(dataset("train", True), validation, section.vocab_size)


def build_data(section, data_dir, strategy=None, batch_scaling="per_replica", seed=0, wait_for_chief=False):
    """Builds the training and validation datasets described by a `DataSection`.

    Built once: synthetic arrays or the learned vocabulary are stored in
    `data_dir` and read back on the next run.

    Args:
        section: a `DataSection`.
        data_dir: where the data and vocabulary are kept (`workdir/data`).
        strategy: the `tf.distribute` strategy (batch sizes scale with its replicas).
        batch_scaling: `"per_replica"` or `"global"` (see `distribute.global_batch_size`).
        seed: shuffling seed.
        wait_for_chief: a non-chief worker waits for the chief's vocabulary instead of learning one.

    Returns:
        A `TrainingData`.
    """
    from keras_transformer import distribute
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    if section.kind == "synthetic":
        global_batch = distribute.global_batch_size(section.batch_size, replicas, batch_scaling)
        return _synthetic_data(section, data_dir, global_batch, seed, replicas)
    return _text_data(section, data_dir, replicas, batch_scaling, seed, wait_for_chief)


def _text_data(section, data_dir, replicas, batch_scaling, seed, wait_for_chief):
    try:
        from keras_transformer.data import pipeline  # noqa: F401
    except ImportError as error:
        raise ConfigError(f"data.kind {section.kind!r} needs keras_transformer.data.pipeline, "
                          f"which could not be imported ({error}).") from error
    raise NotImplementedError("Text-corpus training is wired once keras_transformer.data.pipeline lands.")


# ------------------------------------------------------------------ precision
def resolve_precision(requested, strategy=None):
    """The Keras dtype policy name for `training.mixed_precision`.

    `"auto"` (or `true`) picks `mixed_float16` on GPUs (Keras then wraps the
    optimizer in a `LossScaleOptimizer`) and `mixed_bfloat16` on CPUs and TPUs
    (bfloat16 has float32's range and needs no loss scaling).

    Example:

    >>> resolve_precision("float32"), resolve_precision(False), resolve_precision("mixed_bfloat16")
    ('float32', 'float32', 'mixed_bfloat16')
    """
    if requested in (False, None, "float32"):
        return "float32"
    if requested in (True, "auto"):
        import tensorflow as tf
        on_tpu = strategy is not None and "TPU" in type(strategy).__name__
        if tf.config.list_physical_devices("GPU") and not on_tpu:
            return "mixed_float16"
        return "mixed_bfloat16"
    if requested not in PRECISIONS:
        raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS}, got {requested!r}.")
    return requested


# ------------------------------------------------------------------ workdir
def _check_same_experiment(path, resolved):
    """A workdir belongs to one model and one data set: refuse to resume it with others."""
    if not path.is_file():
        return
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    changed = []
    for section in ("model", "data"):
        old, new = saved.get(section) or {}, resolved[section]
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                changed.append(f"{section}.{key}: {old.get(key)!r} -> {new.get(key)!r}")
    if changed:
        raise ConfigError(f"{path.parent} holds a run with another model or data config ({'; '.join(changed)}). "
                          f"Use a new --workdir, or delete {path.parent} to start over.")


def _write_yaml(path, values):
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    os.replace(temporary, path)


@dataclasses.dataclass
class TrainingResult:
    """What `train` returns."""

    model: typing.Any  # the trained keras.Model
    model_config: TransformerConfig
    history: dict  # metric name -> values of the epochs this call ran
    workdir: pathlib.Path
    checkpoints: list  # the epoch checkpoints now in workdir/checkpoints
    strategy: typing.Any = None
    tokenizers: typing.Any = None


def train(config, workdir):
    """Trains the experiment `config` in `workdir`, resuming whatever an earlier run left there.

    Steps: pick the strategy (`training.strategy`) and the dtype policy; build
    the data and vocabulary once (kept in `workdir/data`); build and compile the
    model under the strategy scope (paper's Adam + Noam schedule, label-smoothed
    loss, token accuracy); `model.fit` with BackupAndRestore, per-epoch
    checkpoints, TensorBoard, `history.csv`, the progress bar and TerminateOnNaN.

    Under `multi_worker`, the chief writes to `workdir`; every other worker
    writes its checkpoints, backup, logs and history to `workdir/worker-<id>`.

    Args:
        config: an `ExperimentConfig`, a dict of sections, or a YAML path.
        workdir: the run's folder (created if needed).

    Returns:
        A `TrainingResult`.

    Raises:
        ConfigError: a bad config, or a workdir that holds another experiment.
        CheckpointError: an unreadable `training.init_checkpoint` or backup (the file is named).
        FloatingPointError: the loss became NaN (training stopped).

    Example:

    >>> result = train("configs/tiny_copy.yaml", "/tmp/kt_tiny")   # doctest: +SKIP
    >>> result.history["masked_accuracy"][-1] > 0.9                 # doctest: +SKIP
    True
    """
    experiment = as_experiment(config)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    training = experiment.training

    # The strategy comes first: multi-worker and TPU strategies must configure TensorFlow before it runs ops.
    from keras_transformer import distribute
    strategy = distribute.make_strategy(training.strategy, devices=training.devices,
                                        communication=training.communication)
    _, task_id, is_chief = distribute.task_info(strategy)
    output = workdir if is_chief else workdir / f"worker-{task_id}"
    output.mkdir(parents=True, exist_ok=True)
    log.info("Strategy: %s", distribute.describe(strategy))

    keras.utils.set_random_seed(training.seed)
    policy = resolve_precision(training.policy, strategy)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        return _train(experiment, workdir, output, strategy, is_chief, policy)
    finally:
        keras.config.set_dtype_policy(previous_policy)


def _train(experiment, workdir, output, strategy, is_chief, policy):
    from keras_transformer import distribute
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.metrics import MaskedAccuracy
    from keras_transformer.model import build_model
    from keras_transformer.optimizers import make_optimizer

    training = experiment.training
    data = build_data(experiment.data, workdir / "data" if is_chief else output / "data", strategy,
                      training.batch_scaling, seed=training.seed, wait_for_chief=not is_chief)
    model_config = experiment.model_config(data.vocab_size)
    resolved = experiment.to_dict()
    resolved["model"] = model_config.to_dict()
    _check_same_experiment(output / "experiment.yaml", resolved)
    _write_yaml(output / "experiment.yaml", resolved)
    model_config.save_yaml(output / "model.yaml")
    log.info("Model: %s; dtype policy %s", _summary(model_config), policy)

    with strategy.scope():
        model = build_model(model_config)
        optimizer = make_optimizer(model_config, gradient_accumulation_steps=training.gradient_accumulation_steps,
                                   **({"clipnorm": training.clipnorm} if training.clipnorm else {}))
        model.compile(optimizer=optimizer,
                      loss=LabelSmoothedCrossEntropy(model_config.label_smoothing, pad_id=model_config.pad_id),
                      metrics=[MaskedAccuracy(pad_id=model_config.pad_id)],
                      jit_compile=training.jit_compile, steps_per_execution=training.steps_per_execution)
        distribute.apply_keras_workarounds(model)
        if training.init_checkpoint:
            load_weights(model, training.init_checkpoint)

    callbacks = [
        _backup_callback(output / "backup", training.backup_every_steps or "epoch"),
        LearningRateLogger(),
        keras.callbacks.TerminateOnNaN(),
        EpochCheckpoint(output / "checkpoints", keep=training.keep_checkpoints),
        HistoryCSV(output / "history.csv"),
    ]
    if training.checkpoint_every_steps:
        callbacks.append(StepCheckpoint(output / "checkpoints", training.checkpoint_every_steps,
                                        training.keep_step_checkpoints))
    if training.tensorboard:
        try:
            import tensorboard  # noqa: F401  (tf.summary needs it)
            callbacks.append(keras.callbacks.TensorBoard(log_dir=str(output / "logs")))
        except ImportError:
            log.warning("TensorBoard logs skipped: `pip install tensorboard` to get them (training.tensorboard).")

    validation = data.validation if training.validation else None
    start = time.time()
    history = model.fit(data.train, validation_data=validation, epochs=training.epochs,
                        steps_per_epoch=training.steps_per_epoch, callbacks=callbacks, verbose=training.verbose)
    log.info("Trained %d epoch(s) in %.1f s; checkpoints in %s", len(history.epoch), time.time() - start,
             output / "checkpoints")
    losses = history.history.get("loss", [])
    if losses and not np.isfinite(losses[-1]):
        raise FloatingPointError(f"Training stopped: the loss became {losses[-1]} at epoch {history.epoch[-1] + 1}. "
                                 f"Lower the learning rate (model.learning_rate_scale), raise model.warmup_steps, "
                                 f"or set training.clipnorm; the last good weights are in {output / 'checkpoints'}.")
    return TrainingResult(model=model, model_config=model_config, history=history.history, workdir=output,
                          checkpoints=epoch_checkpoints(output), strategy=strategy, tokenizers=data.tokenizers)


def _summary(config):
    return (f"{config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}, "
            f"{config.num_heads} heads, d_ff {config.d_ff}, vocab {config.vocab_size}")


def train_and_evaluate(config, workdir):
    """Trains (or resumes) and then evaluates on the test data, if the config names any.

    Args:
        config: an `ExperimentConfig`, a dict of sections, or a YAML path.
        workdir: the run's folder.

    Returns:
        `(result, scores)`: a `TrainingResult` and a dict of evaluation scores (empty
        when the data has no test split).
    """
    result = train(config, workdir)
    return result, {}
