"""Training from an experiment config: `train(config, workdir)` and the YAML schema it reads.

An experiment config has four sections, each a frozen dataclass below:

```yaml
model:      # TransformerConfig fields, or `preset: tiny|small|base|big` plus overrides
  preset: tiny
data:       # where sentence pairs come from (DataSection): synthetic, text files or TFDS,
  kind: synthetic  # plus the data pipeline's DataConfig fields (vocab_size, tokens_per_batch, ...)
training:   # epochs, strategy, precision, checkpoints (TrainingSection)
  epochs: 8
decoding:   # beam search settings written into the saved TransformerConfig (DecodingSection)
  beam_size: 4
```

`load_experiment(paths, overrides)` reads one or more YAML files (later files
override earlier ones key by key) and then `--set section.key=value` overrides
(later values win). Unknown keys are rejected with the key named, and the model
section is built into a `TransformerConfig` right away, so that bad sizes fail
before any data work; `train` (and `--dry-run`) also check that the data files
exist.

`train(config, workdir)` trains; `train_and_evaluate(config, workdir)`, which
`keras-transformer train` calls, then scores the test data if the config names
any. Everything they write lives in `workdir`:

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
updates of an uninterrupted one). Running it after
training finished does nothing (it logs how many epochs the workdir has); raise
`training.epochs` to train further.

This module is TensorFlow-specific (tf.data, tf.distribute); the model code never imports it.
"""

import csv
import dataclasses
import difflib
import json
import logging
import math
import os
import pathlib
import sys
import time
import typing

import keras
import numpy as np
import yaml

from keras_transformer.config import TransformerConfig, load_yaml

log = logging.getLogger("keras_transformer")

DATA_KINDS = ("synthetic", "text", "tfds")
PRECISIONS = ("float32", "auto", "mixed_float16", "mixed_bfloat16")
SECTIONS = ("model", "data", "training", "decoding")


class ConfigError(ValueError):
    """An experiment config that cannot be used; the message names the key or file."""


class CheckpointError(RuntimeError):
    """A checkpoint or training backup that is missing or cannot be read; the message names the file."""


# ------------------------------------------------------------------ config schema
def _is_integer(value):
    """An int that is not a bool: YAML's `true` is an int to Python, but never a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _pipeline_fields():
    """The fields of the data pipeline's `DataConfig` (tokenizer and batching of real text)."""
    from keras_transformer.data.pipeline import DataConfig
    return [f.name for f in dataclasses.fields(DataConfig)]


@dataclasses.dataclass(frozen=True)
class DataSection:
    """Where the sentence pairs come from and how they are batched (the YAML `data:` section).

    `kind: synthetic` trains on the copy/reverse task of
    `keras_transformer.data.synthetic` (no files, no tokenizer). `kind: text`
    reads parallel text files; `kind: tfds` reads a TensorFlow Datasets
    translation set (needs `pip install tensorflow-datasets` and internet).
    For both text kinds the section also takes every field of
    `keras_transformer.data.pipeline.DataConfig` (`train_source`,
    `valid_source`, `vocab_size`, `model_type`, `tokens_per_batch`, ...),
    kept in `pipeline`; the vocabulary is learned once and stored in
    `workdir/data/vocab`.

    `vocab_size`, `max_length` and `seed` serve both kinds: the synthetic
    task's vocabulary, longest sentence and seed, or the pipeline's.

    Example:

    >>> DataSection.from_dict({"kind": "synthetic", "task": "reverse"}).synthetic_vocab_size
    32
    """

    kind: str = "synthetic"  # "synthetic", "text" (parallel files) or "tfds" (TensorFlow Datasets)
    vocab_size: typing.Optional[int] = None  # synthetic: 32 by default; text: DataConfig.vocab_size (10000)
    max_length: typing.Optional[int] = None  # synthetic: longest sentence (10); text: DataConfig.max_length
    seed: typing.Optional[int] = None  # synthetic pairs / shuffling seed (default: training.seed)
    # --- synthetic task ---------------------------------------------------------
    task: str = "copy"  # "copy" or "reverse"
    train_examples: int = 2000  # synthetic training pairs
    val_examples: int = 256  # synthetic validation pairs
    min_length: int = 3  # shortest synthetic sentence
    batch_size: int = 64  # synthetic: sentences per batch (see training.batch_scaling)
    shuffle: bool = True  # synthetic: reshuffle the training pairs every epoch
    # --- evaluation files (kind: text) ----------------------------------------
    valid_tokenized_target: typing.Optional[str] = None  # *.lc.norm.tok.* references for Multi30k BLEU
    test_source: typing.Optional[str] = None  # translated and scored after training, if given
    test_target: typing.Optional[str] = None  # raw references of test_source
    test_tokenized_target: typing.Optional[str] = None  # *.lc.norm.tok.* references for Multi30k BLEU
    # --- TensorFlow Datasets (kind: tfds) ---------------------------------------
    tfds_name: typing.Optional[str] = None  # e.g. "wmt14_translate/de-en"
    tfds_train_split: str = "train"
    tfds_valid_split: typing.Optional[str] = "validation"
    tfds_test_split: typing.Optional[str] = "test"
    tfds_data_dir: typing.Optional[str] = None  # where TFDS keeps downloads (default ~/tensorflow_datasets)
    tfds_max_examples: typing.Optional[int] = None  # read at most this many training pairs
    # --- the data pipeline's DataConfig fields (kind: text or tfds) -----------------
    pipeline: dict = dataclasses.field(default_factory=dict)  # written flat in YAML, not as a sub-section

    @classmethod
    def from_dict(cls, values):
        """Builds the section from its flat YAML mapping, rejecting unknown keys by name."""
        values = dict(values or {})
        own = [f.name for f in dataclasses.fields(cls) if f.name != "pipeline"]
        if "pipeline" in values:
            raise ConfigError("data.pipeline is not a key: write the DataConfig fields directly under data:.")
        kind = values.get("kind", "synthetic")
        pipeline_keys = _pipeline_fields() if kind != "synthetic" else []
        for key in values:
            if key not in own and key not in pipeline_keys:
                if kind == "synthetic" and key in _pipeline_fields():
                    raise ConfigError(f"data.{key} applies to data.kind 'text' or 'tfds', not 'synthetic'.")
                _reject_unknown({key: None}, own + pipeline_keys, "data.")
        section = cls(**{k: v for k, v in values.items() if k in own},
                      pipeline={k: v for k, v in values.items() if k not in own})
        section.validate()
        return section

    def to_dict(self):
        """The flat mapping written to YAML: the fields that apply to this kind, pipeline fields beside them."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k != "pipeline"}
        names = list(values)
        synthetic = names[names.index("task"):names.index("shuffle") + 1]
        text = names[names.index("valid_tokenized_target"):names.index("test_tokenized_target") + 1]
        tfds = names[names.index("tfds_name"):]
        dropped = {"synthetic": text + tfds, "text": synthetic + tfds, "tfds": synthetic}[self.kind]
        return {**{k: v for k, v in values.items() if k not in dropped}, **self.pipeline}

    @property
    def synthetic_vocab_size(self):
        """The synthetic task's vocabulary (reserved ids included)."""
        return self.vocab_size if self.vocab_size is not None else 32

    @property
    def synthetic_max_length(self):
        """The synthetic task's longest sentence."""
        return self.max_length if self.max_length is not None else 10

    def data_config(self, tokenizer_dir=None, tokens_per_batch=None, seed=None):
        """The pipeline's `DataConfig` for text kinds, with the shared fields filled in."""
        from keras_transformer.data.pipeline import DataConfig
        values = dict(self.pipeline)
        for name in ("vocab_size", "max_length", "seed"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        if seed is not None and self.seed is None:
            values["seed"] = seed
        if tokenizer_dir is not None:
            values["tokenizer_dir"] = str(tokenizer_dir)
        if tokens_per_batch is not None:
            values["tokens_per_batch"] = int(tokens_per_batch)
        try:
            return DataConfig.from_dict(values)
        except ValueError as error:
            raise ConfigError(f"data: {error}") from error

    def validate(self):
        """Raises `ConfigError` naming the first bad field."""
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"data.kind must be one of {DATA_KINDS}, got {self.kind!r}.")
        if self.seed is not None and (not _is_integer(self.seed) or self.seed < 0):
            raise ConfigError(f"data.seed must be a non-negative integer or null, got {self.seed!r}.")
        if self.kind == "synthetic":
            from keras_transformer.data.synthetic import TASKS
            if self.task not in TASKS:
                raise ConfigError(f"data.task must be one of {TASKS}, got {self.task!r}.")
            for name in ("train_examples", "val_examples", "min_length", "batch_size", "synthetic_vocab_size",
                         "synthetic_max_length"):
                value = getattr(self, name)
                if not _is_integer(value) or value <= 0:
                    raise ConfigError(f"data.{name.replace('synthetic_', '')} must be a positive integer, "
                                      f"got {value!r}.")
            if self.min_length > self.synthetic_max_length:
                raise ConfigError(f"data.min_length={self.min_length} exceeds data.max_length="
                                  f"{self.synthetic_max_length}.")
            if self.synthetic_vocab_size <= 4:
                raise ConfigError(f"data.vocab_size={self.synthetic_vocab_size} leaves no symbols after the 4 "
                                  "reserved ids.")
            return
        config = self.data_config()
        if self.kind == "text" and config.train_source is None:
            raise ConfigError("data.kind 'text' needs data.train_source and data.train_target (file paths).")
        if self.kind == "tfds":
            if not self.tfds_name:
                raise ConfigError("data.kind 'tfds' needs data.tfds_name, e.g. wmt14_translate/de-en.")
            if config.train_source is not None:
                raise ConfigError("data.kind 'tfds' reads TensorFlow Datasets: leave data.train_source unset.")
            if self.tfds_max_examples is not None and (not _is_integer(self.tfds_max_examples)
                                                       or self.tfds_max_examples <= 0):
                raise ConfigError(f"data.tfds_max_examples must be a positive integer or null, "
                                  f"got {self.tfds_max_examples!r}.")
        if bool(self.test_source) != bool(self.test_target):
            raise ConfigError("data.test_source and data.test_target must be given together.")

    def check_files(self):
        """Raises `ConfigError` naming the first data file (key and path) that is missing or is a folder.

        `train` and `pack_arrays` call it before any data work, and `keras-transformer train --dry-run` too,
        so that a typo in a test file's name is not found after hours of training.

        Example:

        >>> DataSection.from_dict({"kind": "text", "train_source": "/nonexistent.en",
        ...                        "train_target": "/nonexistent.de"}).check_files()
        Traceback (most recent call last):
        ...
        keras_transformer.training.ConfigError: data.train_source: file not found: /nonexistent.en
        """
        if self.kind == "synthetic":
            return
        files = {name: self.pipeline.get(name) for name in ("train_source", "train_target", "valid_source",
                                                             "valid_target")}
        files.update((name, getattr(self, name)) for name in ("valid_tokenized_target", "test_source", "test_target",
                                                               "test_tokenized_target"))
        for name, path in files.items():
            if path is None:
                continue
            path = pathlib.Path(path)
            if path.is_dir():
                raise ConfigError(f"data.{name}: {path} is a directory, not a file.")
            if not path.is_file():
                raise ConfigError(f"data.{name}: file not found: {path}")


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
    cooldown_epochs: typing.Optional[int] = None  # over the last K epochs the learning rate falls linearly to zero
    rdrop_alpha: typing.Optional[float] = None  # R-Drop (null or 0: off): every pair runs twice a batch, with
                                                # two dropout masks, and alpha / 4 times their symmetric KL joins
                                                # the loss (losses.RDropLoss); a batch computes twice the positions
    seed: int = 1234  # keras.utils.set_random_seed: initial weights, dropout, shuffling
    checkpoint_every_steps: typing.Optional[int] = None  # also write checkpoints/step-XXXXXXXX.weights.h5
    keep_step_checkpoints: int = 3  # how many step checkpoints to keep
    keep_checkpoints: typing.Optional[int] = None  # epoch checkpoints to keep; None keeps all (for averaging)
    backup_every_steps: typing.Optional[int] = None  # also back up every N batches (resume inside an epoch)
    init_checkpoint: typing.Optional[str] = None  # start from these weights (fine-tuning), and from the
                                                  # vocabulary of the run or export that wrote them
    initial_updates: int = 0  # a new run's optimizer starts at this update count, so the learning-rate
                              # schedule goes on from there instead of warming up again (ignored on resume)
    validation: bool = True  # evaluate loss and accuracy on the validation data after each epoch
    bleu_every_epochs: typing.Optional[int] = None  # text data: decode the validation set every N epochs (val_bleu)
    bleu_beam_size: int = 1  # beam for that validation BLEU (1: greedy, fast)
    bleu_max_sentences: typing.Optional[int] = None  # decode only the first N validation sentences
    tensorboard: bool = True  # write TensorBoard logs to workdir/logs
    verbose: typing.Any = "auto"  # progress: 0 (silent), 1 (bar), 2 (one line per epoch), "auto" (a bar on a
                                  # terminal, one line per epoch into a log file or pipe)

    def validate(self):
        """Raises `ConfigError` naming the first bad field."""
        from keras_transformer import distribute
        if not _is_integer(self.epochs) or self.epochs <= 0:
            raise ConfigError(f"training.epochs must be a positive integer, got {self.epochs!r}.")
        if self.strategy not in distribute.STRATEGIES:
            raise ConfigError(f"training.strategy must be one of {distribute.STRATEGIES}, got {self.strategy!r}.")
        if self.batch_scaling not in distribute.BATCH_SCALINGS:
            raise ConfigError(f"training.batch_scaling must be one of {distribute.BATCH_SCALINGS}, "
                              f"got {self.batch_scaling!r}.")
        if not (isinstance(self.mixed_precision, bool) or self.mixed_precision is None
                or self.mixed_precision in PRECISIONS):
            raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS} or a bool, "
                              f"got {self.mixed_precision!r}.")
        if not (isinstance(self.jit_compile, bool) or self.jit_compile == "auto"):
            raise ConfigError(f"training.jit_compile must be true, false or 'auto', got {self.jit_compile!r}.")
        if isinstance(self.verbose, bool) or self.verbose not in ("auto", 0, 1, 2):
            raise ConfigError(f"training.verbose must be 'auto', 0, 1 or 2, got {self.verbose!r}.")
        for name in ("steps_per_epoch", "checkpoint_every_steps", "keep_checkpoints", "backup_every_steps",
                     "bleu_every_epochs", "bleu_max_sentences", "cooldown_epochs"):
            value = getattr(self, name)
            if value is not None and (not _is_integer(value) or value <= 0):
                raise ConfigError(f"training.{name} must be a positive integer or null, got {value!r}.")
        for name in ("steps_per_execution", "gradient_accumulation_steps", "keep_step_checkpoints",
                     "bleu_beam_size"):
            value = getattr(self, name)
            if not _is_integer(value) or value <= 0:
                raise ConfigError(f"training.{name} must be a positive integer, got {value!r}.")
        if not _is_integer(self.initial_updates) or self.initial_updates < 0:
            raise ConfigError(f"training.initial_updates must be a non-negative integer, got "
                              f"{self.initial_updates!r}.")
        if not _is_integer(self.seed) or self.seed < 0:
            raise ConfigError(f"training.seed must be a non-negative integer, got {self.seed!r}.")
        if self.rdrop_alpha is not None and (isinstance(self.rdrop_alpha, bool)
                                             or not isinstance(self.rdrop_alpha, (int, float))
                                             or not self.rdrop_alpha >= 0):
            raise ConfigError(f"training.rdrop_alpha must be a number >= 0 or null, got {self.rdrop_alpha!r}.")
        if self.cooldown_epochs is not None and self.cooldown_epochs > self.epochs:
            raise ConfigError(f"training.cooldown_epochs ({self.cooldown_epochs}) is more than training.epochs "
                              f"({self.epochs}).")

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
    average_last: typing.Optional[int] = None  # test evaluation averages the last N checkpoints (paper: 5 / 20)

    def validate(self):
        """Raises `ConfigError` naming the first bad field."""
        for name in ("batch_size", "average_last", "beam_size", "max_decode_extra"):
            value = getattr(self, name)
            if value is None and name != "batch_size":
                continue
            if not _is_integer(value) or value <= 0:
                raise ConfigError(f"decoding.{name} must be a positive integer, got {value!r}.")

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
    def from_dict(cls, values, check_model=True):
        """Builds and validates an experiment from nested dicts, rejecting unknown keys by name.

        With `check_model` (the default) the model section is also built into a `TransformerConfig`
        (`check_model`), so that bad sizes fail here and not after the data work; `load_experiment` turns it off
        for each file alone, whose model section may need a later file or `--set` to be complete.
        """
        values = dict(values or {})
        _reject_unknown(values, SECTIONS, "")
        for name in SECTIONS:
            if values.get(name) is not None and not isinstance(values[name], dict):
                raise ConfigError(f"Section {name!r} must be a mapping, got {values[name]!r}.")
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
            if section_class is DataSection:
                sections[name] = DataSection.from_dict(section_values)
                continue
            _reject_unknown(section_values, [f.name for f in dataclasses.fields(section_class)], f"{name}.")
            sections[name] = section_class(**section_values)
            sections[name].validate()
        experiment = cls(model=model, **sections)
        if check_model:
            experiment.check_model()
        return experiment

    def to_dict(self):
        """Nested plain dicts (YAML-friendly)."""
        return {"model": dict(self.model), "data": self.data.to_dict(),
                "training": dataclasses.asdict(self.training), "decoding": dataclasses.asdict(self.decoding)}

    def model_config(self, vocabulary=None):
        """The `TransformerConfig`: preset (if any), the model fields, the data's vocabulary, decoding overrides.

        Args:
            vocabulary: the data's vocabulary size (an int), or a dict of
                `vocab_size` / `source_vocab_size` / `target_vocab_size`; used where
                the model section gives none, and checked where it does (the
                model's vocabulary is the tokenizer's: a `Translator` refuses any other).

        Example:

        >>> ExperimentConfig.from_dict({"model": {"preset": "tiny"}}).model_config(100).vocab_size
        100
        """
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        if isinstance(vocabulary, int):
            vocabulary = {"vocab_size": vocabulary}
        for name, size in (vocabulary or {}).items():
            given = fields.get(name)
            if given is not None and given != size:
                relation = "smaller" if given < size else "larger"
                raise ConfigError(f"model.{name}={given} is {relation} than the data's vocabulary ({size}); "
                                  f"leave model.{name} out to take the data's.")
            fields.setdefault(name, size)
        fields.update(self.decoding.overrides())
        try:
            if preset is not None:
                return TransformerConfig.preset(preset, **fields)
            return TransformerConfig.from_dict(fields)
        except ValueError as error:
            raise ConfigError(f"model: {error}") from error

    def check_files(self):
        """Names the first missing input file: the data files (`ConfigError`), then `training.init_checkpoint`
        (`CheckpointError`).

        `train` and `keras-transformer train` (``--dry-run`` too) call it before any data work.

        Example:

        >>> ExperimentConfig.from_dict({"model": {"preset": "tiny"}, "data": {"kind": "synthetic"},
        ...                             "training": {"init_checkpoint": "/nonexistent.weights.h5"}}).check_files()
        Traceback (most recent call last):
        ...
        keras_transformer.training.CheckpointError: training.init_checkpoint: Checkpoint not found: /nonexistent.weights.h5
        """
        self.data.check_files()
        path = self.training.init_checkpoint
        if path is not None:
            path = pathlib.Path(path)
            if path.is_dir():
                raise CheckpointError(f"training.init_checkpoint: {path} is a directory, not a weights file.")
            if not path.is_file():
                raise CheckpointError(f"training.init_checkpoint: Checkpoint not found: {path}")

    def check_model(self):
        """Raises `ConfigError` if the model section cannot make a `TransformerConfig` (bad sizes or types).

        The vocabulary's size is known once it is learned from the data; until then the configured one stands in
        (the model section's, else `data.vocab_size`); no other check of the model fields depends on it.
        `from_dict` calls it, so `load_experiment`, `--dry-run` and `train` refuse such a config before any
        data work.

        Example:

        >>> ExperimentConfig(model={"d_model": 60, "num_heads": 7}).check_model()
        Traceback (most recent call last):
        ...
        keras_transformer.training.ConfigError: model: TransformerConfig: d_model=60 is not divisible by num_heads=7; ...
        """
        if self.data.kind == "synthetic":  # the vocabulary is the configured one: check it all
            self.model_config(self.data.synthetic_vocab_size)
            return
        if self.model.get("vocab_size") is not None:
            self.model_config()
            return
        given = [size for size in (self.model.get("source_vocab_size"), self.model.get("target_vocab_size"))
                 if _is_integer(size) and size > 0]
        self.model_config(max(given) if given else self.data.data_config().vocab_size)


def _reject_unknown(values, known, prefix):
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'The experiment config'} must be a mapping, got {values!r}.")
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(f"Unknown config key '{prefix}{key}'.{hint} "
                              f"Known keys{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(known)}.")


def _deep_merge(base, update):
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_override(text):
    """Parses one `--set` argument `section.key=value` into `(["section", "key"], value)`.

    The value is read as YAML, so `3`, `0.1`, `1e-4`, `true`, `null` and `[a, b]` get their types
    (`config.load_yaml`).

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
        value = load_yaml(raw) if raw.strip() else None
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
        if path.is_dir():
            raise ConfigError(f"Config file {path} is a directory, not a file.")
        if not path.is_file():
            raise ConfigError(f"Config file not found: {path}")
        try:
            loaded = load_yaml(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML ({error}).") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping with sections {SECTIONS}, got {type(loaded).__name__}.")
        try:
            ExperimentConfig.from_dict(loaded, check_model=False)  # name the file that holds a bad key
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


def _weights_only(model):
    """The same layers as an uncompiled model: its `save_weights` leaves out the optimizer's state.

    A compiled model's `.weights.h5` also holds Adam's two moments (three times
    the size); checkpoints for evaluation, averaging and export need only the
    weights. The BackupAndRestore backup keeps the optimizer, so a resumed run goes on with its moments and
    its update count.
    """
    view = getattr(model, "_keras_transformer_weights_view", None)
    if view is None:
        view = keras.Model(model.inputs, model.outputs, name=model.name)
        model._keras_transformer_weights_view = view
    return view


def _atomic_save_weights(model, path):
    """Writes the model weights (no optimizer state) next to `path` and renames, so a kill never leaves a
    half-written checkpoint."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name[:-len('.weights.h5')]}.tmp.weights.h5")
    _weights_only(model).save_weights(str(temporary), overwrite=True)
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
    """Saves `checkpoints/step-{step:08d}.weights.h5` every `every` optimizer updates, keeping the last `keep`.

    Steps are optimizer updates (`optimizer.iterations`), so with gradient
    accumulation one step spans several batches.
    """

    def __init__(self, directory, every, keep=3):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.every = int(every)
        self.keep = int(keep)
        self._saved = None

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every == 0 and step != self._saved:
            self._saved = step
            _atomic_save_weights(self.model, self.directory / f"step-{step:08d}.weights.h5")
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


def resumed_seed(seed, epoch=0, batch=0):
    """The seed of a run that starts at `(epoch, batch)`: `seed` itself for a fresh run.

    Keras does not save the dropout generators' state, and a seeded tf.data
    shuffle restarts its sequence of orders in every process: a run resumed with
    its first seed would repeat the noise of the first run's first epochs, the
    same examples in the same batches under the same dropout masks. A resumed run
    takes a seed derived from the seed and where it starts instead.

    Example:

    >>> resumed_seed(1234), resumed_seed(1234, 0, 0)
    (1234, 1234)
    >>> resumed_seed(1234, 84) == resumed_seed(1234, 84), resumed_seed(1234, 84) == resumed_seed(1234, 85)
    (True, False)
    """
    if epoch == 0 and batch == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(epoch), int(batch)]).generate_state(1)[0] & 0x7FFFFFFF)


def _backup_position(backup_dir):
    """`(epoch, batches)` a BackupAndRestore directory resumes at: the epoch, and how many of its batches were
    trained. `(0, 0)` when there is no backup to resume.

    Backups written before `batches_done` was recorded give Keras' zero-based
    `batch`: a value of 0 there cannot tell one trained batch from none, and counts as none.
    """
    backup_dir = pathlib.Path(backup_dir)
    if not (backup_dir / "latest.weights.h5").is_file():
        return (0, 0)
    try:
        position = json.loads((backup_dir / "training_metadata.json").read_text(encoding="utf-8"))
        done = position.get("batches_done")
        if done is None:
            batch = int(position.get("batch", 0) or 0)
            done = batch + 1 if batch else 0
        return (int(position.get("epoch", 0)), int(done))
    except (OSError, ValueError, TypeError, AttributeError):
        return (0, 0)  # unreadable: the restore that follows stops with the file named (CheckpointError)


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """Keras' BackupAndRestore, made to resume where it stopped inside an epoch.

    What it changes:

    - the epoch a resumed run's batch backups record is the restored one (Keras
      records epoch 0 until the first resumed epoch ends, so a second interruption
      there started the run's epochs over);
    - each backup records `batches_done`, the batches of its epoch already
      trained, which `train` uses to run only the rest of an interrupted epoch
      (Keras restores the epoch alone and trains it again from its first batch);
    - with a batch frequency it also backs up at the end of every epoch, and
      skips the backup of an epoch's last batch that this one replaces;
    - a backup that does not load stops with a `CheckpointError` naming the file.

    `offset` is the number of the epoch's batches trained before the current
    `fit` began: `train` sets it for the fit that finishes an interrupted epoch.
    """

    def __init__(self, backup_dir, save_freq="epoch"):
        super().__init__(str(backup_dir), save_freq=save_freq, double_checkpoint=True, delete_checkpoint=False)
        self.offset = 0
        self._done = 0

    def on_train_begin(self, logs=None):
        try:
            super().on_train_begin(logs)
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointError(
                f"Cannot resume: the training backup {self._weights_path} (or "
                f"{self._training_metadata_path}) is corrupt or does not match this model ({error}). "
                f"Delete {self.backup_dir} to start again from scratch, or set training.init_checkpoint "
                f"to a checkpoint in checkpoints/ to start from saved weights.") from error
        self._current_epoch = _backup_position(self.backup_dir)[0]

    def on_train_batch_end(self, batch, logs=None):
        self._done = self.offset + batch + 1
        steps = (self.params or {}).get("steps")
        if steps and batch + 1 >= steps and self.save_freq != "epoch":
            return  # the epoch-end backup follows
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._done, self.offset = 0, 0
        super().on_epoch_end(epoch, logs)
        if self.save_freq != "epoch":
            self._batches_seen_since_last_saving = 0
            self._save_model()

    def _save_model(self):
        super()._save_model()
        if self._done:  # inside an epoch: its running loss and metrics, for the process that trains the rest
            _save_metric_state(self.model, self.backup_dir, self._current_epoch, self._done)
        position = {"epoch": self._current_epoch, "batch": self._last_batch_seen, "batches_done": self._done}
        with open(self._training_metadata_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(position))


METRIC_STATE = "metrics.npz"  # in the backup folder


def _save_metric_state(model, backup_dir, epoch, done):
    """Writes the model's metric accumulators (the loss tracker's total and count, the accuracy's) as they stand
    after `done` batches of `epoch`, atomically."""
    path = pathlib.Path(backup_dir) / METRIC_STATE
    values = {f"v{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(model.metrics_variables)}
    temporary = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(temporary, epoch=epoch, done=done, names=np.array([v.path for v in model.metrics_variables]), **values)
    os.replace(temporary, path)


class RestoreMetricState(keras.callbacks.Callback):
    """Adds the interrupted epoch's metric accumulators from the backup to the resumed process's, so that the
    epoch's history row averages all of its batches, the ones trained before the interruption included.

    `ResumableBackup` saves them with each batch backup (`metrics.npz`): the loss
    tracker's total and count, the accuracy's correct and total, all sums.
    Keras creates the compiled metrics' variables at the first batch, so they are
    added after it; the next batch's logs and the epoch's row include them.
    Without a matching file (another position, other metrics, or several
    replicas, whose accumulators are per replica) the row averages the resumed
    batches alone, with a warning.
    """

    def __init__(self, backup_dir, epoch, done, replicas=1):
        super().__init__()
        self.path = pathlib.Path(backup_dir) / METRIC_STATE
        self.epoch, self.done, self.replicas = epoch, done, replicas
        self._pending = False

    def _saved(self):
        if self.replicas != 1:
            return None
        try:
            with np.load(self.path) as saved:
                names = [str(name) for name in saved["names"]]
                if (int(saved["epoch"]), int(saved["done"])) != (self.epoch, self.done) or \
                        names != [v.path for v in self.model.metrics_variables]:
                    return None
                return [saved[f"v{i}"] for i in range(len(names))]
        except (OSError, KeyError, ValueError):
            return None

    def on_epoch_begin(self, epoch, logs=None):
        self._pending = epoch == self.epoch

    def on_train_batch_end(self, batch, logs=None):
        if not self._pending:
            return
        self._pending = False
        values = self._saved()
        if values is None:
            log.warning("Epoch %d's loss and metrics in history.csv average only the batches trained after the "
                        "resume: the backup has no matching record of its first %d.", self.epoch + 1, self.done)
            return
        for variable, value in zip(self.model.metrics_variables, values):
            variable.assign_add(value)


# ------------------------------------------------------------------ data
@dataclasses.dataclass
class TrainingData:
    """What `build_data` returns."""

    train: typing.Any  # tf.data.Dataset of ({"source", "target"}, labels)
    validation: typing.Any  # the same for validation, or None
    source_vocab_size: int
    target_vocab_size: int
    tokenizers: typing.Any = None  # (source, target) SubwordTokenizers for text data; None for synthetic
    valid_pairs: typing.Any = None  # (sources, references) raw validation text, for BLEU

    def model_fields(self):
        """The TransformerConfig vocabulary fields this data needs."""
        if self.source_vocab_size == self.target_vocab_size and (
                self.tokenizers is None or self.tokenizers[0] is self.tokenizers[1]):
            return {"vocab_size": self.source_vocab_size}
        return {"vocab_size": max(self.source_vocab_size, self.target_vocab_size),
                "source_vocab_size": self.source_vocab_size, "target_vocab_size": self.target_vocab_size}


def _synthetic_arrays(section, data_dir, seed):
    """Builds the synthetic pairs once and keeps them in `data_dir/synthetic.npz`."""
    from keras_transformer.data.synthetic import make_arrays, synthetic_pairs
    path = pathlib.Path(data_dir) / "synthetic.npz"
    if path.is_file():
        with np.load(path) as arrays:
            return {name: arrays[name] for name in arrays.files}
    total = section.train_examples + section.val_examples
    sources, targets = synthetic_pairs(section.task, total, section.synthetic_vocab_size, section.min_length,
                                       section.synthetic_max_length, seed=seed)
    inputs, labels = make_arrays(sources, targets)
    n = section.train_examples
    arrays = {"train_source": inputs["source"][:n], "train_target": inputs["target"][:n], "train_labels": labels[:n],
              "val_source": inputs["source"][n:], "val_target": inputs["target"][n:], "val_labels": labels[n:]}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".synthetic.{os.getpid()}.tmp.npz")  # workers may write at once
    np.savez(temporary, **arrays)
    os.replace(temporary, path)
    return arrays


def _synthetic_data(section, data_dir, global_batch, seed, num_replicas, shuffle_seed):
    import tensorflow as tf
    arrays = _synthetic_arrays(section, data_dir, seed)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA

    def dataset(prefix, training):
        ds = tf.data.Dataset.from_tensor_slices(
            ({"source": arrays[f"{prefix}_source"], "target": arrays[f"{prefix}_target"]},
             arrays[f"{prefix}_labels"]))
        if training and section.shuffle:
            ds = ds.shuffle(len(arrays[f"{prefix}_labels"]), seed=shuffle_seed, reshuffle_each_iteration=True)
        # Equal batches keep every replica busy and make one step the same work on 1 or N devices.
        return ds.batch(global_batch, drop_remainder=training or num_replicas > 1).prefetch(2).with_options(options)

    if len(arrays["train_labels"]) < global_batch:
        raise ConfigError(f"data.train_examples={len(arrays['train_labels'])} is smaller than one global batch "
                          f"({global_batch}); lower data.batch_size or add examples.")
    validation = dataset("val", False) if len(arrays["val_labels"]) >= global_batch else None
    size = section.synthetic_vocab_size
    return TrainingData(dataset("train", True), validation, size, size)


def checkpoint_vocabulary(path):
    """The vocabulary folder of the run or export that wrote the weights file `path`, or None.

    Looks where this package puts it: an export's `assets.extra/vocab` beside
    `assets.extra/model.weights.h5`, a workdir's `data/vocab` beside its
    `averaged.weights.h5` or above its `checkpoints/ckpt-XXXX.weights.h5`.

    Example:

    >>> import tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp()).resolve()
    >>> (run / "data" / "vocab").mkdir(parents=True)
    >>> checkpoint_vocabulary(run / "checkpoints" / "ckpt-0003.weights.h5") == run / "data" / "vocab"
    True
    >>> checkpoint_vocabulary(run / "elsewhere" / "deeper" / "my.weights.h5") is None
    True
    """
    folder = pathlib.Path(path).resolve().parent
    candidates = (folder / "vocab", folder / "data" / "vocab", folder.parent / "data" / "vocab")
    return next((candidate for candidate in candidates if candidate.is_dir()), None)


def _adopt_vocabulary(checkpoint, vocab_dir):
    """A fine-tuning run tokenizes with the vocabulary its initial weights were trained with.

    A new workdir copies it (so `data/vocab` is never learned afresh, with other
    ids); a workdir that already has a vocabulary must hold the same files.
    """
    import shutil
    source = checkpoint_vocabulary(checkpoint)
    if source is None:
        log.warning("training.init_checkpoint: no vocabulary beside %s (an export's assets.extra/vocab or a "
                    "workdir's data/vocab): the workdir's own is used, so its ids must be the ones the weights "
                    "were trained with.", checkpoint)
        return
    vocab_dir = pathlib.Path(vocab_dir)
    if vocab_dir.exists():
        if _folder_files(vocab_dir) != _folder_files(source):
            raise ConfigError(f"training.init_checkpoint: the weights in {checkpoint} were trained with the "
                              f"vocabulary in {source}, and this workdir's {vocab_dir} differs from it. Fine-tune "
                              f"in a new workdir: it takes the checkpoint's vocabulary.")
        return
    staging = vocab_dir.with_name(f".{vocab_dir.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    os.replace(staging, vocab_dir)
    log.info("Vocabulary copied from %s, the init checkpoint's", source)


def _wait_for(path, timeout=3600, poll=2.0):
    """Waits until `path` exists (a non-chief worker waiting for the chief's vocabulary)."""
    deadline = time.time() + timeout
    while not pathlib.Path(path).exists():
        if time.time() > deadline:
            raise TimeoutError(f"Waited {timeout} s for {path}, which the chief worker writes. Is the workdir on a "
                               "file system all workers share? See docs/distributed.md.")
        time.sleep(poll)


def tfds_pairs(section, split, max_examples=None):
    """Reads `(sources, targets)` of one split of a TensorFlow Datasets translation set.

    Args:
        section: a `DataSection` with `tfds_name`, `source_language`, `target_language`.
        split: the split name, e.g. "train".
        max_examples: read at most this many pairs.

    Returns:
        Two lists of `str`.

    Raises:
        ConfigError: tensorflow-datasets is not installed, or the set lacks a language.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ConfigError("data.kind 'tfds' needs TensorFlow Datasets: `pip install tensorflow-datasets`; the "
                          f"first run downloads {section.tfds_name} (internet access needed).") from error
    languages = (section.pipeline.get("source_language", "en"), section.pipeline.get("target_language", "de"))
    dataset = tfds.load(section.tfds_name, split=split, data_dir=section.tfds_data_dir)
    if max_examples:
        dataset = dataset.take(int(max_examples))
    sources, targets = [], []
    for example in dataset.as_numpy_iterator():
        for language in languages:
            if language not in example:
                raise ConfigError(f"data: {section.tfds_name} has no language {language!r}; it has "
                                  f"{sorted(example)}. Set data.source_language / data.target_language.")
        sources.append(example[languages[0]].decode("utf-8"))
        targets.append(example[languages[1]].decode("utf-8"))
    return sources, targets


def _tokenizers(section, config, vocab_dir, wait_for_chief, texts=None):
    """Loads the vocabulary from `vocab_dir`, or learns it once (atomically) from the training text."""
    import shutil

    from keras_transformer.data import pipeline, tokenizers
    vocab_dir = pathlib.Path(vocab_dir)
    if not vocab_dir.exists() and wait_for_chief:
        log.info("Waiting for the chief worker's vocabulary in %s", vocab_dir)
        _wait_for(vocab_dir)
    if vocab_dir.exists():
        return tokenizers.load_tokenizers(vocab_dir)
    staging = vocab_dir.with_name(f".{vocab_dir.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    if texts is None:
        pair = pipeline.load_or_train_tokenizers(config, staging)
    else:
        pair = tokenizers.train_tokenizers(texts[0], texts[1], config.vocab_size, shared=config.shared_vocab,
                                           directory=staging, model_type=config.model_type,
                                           lowercase=config.lowercase)
    os.replace(staging, vocab_dir)
    log.info("Vocabulary of %d (%s) stored in %s", pair[0].vocab_size,
             "shared" if pair[0] is pair[1] else f"target {pair[1].vocab_size}", vocab_dir)
    return pair


def _text_data(section, data_dir, replicas, batch_scaling, shuffle_seed, wait_for_chief):
    from keras_transformer import distribute
    from keras_transformer.data import corpus, pipeline
    base = section.data_config()
    tokens = distribute.global_batch_size(base.tokens_per_batch, replicas, batch_scaling)
    config = dataclasses.replace(
        section.data_config(tokenizer_dir=pathlib.Path(data_dir) / "vocab", tokens_per_batch=tokens),
        seed=shuffle_seed)
    if section.kind == "text":
        source_tokenizer, target_tokenizer = _tokenizers(section, config, pathlib.Path(data_dir) / "vocab",
                                                         wait_for_chief)
        train, train_summary, valid, valid_summary = pipeline.make_datasets(
            config, source_tokenizer, target_tokenizer, num_replicas=replicas)
        valid_pairs = None
        if config.valid_source is not None:
            valid_pairs = corpus.read_parallel_corpus(config.valid_source, config.valid_target, config.errors)[:2]
    else:
        sources, targets = tfds_pairs(section, section.tfds_train_split, section.tfds_max_examples)
        source_tokenizer, target_tokenizer = _tokenizers(section, config, pathlib.Path(data_dir) / "vocab",
                                                         wait_for_chief, texts=(sources, targets))
        options = dict(tokens_per_batch=config.tokens_per_batch, max_length=config.max_length,
                       bucket_width=config.bucket_width, cache=config.cache, num_replicas=replicas)
        train, train_summary = pipeline.make_dataset_from_texts(
            sources, targets, source_tokenizer, target_tokenizer, training=True,
            shuffle_buffer=config.shuffle_buffer, seed=config.seed, subword_dropout=config.subword_dropout,
            subword_dropout_sides=config.subword_dropout_sides, **options)
        valid = valid_summary = valid_pairs = None
        if section.tfds_valid_split:
            valid_pairs = tfds_pairs(section, section.tfds_valid_split)
            valid, valid_summary = pipeline.make_dataset_from_texts(
                *valid_pairs, source_tokenizer, target_tokenizer, training=False, **options)
    log.info("Training data: %s", train_summary)
    if valid_summary is not None:
        log.info("Validation data: %s", valid_summary)
    return TrainingData(train, valid, source_tokenizer.vocab_size, target_tokenizer.vocab_size,
                        tokenizers=(source_tokenizer, target_tokenizer), valid_pairs=valid_pairs)


def build_data(section, data_dir, strategy=None, batch_scaling="per_replica", seed=0, wait_for_chief=False,
               resumed_at=(0, 0)):
    """Builds the training and validation datasets a `DataSection` describes.

    Built once: the synthetic pairs or the learned vocabulary are stored in
    `data_dir` (`synthetic.npz`, `vocab/`) and read back by every later run.

    Args:
        section: a `DataSection`.
        data_dir: where the data and vocabulary are kept (`workdir/data`).
        strategy: the `tf.distribute` strategy (batch sizes scale with its replicas).
        batch_scaling: `"per_replica"` or `"global"` (see `distribute.global_batch_size`):
            how `data.batch_size` (synthetic) or `data.tokens_per_batch` (text) is read.
        seed: the seed of the synthetic pairs and of shuffling, unless `data.seed` is set.
        wait_for_chief: a non-chief worker waits for the chief's vocabulary instead of learning one.
        resumed_at: `(epoch, batch)` a resumed run starts from: its shuffling seed is
            `resumed_seed(seed, epoch, batch)`, so it does not replay the first run's order.

    Returns:
        A `TrainingData`.

    Example:

    >>> data = build_data(DataSection(train_examples=64, val_examples=64, batch_size=32), "/tmp/kt_doc_data")
    >>> inputs, labels = next(iter(data.train))
    >>> inputs["source"].shape[0], data.source_vocab_size
    (32, 32)
    """
    from keras_transformer import distribute
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    seed = section.seed if section.seed is not None else seed
    shuffle_seed = resumed_seed(seed, *resumed_at)
    if section.kind == "synthetic":
        global_batch = distribute.global_batch_size(section.batch_size, replicas, batch_scaling)
        return _synthetic_data(section, data_dir, global_batch, seed, replicas, shuffle_seed)
    return _text_data(section, data_dir, replicas, batch_scaling, shuffle_seed, wait_for_chief)


# ------------------------------------------------------------------ precision
_NATIVE_BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def progress_verbosity(setting, stream=None):
    """The `verbose` value for `Model.fit`: `setting` itself, or for "auto" a progress bar when `stream`
    (default: stdout) is a terminal and one line per epoch otherwise.

    Keras' own "auto" draws the bar everywhere, so a run under `nohup ... > train.log` would write a redrawn bar
    line for every batch into its log.

    >>> import io
    >>> progress_verbosity("auto", io.StringIO()), progress_verbosity(1, io.StringIO())
    (2, 1)
    """
    if setting != "auto":
        return setting
    stream = sys.stdout if stream is None else stream
    try:
        return 1 if stream.isatty() else 2
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return 2


def cpu_has_native_bfloat16(cpuinfo=None):
    """Whether the CPU multiplies bfloat16 natively (AVX512_BF16 or AMX), from `/proc/cpuinfo`.

    Without those instructions oneDNN converts bfloat16 to float32 around every
    matmul, so `mixed_bfloat16` trains *slower* than float32 (1.14x slower for
    the throughput bench's model on an AVX2-only AMD EPYC; docs/BENCHMARKS.md).

    Args:
        cpuinfo: the text of `/proc/cpuinfo`; read from the machine when None.
            Where it cannot be read (not Linux), the answer is False.

    Example:

    >>> cpu_has_native_bfloat16("flags\t: fpu avx2 avx512f avx512_bf16"), cpu_has_native_bfloat16("flags : avx2")
    (True, False)
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return any(flag in value.split() for flag in _NATIVE_BFLOAT16_CPU_FLAGS)
    return False


def resolve_precision(requested, strategy=None):
    """The Keras dtype policy name for `training.mixed_precision`.

    `"auto"` (or `true`) picks `mixed_float16` on GPUs (Keras then wraps the
    optimizer in a `LossScaleOptimizer`), `mixed_bfloat16` on TPUs and on CPUs
    with native bfloat16 instructions (AVX512_BF16 or AMX: bfloat16 has
    float32's range and needs no loss scaling), and `float32` on other CPUs,
    where bfloat16 would only add conversions (`cpu_has_native_bfloat16`).

    Example:

    >>> resolve_precision("float32"), resolve_precision(False), resolve_precision("mixed_bfloat16")
    ('float32', 'float32', 'mixed_bfloat16')
    """
    if requested in (False, None, "float32"):
        return "float32"
    if requested in (True, "auto"):
        import tensorflow as tf
        on_tpu = strategy is not None and "TPU" in type(strategy).__name__
        if on_tpu:
            return "mixed_bfloat16"
        if tf.config.list_physical_devices("GPU"):
            return "mixed_float16"
        return "mixed_bfloat16" if cpu_has_native_bfloat16() else "float32"
    if requested not in PRECISIONS:
        raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS}, got {requested!r}.")
    return requested


# ------------------------------------------------------------------ workdir
# Keys that may change between runs in one workdir: they do not change the weights' meaning or the vocabulary.
_RESUMABLE_CHANGES = {
    "model": {"beam_size", "length_penalty", "max_decode_extra", "dropout", "attention_dropout", "ffn_dropout",
              "label_smoothing", "warmup_steps", "learning_rate_scale"},
    "data": {"batch_size", "shuffle", "tokens_per_batch", "bucket_width", "shuffle_buffer", "cache", "seed",
             "max_length", "errors", "valid_source", "valid_target", "valid_tokenized_target", "test_source",
             "test_target", "test_tokenized_target", "tfds_valid_split", "tfds_test_split", "tfds_data_dir"},
}


def _check_same_experiment(path, resolved):
    """A workdir belongs to one model and one vocabulary: refuse to resume it with others.

    Training settings, batch sizes, regularisation and evaluation files may
    change between runs (`_RESUMABLE_CHANGES`); model sizes and the data the
    vocabulary was learned from may not.
    """
    if not path.is_file():
        return
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    changed = []
    for section in ("model", "data"):
        old, new = saved.get(section) or {}, resolved[section]
        for key in sorted(set(old) | set(new)):
            if key in _RESUMABLE_CHANGES[section]:
                continue
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
        ConfigError: a bad config, a missing data file, or a workdir that holds another experiment.
        CheckpointError: an unreadable `training.init_checkpoint` or backup (the file is named).
        FloatingPointError: the loss became NaN (training stopped).

    Example:

    >>> result = train("configs/tiny_copy.yaml", "/tmp/kt_tiny")   # doctest: +SKIP
    >>> result.history["masked_accuracy"][-1] > 0.9                 # doctest: +SKIP
    True
    """
    experiment = as_experiment(config)
    experiment.check_model()  # before any data work: a bad model section or a missing file fails in seconds
    experiment.check_files()
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

    # A resumed run draws its dropout masks and its shuffling from a seed of its own: seeded as the first run,
    # it would repeat the first run's noise, example for example (Keras does not save the dropout state).
    resumed_at = _backup_position(output / "backup")
    keras.utils.set_random_seed(resumed_seed(training.seed, *resumed_at))
    if resumed_at != (0, 0):
        log.info("Resuming from %s at epoch %d%s: dropout and shuffling reseeded from training.seed and the "
                 "position", output / "backup", resumed_at[0] + 1,
                 f", batch {resumed_at[1] + 1}" if resumed_at[1] else "")
    policy = resolve_precision(training.policy, strategy)
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        return _train(experiment, workdir, output, strategy, is_chief, policy, resumed_at)
    finally:
        keras.config.set_dtype_policy(previous_policy)


def _train(experiment, workdir, output, strategy, is_chief, policy, resumed_at=(0, 0)):
    from keras_transformer import distribute
    from keras_transformer.losses import LabelSmoothedCrossEntropy, RDropLoss
    from keras_transformer.metrics import MaskedAccuracy
    from keras_transformer.model import build_model
    from keras_transformer.optimizers import make_optimizer

    training = experiment.training
    if training.init_checkpoint and experiment.data.kind != "synthetic" and is_chief:
        _adopt_vocabulary(training.init_checkpoint, workdir / "data" / "vocab")
    data = build_data(experiment.data, workdir / "data", strategy, training.batch_scaling, seed=training.seed,
                      wait_for_chief=not is_chief, resumed_at=resumed_at)
    model_config = experiment.model_config(data.model_fields())
    loss = LabelSmoothedCrossEntropy(model_config.label_smoothing, pad_id=model_config.pad_id)
    if training.rdrop_alpha:  # validation too: without dropout the copies agree, and the loss is the plain one
        data = dataclasses.replace(data, train=repeat_rows(data.train),
                                   validation=None if data.validation is None else repeat_rows(data.validation))
        loss = RDropLoss(training.rdrop_alpha, model_config.label_smoothing, pad_id=model_config.pad_id)
        log.info("R-Drop: every example runs twice per batch, alpha %g", training.rdrop_alpha)
    resolved = experiment.to_dict()
    resolved["model"] = model_config.to_dict()
    _check_same_experiment(output / "experiment.yaml", resolved)
    _write_yaml(output / "experiment.yaml", resolved)
    model_config.save_yaml(output / "model.yaml")
    log.info("Model: %s; dtype policy %s", _summary(model_config), policy)

    cooldown = None
    if training.cooldown_epochs:  # the optimizer counts batches (accumulated or not): so does the schedule
        per_epoch = _batches_per_epoch(training, data)
        if per_epoch is None:
            raise ConfigError("training.cooldown_epochs needs the number of batches per epoch, which this data "
                              "does not tell: set training.steps_per_epoch.")
        cooldown = (training.initial_updates + (training.epochs - training.cooldown_epochs) * per_epoch,
                    training.cooldown_epochs * per_epoch)
        log.info("Cooldown: the learning rate falls linearly to 0 from update %d over %d updates", *cooldown)

    with strategy.scope():
        model = build_model(model_config)
        optimizer = make_optimizer(model_config, gradient_accumulation_steps=training.gradient_accumulation_steps,
                                   cooldown=cooldown, **({"clipnorm": training.clipnorm} if training.clipnorm else {}))
        model.compile(optimizer=optimizer,
                      loss=loss,
                      metrics=[MaskedAccuracy(pad_id=model_config.pad_id)],
                      jit_compile=training.jit_compile, steps_per_execution=training.steps_per_execution)
        distribute.apply_keras_workarounds(model)
        if training.init_checkpoint:  # the weights only: the new run's optimizer starts afresh
            load_weights(_weights_only(model), training.init_checkpoint)
            log.info("Starting from the weights in %s", training.init_checkpoint)
        if training.initial_updates:  # a resumed run's backup restores its own count over this one
            model.optimizer.iterations.assign(training.initial_updates)
            log.info("The optimizer starts at update %d (learning rate %.3g)", training.initial_updates,
                     float(model.optimizer.learning_rate))

    # Order matters: callbacks that add to the epoch logs come before the ones that write them, and the backup
    # comes last, so that a run stopped before it resumes from an epoch whose checkpoint and history are written.
    backup = ResumableBackup(output / "backup", training.backup_every_steps or "epoch")
    callbacks = [LearningRateLogger()]
    if training.bleu_every_epochs and data.valid_pairs is not None:
        from keras_transformer.callbacks import BleuCallback
        best_path = output / "checkpoints" / "best.weights.h5"
        sources, references = (list(side[:training.bleu_max_sentences]) for side in data.valid_pairs)
        tokenized = None
        if experiment.data.valid_tokenized_target:
            from keras_transformer.evaluation import read_lines
            tokenized = read_lines(experiment.data.valid_tokenized_target)[:len(references)]
        callbacks.append(BleuCallback(
            sources, references, tokenizers=data.tokenizers, every_n_epochs=training.bleu_every_epochs,
            lang=experiment.data.pipeline.get("target_language") if tokenized else None,
            tokenized_references=tokenized, best_path=best_path, best=_best_logged(
                output / "history.csv", "val_bleu", resumed_at[0]) if best_path.is_file() else -math.inf,
            batch_size=experiment.decoding.batch_size,
            translator_options={"beam_size": training.bleu_beam_size, "alpha": model_config.length_penalty,
                                "max_extra": model_config.max_decode_extra}))
    callbacks += [
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
    callbacks.append(backup)

    validation = data.validation if training.validation else None
    fit = dict(validation_data=validation, callbacks=callbacks, verbose=progress_verbosity(training.verbose),
               shuffle=False)  # the datasets shuffle themselves
    start = time.time()
    histories = _finish_interrupted_epoch(model, data, training, resumed_at, backup, fit,
                                          replicas=strategy.num_replicas_in_sync)
    if not model.stop_training:
        histories.append(model.fit(data.train, epochs=training.epochs, steps_per_epoch=training.steps_per_epoch,
                                   **fit))
    history = _merge_histories(histories)
    if history.epoch:
        log.info("Trained %d epoch(s) in %.1f s; checkpoints in %s", len(history.epoch), time.time() - start,
                 output / "checkpoints")
    else:
        log.info("Nothing to train: %s already has %d epoch(s), and training.epochs is %d; raise training.epochs "
                 "to train further.", output, _finished_epochs(output), training.epochs)
    losses = history.history.get("loss", [])
    if losses and not np.isfinite(losses[-1]):
        raise FloatingPointError(f"Training stopped: the loss became {losses[-1]} at epoch {history.epoch[-1] + 1}. "
                                 f"Lower the learning rate (model.learning_rate_scale), raise model.warmup_steps, "
                                 f"or set training.clipnorm; the last good weights are in {output / 'checkpoints'}.")
    return TrainingResult(model=model, model_config=model_config, history=history.history, workdir=output,
                          checkpoints=epoch_checkpoints(output), strategy=strategy, tokenizers=data.tokenizers)


def repeat_rows(dataset):
    """`dataset` with every row of every batch repeated in place (rows 2i and 2i + 1 are one example), as
    `losses.RDropLoss` expects. Pairs stay on one replica when a strategy splits the batch evenly: a batch of n
    rows over r replicas gives each replica 2n / r rows, an even number, as the pipelines make n a multiple of r.

    Example:

    >>> import tensorflow as tf
    >>> data = tf.data.Dataset.from_tensors(({"source": tf.constant([[1], [2]])}, tf.constant([[3], [4]])))
    >>> inputs, labels = next(iter(repeat_rows(data)))
    >>> inputs["source"].numpy().ravel().tolist(), labels.numpy().ravel().tolist()
    ([1, 1, 2, 2], [3, 3, 4, 4])
    """
    import tensorflow as tf
    return dataset.map(lambda *batch: tf.nest.map_structure(lambda t: tf.repeat(t, 2, axis=0), batch),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _batches_per_epoch(training, data):
    """`training.steps_per_epoch`, or the training data's number of batches; None when tf.data cannot tell
    (UNKNOWN or INFINITE cardinality)."""
    per_epoch = training.steps_per_epoch or int(data.train.cardinality())
    return per_epoch if per_epoch > 0 else None


def _finish_interrupted_epoch(model, data, training, resumed_at, backup, fit, replicas=1):
    """Trains the batches an epoch interrupted after a batch backup had left; `[history]`, or `[]` when there is
    no such epoch or its length is not known (it then trains again from its first batch, with a warning)."""
    epoch, done = resumed_at
    if not done or epoch >= training.epochs:
        return []
    per_epoch = _batches_per_epoch(training, data)
    if per_epoch is None:
        log.warning("Epoch %d was interrupted after %d batches, but this data does not tell its number of batches "
                    "per epoch (set training.steps_per_epoch): it trains again from its first batch.", epoch + 1, done)
        return []
    if done >= per_epoch:  # a backup of Keras' own at an epoch's last batch, or data that changed length since
        log.warning("The backup records %d trained batches of epoch %d, which has %d: the epoch trains again from "
                    "its first batch.", done, epoch + 1, per_epoch)
        return []
    log.info("Epoch %d was interrupted after %d of its %d batches: training the other %d", epoch + 1, done,
             per_epoch, per_epoch - done)
    backup.offset = done
    restore = RestoreMetricState(backup.backup_dir, epoch, done, replicas=replicas)
    fit = dict(fit, callbacks=[restore, *fit["callbacks"]])
    return [model.fit(data.train, epochs=epoch + 1, steps_per_epoch=per_epoch - done, **fit)]


def _best_logged(history_csv, key, epochs):
    """The highest finite `key` in the first `epochs` rows of a history.csv; -inf without one."""
    _, rows = HistoryCSV(history_csv)._read()
    values = []
    for row in rows:
        try:
            if int(row.get("epoch", "")) <= epochs:
                values.append(float(row.get(key, "")))
        except (TypeError, ValueError):
            continue
    values = [value for value in values if math.isfinite(value)]
    return max(values, default=-math.inf)


def _merge_histories(histories):
    """One `keras.callbacks.History` of several `fit` calls, in order."""
    merged = keras.callbacks.History()
    merged.epoch, merged.history = [], {}
    for history in histories:
        merged.epoch += history.epoch
        for key, values in history.history.items():
            merged.history.setdefault(key, []).extend(values)
    return merged


def _finished_epochs(output):
    """The epochs earlier runs finished in `output`: the number of its last epoch checkpoint (0 without one)."""
    from keras_transformer.evaluation import _checkpoint_number
    checkpoints = epoch_checkpoints(output)
    return _checkpoint_number(checkpoints[-1].name) if checkpoints else 0


def _summary(config):
    return (f"{config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}, "
            f"{config.num_heads} heads, d_ff {config.d_ff}, vocab {config.vocab_size}")


def train_and_evaluate(config, workdir):
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
    ['bleu', 'bleu_lowercase', 'bleu_multi30k', 'length_ratio']
    """
    experiment = as_experiment(config)
    result = train(experiment, workdir)
    data = experiment.data
    if data.kind == "synthetic" or pathlib.Path(result.workdir) != pathlib.Path(workdir):
        return result, {}
    if data.kind == "text" and data.test_source:
        sources, references = data.test_source, data.test_target
    elif data.kind == "tfds" and data.tfds_test_split:
        sources, references = tfds_pairs(data, data.tfds_test_split)
    else:
        return result, {}
    decoding = experiment.decoding
    if decoding.average_last:
        translator = load_translator(workdir, average=decoding.average_last)
    else:
        from keras_transformer.translation import Translator
        config = result.model_config
        translator = Translator(result.model, *result.tokenizers, beam_size=config.beam_size,
                                alpha=config.length_penalty, max_extra=config.max_decode_extra)
    scores = evaluate(translator, sources, references, tokenized_reference=data.test_tokenized_target,
                      lang=data.pipeline.get("target_language"), batch_size=decoding.batch_size,
                      output=pathlib.Path(workdir) / "test.hyp.txt")
    _write_yaml(pathlib.Path(workdir) / "test_scores.yaml", scores)
    log.info("Test scores: %s", ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
    return result, scores


# ------------------------------------------------------------------ packing for other backends
def pack_arrays(config, workdir):
    """Tokenizes an experiment's text data into `workdir/arrays.npz`, for `keras_transformer.arrays`.

    This is `keras-transformer pack`: the TensorFlow half of training on a
    machine without TensorFlow (a GPU machine with JAX, say). It learns or
    loads the vocabulary in `workdir/data/vocab` exactly as `train` does,
    tokenizes the training pairs (over-long ones dropped, as in training) and
    the validation pairs (over-long sides truncated), and writes them with
    `experiment.yaml` and `model.yaml`. The folder then travels;
    `python -m keras_transformer.arrays WORKDIR` trains it on any backend and
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
    from keras_transformer import arrays
    from keras_transformer.data import corpus, pipeline
    experiment = as_experiment(config)
    section = experiment.data
    if section.kind != "text":
        raise ConfigError(f"pack needs data.kind: text (files), got {section.kind!r}.")
    experiment.check_model()
    experiment.check_files()  # the data files and training.init_checkpoint
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data_config = section.data_config(tokenizer_dir=workdir / "data" / "vocab", seed=experiment.training.seed)
    if data_config.subword_dropout:
        raise ConfigError(f"data.subword_dropout={data_config.subword_dropout}: packed arrays hold one fixed "
                          "segmentation, so BPE-dropout cannot apply to them; train with keras-transformer train, "
                          "or pack with --set data.subword_dropout=0.")
    if experiment.training.rdrop_alpha:
        raise ConfigError(f"training.rdrop_alpha={experiment.training.rdrop_alpha}: training from packed arrays "
                          "(keras_transformer.arrays) does not implement R-Drop; train with keras-transformer train, "
                          "or pack with --set training.rdrop_alpha=null.")
    if experiment.training.init_checkpoint:
        _adopt_vocabulary(experiment.training.init_checkpoint, workdir / "data" / "vocab")
    source_tokenizer, target_tokenizer = _tokenizers(section, data_config, workdir / "data" / "vocab", False)
    vocabulary = TrainingData(None, None, source_tokenizer.vocab_size, target_tokenizer.vocab_size,
                              tokenizers=(source_tokenizer, target_tokenizer))
    model_config = experiment.model_config(vocabulary.model_fields())
    resolved = experiment.to_dict()
    resolved["model"] = model_config.to_dict()
    _check_same_experiment(workdir / "experiment.yaml", resolved)

    splits, counts = {}, {}
    for split, source_file, target_file, mode in (
            ("train", data_config.train_source, data_config.train_target, "filter"),
            ("valid", data_config.valid_source, data_config.valid_target, "truncate")):
        if source_file is None:
            continue
        sources, targets, summary = corpus.read_parallel_corpus(source_file, target_file, data_config.errors)
        source_ids, target_ids, summary = corpus.limit_length(
            pipeline._tokenize_corpus(source_tokenizer, sources), pipeline._tokenize_corpus(target_tokenizer, targets),
            data_config.max_length, mode, summary)
        splits[split] = tuple(arrays.arrays_to_ragged(ids.flat_values.numpy(), ids.row_lengths().numpy())
                              for ids in (source_ids, target_ids))
        counts[f"{split}_pairs"] = len(splits[split][0])
        log.info("Packed %s: %s", split, summary)
    counts["train_target_tokens"] = int(sum(len(t) + 1 for t in splits["train"][1]))
    arrays.save_arrays(workdir / arrays.ARRAYS_FILE, splits)
    _write_yaml(workdir / "experiment.yaml", resolved)
    model_config.save_yaml(workdir / "model.yaml")
    return counts


# ------------------------------------------------------------------ using a trained run
def _vocabulary_dir(path):
    """The vocabulary folder of a training workdir or an export."""
    path = pathlib.Path(path)
    return path / "assets.extra" / "vocab" if (path / "saved_model.pb").is_file() else path / "data" / "vocab"


def _folder_files(folder):
    folder = pathlib.Path(folder)
    return {item.name: item.read_bytes() for item in sorted(folder.iterdir()) if item.is_file()} \
        if folder.is_dir() else {}


def _vocabulary_files(path):
    return _folder_files(_vocabulary_dir(path))


def _check_weights_choice(model, checkpoint, average):
    """Refuses weights options that cannot apply: a checkpoint and an average together (for any model), or either
    for an exported model, whose weights are fixed. `load_translator` and `plotting.load_model` share it."""
    checkpoints = checkpoint if isinstance(checkpoint, (list, tuple)) else [checkpoint]
    given = any(path is not None for path in checkpoints)
    if given and average is not None:
        raise ConfigError("Give --checkpoint FILE or --average N (the last N epoch checkpoints), not both.")
    models = model if isinstance(model, (list, tuple)) else [model]
    for path in models:
        if (given or average is not None) and (pathlib.Path(path) / "saved_model.pb").is_file():
            raise ConfigError(f"{path} is an exported model: --checkpoint and --average apply to training workdirs.")


def _check_model_folder(path):
    """A missing `--model` folder is named as missing (not as "neither a workdir nor an export")."""
    if not pathlib.Path(path).exists():
        raise FileNotFoundError(f"Model folder not found: {path} (expected a training workdir or an exported "
                                "model).")


def _load_ensemble(models, checkpoint, average, **options):
    """`load_translator` for several workdirs/exports: one Translator decoding them as an ensemble."""
    if checkpoint is None:
        checkpoints = [None] * len(models)
    elif isinstance(checkpoint, (str, os.PathLike)):
        raise ConfigError(f"An ensemble of {len(models)} models takes one checkpoint per model (or none), "
                          f"got the single checkpoint {checkpoint}.")
    else:
        checkpoints = list(checkpoint)
        if len(checkpoints) != len(models):
            raise ConfigError(f"An ensemble of {len(models)} models takes one checkpoint per model (or none), "
                              f"got {len(checkpoints)}.")
    translators = [load_translator(path, path_checkpoint, average, **options)
                   for path, path_checkpoint in zip(models, checkpoints)]
    vocabulary = _vocabulary_files(models[0])
    for path in models[1:]:
        if _vocabulary_files(path) != vocabulary:
            raise ConfigError(f"{path} has a different vocabulary from {models[0]} ({_vocabulary_dir(path)} against "
                              f"{_vocabulary_dir(models[0])}): ensembled models must share their vocabulary.")
    from keras_transformer.translation import Translator
    return Translator.ensemble(translators)


def load_translator(model, checkpoint=None, average=None, **options):
    """A `Translator` for a training workdir or an exported model directory, or an ensemble of them.

    Args:
        model: a workdir written by `train` (`model.yaml`, `data/vocab`,
            `checkpoints/`) or a directory written by `keras-transformer export`;
            a list of them decodes them as one ensemble (they must share the
            vocabulary files; decoding defaults come from the first).
        checkpoint: a `.weights.h5` file (workdir only); default: the last epoch checkpoint.
            For an ensemble, a list with one entry (or None) per model.
        average: average the last `average` checkpoints instead (workdirs only; each member); not
            together with `checkpoint`. A workdir with fewer averages those, with a warning.
        **options: `Translator` arguments (`beam_size`, `alpha`, `max_extra`);
            default: the model config's decoding fields.

    Returns:
        A `keras_transformer.translation.Translator`.

    Raises:
        FileNotFoundError / ValueError: a missing or unreadable checkpoint or folder (named), ensemble
        members with different vocabularies, or both `checkpoint` and `average`.

    Example:

    >>> translator = load_translator("runs/en_de", average=5, beam_size=4)  # doctest: +SKIP
    >>> translator(["A man rides a bike."])                                  # doctest: +SKIP
    >>> ensemble = load_translator(["runs/en_de", "runs/en_de_seed2"], average=5)  # doctest: +SKIP
    """
    _check_weights_choice(model, checkpoint, average)
    if isinstance(model, (list, tuple)):
        if not model:
            raise ConfigError("load_translator: no model given (an empty list).")
        if len(model) > 1:
            return _load_ensemble([pathlib.Path(m) for m in model], checkpoint, average, **options)
        model = model[0]
        if isinstance(checkpoint, (list, tuple)):
            if len(checkpoint) != 1:
                raise ConfigError(f"One model takes one checkpoint, got {len(checkpoint)}.")
            checkpoint = checkpoint[0]
    path = pathlib.Path(model)
    _check_model_folder(path)
    options = {key: value for key, value in options.items() if value is not None}
    if (path / "saved_model.pb").is_file():
        from keras_transformer.export import load_keras_translator
        return load_keras_translator(path, **options)
    if not (path / "model.yaml").is_file():
        raise FileNotFoundError(f"{path} is neither a training workdir (no model.yaml) nor an exported model "
                                "(no saved_model.pb).")
    if not (path / "data" / "vocab").exists():
        raise ConfigError(f"{path} has no vocabulary (data/vocab): it was trained on synthetic data, which has no "
                          "text to translate.")
    from keras_transformer.translation import Translator
    return Translator.from_workdir(path, checkpoint=checkpoint, average=average, **options)


def _lines(source):
    if isinstance(source, (str, os.PathLike)):
        from keras_transformer.evaluation import read_lines
        return read_lines(source)  # names a missing file, or a folder given for one
    return list(source)


def _check_output(output):
    """Refuses an output file that could not be written, before the decoding it would hold."""
    path = pathlib.Path(output)
    folder = path.parent
    if path.is_dir():
        raise IsADirectoryError(f"Cannot write the translations to {path}: it is a directory.")
    if not folder.is_dir():
        raise FileNotFoundError(f"Cannot write the translations to {path}: the folder {folder} does not exist.")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise PermissionError(f"Cannot write the translations to {path}: permission denied.")


def translate(model, sentences, checkpoint=None, average=None, batch_size=64, **options):
    """Translates sentences with a trained workdir or an exported model (`keras-transformer translate`).

    Args:
        model: a training workdir, an export directory, a list of them (an
            ensemble; see `load_translator`), or a `Translator`.
        sentences: a list of `str` (one sentence: a list of one).
        checkpoint, average, **options: see `load_translator`.
        batch_size: sentences decoded together.

    Returns:
        A list of `str`, one translation per sentence.

    Raises:
        TypeError: `sentences` is one `str` or `bytes` (neither a file name nor
            taken character by character).

    Example:

    >>> translate("saved_models/multi30k_en_de", ["A man rides a bike."])  # doctest: +SKIP
    ['Ein Mann fährt Fahrrad.']
    """
    if isinstance(sentences, (str, bytes)):
        raise TypeError(f"translate takes a list of sentences, got one {type(sentences).__name__}: "
                        f"{sentences[:40]!r}; give one sentence as [sentence], and a file's lines as "
                        "keras_transformer.evaluation.read_lines(path).")
    translator = model if hasattr(model, "translate_lines") else load_translator(model, checkpoint, average, **options)
    return translator.translate_lines(list(sentences), batch_size=batch_size)


def evaluate(model, source, reference, tokenized_reference=None, lang=None, checkpoint=None, average=None,
             batch_size=64, output=None, **options):
    """Translates `source` and scores it with sacreBLEU (`keras-transformer evaluate`).

    Args:
        model: a training workdir, an export directory, a list of them (an
            ensemble; see `load_translator`), or a `Translator`.
        source: the source file (plain or .gz) or a list of sentences.
        reference: the reference file or list, raw text (cased sacreBLEU).
        tokenized_reference: optional `*.lc.norm.tok.*` references: adds the
            published Multi30k BLEU (needs `lang`).
        lang: the target language code, for the Multi30k protocol.
        checkpoint, average, **options: see `load_translator`.
        batch_size: sentences decoded together.
        output: if given, the translations are written there, one per line
            (line breaks inside a translation become spaces: `evaluation.one_line`); its folder
            must exist.

    Raises:
        ValueError / OSError: before any decoding: unreadable or misaligned files (the
        references, tokenized ones included, must have one line per source sentence), or an
        `output` that cannot be written.

    Returns:
        `{"bleu": ..., "bleu_lowercase": ..., "length_ratio": ...}` plus `"bleu_multi30k"` with
        tokenized references (`evaluation.evaluate_translations`), rounded to 2 decimals (ratio: 4).

    Example:

    >>> evaluate("runs/en_de", "test.en", "test.de")  # doctest: +SKIP
    {'bleu': 38.1, 'bleu_lowercase': 39.5, 'length_ratio': 0.9712}
    """
    from keras_transformer import evaluation
    # Everything that can be checked is checked before decoding, which takes minutes on a whole test set.
    if output is not None:
        _check_output(output)
    sources, references = _lines(source), _lines(reference)
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} source sentences but {len(references)} references.")
    tokenized = _lines(tokenized_reference) if tokenized_reference is not None else None
    if tokenized is not None and lang is None:
        raise ConfigError("The Multi30k BLEU protocol (tokenized references) needs the target language (lang).")
    if tokenized is not None and len(tokenized) != len(sources):
        named = f" in {tokenized_reference}" if isinstance(tokenized_reference, (str, os.PathLike)) else ""
        raise ValueError(f"{len(sources)} source sentences but {len(tokenized)} tokenized references{named}.")
    hypotheses = [evaluation.one_line(h) for h in translate(model, sources, checkpoint, average, batch_size,
                                                             **options)]
    if output is not None:
        pathlib.Path(output).write_text("".join(line + "\n" for line in hypotheses), encoding="utf-8")
    scores = evaluation.evaluate_translations(hypotheses, references, lang=lang, tokenized_references=tokenized)
    return {key: round(float(value), 4 if key == "length_ratio" else 2) for key, value in scores.items()}


def average(workdir, last=None, output=None, checkpoints=None):
    """Averages the last `last` epoch checkpoints of a workdir into one weights file (`keras-transformer average`).

    Args:
        workdir: a training workdir (`model.yaml`, `checkpoints/`).
        last: how many checkpoints (the paper: 5 for base, 20 for big); default 5.
        output: the `.weights.h5` file to write; default `workdir/averaged.weights.h5`.
        checkpoints: instead of the last ones, these `.weights.h5` files of the
            workdir's architecture (from any folder), e.g. a run's
            average and that of its continuation in another workdir.

    Returns:
        `(output, paths)`: the written file and the averaged checkpoints.

    Example:

    >>> average("runs/en_de", last=5)  # doctest: +SKIP
    ('runs/en_de/averaged.weights.h5', [... 5 paths ...])
    """
    from keras_transformer import evaluation
    from keras_transformer.model import build_model
    workdir = pathlib.Path(workdir)
    if not (workdir / "model.yaml").is_file():
        raise FileNotFoundError(f"{workdir} is not a training workdir: {workdir / 'model.yaml'} is missing.")
    if checkpoints and last is not None:
        raise ConfigError("average: give --last N (the workdir's last checkpoints) or --checkpoint files, not both.")
    output = pathlib.Path(output) if output is not None else workdir / "averaged.weights.h5"
    if not output.name.endswith(".weights.h5"):
        raise ConfigError(f"The averaged weights file must end in .weights.h5, got {output}.")
    model = build_model(TransformerConfig.from_yaml(workdir / "model.yaml"))
    paths = ([os.fspath(path) for path in checkpoints] if checkpoints
             else evaluation.latest_checkpoints(workdir / "checkpoints", int(5 if last is None else last)))
    evaluation.average_checkpoints(paths, model)
    model.save_weights(os.fspath(output))
    return output, paths
