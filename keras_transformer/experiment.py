"""The experiment config: the YAML schema of a run, loadable without TensorFlow.

An experiment config has four sections, each a frozen dataclass below:

```yaml
model:      # TransformerConfig fields, or `preset: tiny|small|base|big` plus overrides
  preset: tiny
data:       # where sentence pairs come from (DataSection): synthetic, text files or TFDS,
  kind: synthetic  # plus the data pipeline's DataConfig fields (vocab_size, tokens_per_batch, ...)
training:   # epochs, strategy, precision, checkpoints (TrainingSection)
  epochs: 8
decoding:   # how the model decodes (DecodeOptions), written into workdir/model.yaml (DecodingSection)
  beam_size: 4
```

`load_experiment(paths, overrides)` reads one or more YAML files (later files
override earlier ones key by key) and then `--set section.key=value` overrides
(later values win). Unknown keys are rejected with the key named, and the model
section is built into a `TransformerConfig` right away, so that bad sizes fail
before any data work; `train` (and `--dry-run`) also check that the data files
exist.

This module imports the standard library, YAML and the model config only: a machine without TensorFlow (the packed-array trainer on a GPU machine
with JAX) reads a workdir's `experiment.yaml` with the same defaults as `train`.
"""

import dataclasses
import difflib
import os
import pathlib
import typing

import yaml

from keras_transformer.config import DECODING_FIELDS, PRESETS, TransformerConfig, load_yaml
from keras_transformer.data.synthetic import TASKS
from keras_transformer.data.textfile import ERROR_MODES, count_lines
from keras_transformer.decoding.options import OLD_NAMES as OLD_DECODING_NAMES
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import (CheckpointError, CheckpointNotFoundError, ConfigError, CorruptFileError,
                                     format_size)
from keras_transformer.files import atomic_write_text
from keras_transformer.footprint import available_memory, check_training_memory, describe_memory, training_memory

DATA_KINDS = ("synthetic", "text", "tfds")
PRECISIONS = ("float32", "auto", "mixed_float16", "mixed_bfloat16")
SECTIONS = ("model", "data", "training", "decoding")
STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")  # training.strategy
COMMUNICATIONS = ("auto", "ring", "nccl")  # training.communication: multi_worker's all-reduce
JIT_COMPILE = (True, False, "auto")  # training.jit_compile
VERBOSITIES = ("auto", 0, 1, 2)  # training.verbose
NONFINITE = ("stop",)  # training.on_nonfinite
BATCH_SCALINGS = ("per_replica", "global")  # how a batch size is read under a strategy (distribute.global_batch_size)
MODEL_TYPES = ("bpe", "unigram", "wordpiece")  # data.model_type: the SentencePiece / WordPiece vocabulary kinds
SUBWORD_DROPOUT_SIDES = ("both", "source", "target")  # data.subword_dropout_sides


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the parallel text is and how it becomes batches.

    Every field has a default; unknown or invalid fields raise `ValueError`
    naming the field.

    Example:

    >>> config = DataConfig(train_source="train.en.gz", train_target="train.de.gz", tokens_per_batch=4096)
    >>> config.vocab_size, config.shared_vocab, config.max_length
    (10000, True, 128)
    >>> DataConfig.from_dict(config.to_dict()) == config
    True
    """

    # --- files ----------------------------------------------------------------
    train_source: typing.Optional[str] = None  # training source file, one sentence per line (plain or .gz UTF-8)
    train_target: typing.Optional[str] = None  # training target file, line-aligned with train_source
    corpora: typing.Optional[list] = None  # instead of train_source/train_target: several training corpora, each
                                           # {name, source, target, weight, max_pairs}, drawn in proportion to the
                                           # weights (max_pairs: that corpus's first N line pairs only)
    max_train_pairs: typing.Optional[int] = None  # read only the first N line pairs of train_source/train_target
                                                  # (vocabulary and training); None reads them all
    valid_source: typing.Optional[str] = None  # validation source file (optional)
    valid_target: typing.Optional[str] = None  # validation target file
    source_language: str = "en"  # language code of the source side (TFDS: its feature name; reports)
    target_language: str = "de"  # language code of the target side (TFDS: its feature name; Multi30k BLEU)
    errors: str = "strict"  # invalid UTF-8: "strict" fails with file and line, "replace" uses U+FFFD
    # --- vocabulary -----------------------------------------------------------
    tokenizer_dir: typing.Optional[str] = None  # saved tokenizers, learned from the training files if absent;
                                                # train and pack keep theirs in WORKDIR/data/vocab instead
    model_type: str = "bpe"  # SentencePiece "bpe" (joint BPE, reversible), "unigram", or "wordpiece"
    vocab_size: int = 10000  # ids incl. pad/unk/bos/eos; ~10k joint BPE is the best published Multi30k setting
    shared_vocab: bool = True  # one vocabulary for both languages (needed for tie_embeddings="all")
    lowercase: bool = False  # case-fold text before learning and tokenizing (output is then lowercase)
    vocab_sample_size: typing.Optional[int] = 1_000_000  # sentences the vocabulary is learned from, drawn uniformly
                                                         # in one pass (half per side when shared); null: every one
    subword_dropout: float = 0.0  # BPE-dropout in training: each merge skipped with this probability, anew each
                                  # pass (SentencePiece "bpe" only; 0 is off; validation and inference never sample)
    subword_dropout_sides: str = "both"  # which sides BPE-dropout samples: "both", "source" or "target"
    # --- batching -------------------------------------------------------------
    tokens_per_batch: int = 4096  # GLOBAL budget per step: <= this many source and target positions, padding incl.
    max_length: int = 128  # longest sequence in positions (tokens + bos/eos); longer pairs dropped in training
    bucket_width: int = 1  # lengths sorted as one (mixed at random in training); 1 gives the least padding
    window: int = 262144  # lines read, shuffled, sorted by length and batched together: the memory held
    cache: bool = True  # keep the padded batches of inference (validation) datasets in memory
    seed: typing.Optional[int] = None  # shuffle seed; None: a different order every run

    def __post_init__(self):
        for name in ("vocab_size", "tokens_per_batch", "max_length", "bucket_width", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"DataConfig.{name} must be a positive integer, got {value!r}.")
        if self.vocab_sample_size is not None and (not _is_integer(self.vocab_sample_size)
                                                   or self.vocab_sample_size < 2):
            raise ValueError(f"DataConfig.vocab_sample_size must be an integer of at least 2 or None (every "
                             f"sentence), got {self.vocab_sample_size!r}.")
        if self.max_length < 2:
            raise ValueError(f"DataConfig.max_length must be at least 2 (bos/eos plus a token), got {self.max_length}.")
        if self.tokens_per_batch < self.max_length:
            raise ValueError(f"DataConfig.tokens_per_batch={self.tokens_per_batch} is smaller than max_length="
                             f"{self.max_length}: the longest pair would not fit in a batch.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"DataConfig.seed must be a non-negative integer or None, got {self.seed!r}.")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"DataConfig.model_type must be one of {MODEL_TYPES}, got {self.model_type!r}.")
        if (isinstance(self.subword_dropout, bool) or not isinstance(self.subword_dropout, (int, float))
                or not 0 <= self.subword_dropout < 1):
            raise ValueError(f"DataConfig.subword_dropout must be a probability in [0, 1), got {self.subword_dropout!r}.")
        if self.subword_dropout and self.model_type != "bpe":
            raise ValueError(f"DataConfig.subword_dropout (BPE-dropout) needs model_type 'bpe', got {self.model_type!r}.")
        if self.subword_dropout_sides not in SUBWORD_DROPOUT_SIDES:
            raise ValueError(f"DataConfig.subword_dropout_sides must be one of {SUBWORD_DROPOUT_SIDES}, "
                             f"got {self.subword_dropout_sides!r}.")
        if self.errors not in ERROR_MODES:
            raise ValueError(f"DataConfig.errors must be one of {ERROR_MODES}, got {self.errors!r}.")
        if (self.train_source is None) != (self.train_target is None):
            raise ValueError("DataConfig.train_source and train_target must be given together.")
        if self.max_train_pairs is not None and (not _is_integer(self.max_train_pairs) or self.max_train_pairs < 1):
            raise ValueError(f"DataConfig.max_train_pairs must be a positive integer or None (every pair), got "
                             f"{self.max_train_pairs!r}.")
        if self.corpora is not None:
            if self.train_source is not None:
                raise ValueError("DataConfig.corpora replaces train_source/train_target: give one or the other.")
            if self.max_train_pairs is not None:
                raise ValueError("DataConfig.max_train_pairs caps train_source/train_target; with corpora, give "
                                 "each corpus its own max_pairs.")
            object.__setattr__(self, "corpora", _checked_corpora(self.corpora))
        if (self.valid_source is None) != (self.valid_target is None):
            raise ValueError("DataConfig.valid_source and valid_target must be given together.")

    @classmethod
    def from_dict(cls, values):
        """Builds a config from a mapping (a YAML section), rejecting unknown keys by name.

        Example:

        >>> DataConfig.from_dict({"tokens_per_batch": 2048}).tokens_per_batch
        2048
        """
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown DataConfig fields {unknown}; known fields: {sorted(known)}.")
        return cls(**values)

    def to_dict(self):
        """The fields as a plain dict (for YAML).

        Example:

        >>> DataConfig().to_dict()["model_type"]
        'bpe'
        """
        return dataclasses.asdict(self)

    def training_corpora(self):
        """The training corpora as dicts `{name, source, target, weight, max_pairs}`: `corpora`, or
        `train_source` and `train_target` as one corpus named "train" (capped by `max_train_pairs`); `[]` without
        either.

        Example:

        >>> DataConfig(train_source="a.en", train_target="a.de", max_train_pairs=5000).training_corpora()
        [{'name': 'train', 'source': 'a.en', 'target': 'a.de', 'weight': 1, 'max_pairs': 5000}]
        """
        if self.corpora is not None:
            return [dict(corpus) for corpus in self.corpora]
        if self.train_source is None:
            return []
        return [{"name": "train", "source": self.train_source, "target": self.train_target, "weight": 1,
                 "max_pairs": self.max_train_pairs}]


CORPUS_KEYS = ("name", "source", "target", "weight", "max_pairs")


def _checked_corpora(corpora):
    """`data.corpora` with each corpus's weight filled in (1), or a `ValueError` naming what is wrong."""
    if not isinstance(corpora, (list, tuple)) or not corpora:
        raise ValueError(f"DataConfig.corpora must be a non-empty list of {{name, source, target, weight}} "
                         f"mappings, got {corpora!r}.")
    checked, names = [], set()
    for number, corpus in enumerate(corpora, start=1):
        where = f"DataConfig.corpora[{number - 1}]"
        if not isinstance(corpus, dict):
            raise ValueError(f"{where} must be a mapping with keys {list(CORPUS_KEYS)}, got {corpus!r}.")
        unknown = sorted(set(corpus) - set(CORPUS_KEYS))
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; a corpus has {list(CORPUS_KEYS)}.")
        for key in ("name", "source", "target"):
            if not isinstance(corpus.get(key), str) or not corpus[key]:
                raise ValueError(f"{where}.{key} must be a non-empty string, got {corpus.get(key)!r}.")
        weight = corpus.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
            raise ValueError(f"{where} ({corpus['name']}): weight must be a positive number, got {weight!r}.")
        if corpus["name"] in names:
            raise ValueError(f"{where}: the name {corpus['name']!r} is taken by an earlier corpus; names must "
                             "differ.")
        max_pairs = corpus.get("max_pairs")
        if max_pairs is not None and (not _is_integer(max_pairs) or max_pairs < 1):
            raise ValueError(f"{where} ({corpus['name']}): max_pairs must be a positive integer or null (every "
                             f"pair), got {max_pairs!r}.")
        names.add(corpus["name"])
        checked.append({"name": corpus["name"], "source": corpus["source"], "target": corpus["target"],
                        "weight": weight, "max_pairs": max_pairs})
    return checked


def _is_integer(value):
    """An int that is not a bool: YAML's `true` is an int to Python, but never a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _pipeline_fields():
    """The fields of the data pipeline's `DataConfig` (tokenizer and batching of real text)."""
    return [f.name for f in dataclasses.fields(DataConfig)]


@dataclasses.dataclass(frozen=True)
class DataSection:
    """Where the sentence pairs come from and how they are batched (the YAML `data:` section).

    `kind: synthetic` trains on the copy/reverse task of
    `keras_transformer.data.synthetic` (no files, no tokenizer). `kind: text`
    reads parallel text files; `kind: tfds` reads a TensorFlow Datasets
    translation set (needs `pip install tensorflow-datasets` and internet).
    For both text kinds the section also takes every field of
    `DataConfig` (`train_source`,
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
    tfds_train_split: str = "train"  # the split to train on
    tfds_valid_split: typing.Optional[str] = "validation"  # the validation split (null: none)
    tfds_test_split: typing.Optional[str] = "test"  # translated and scored after training (null: none)
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
        keras_transformer.errors.ConfigError: data.train_source: file not found: /nonexistent.en
        """
        if self.kind == "synthetic":
            return
        files = {name: self.pipeline.get(name) for name in ("train_source", "train_target", "valid_source",
                                                             "valid_target")}
        for number, corpus in enumerate(self.pipeline.get("corpora") or []):
            files.update({f"corpora[{number}].source": corpus.get("source"),
                          f"corpora[{number}].target": corpus.get("target")})
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

    def check_line_counts(self):
        """Counts the lines of each split's files (streaming, `textfile.count_lines`) and refuses files that
        disagree: line N of a source file must translate line N of its target (and of its tokenized references).

        `keras-transformer train --dry-run` calls it, after `check_files`: a cut or misaligned file shows
        before the vocabulary is learned, without reading the corpus into memory.

        Returns:
            `{split: lines}` for the splits that have files ("train", "valid", "test"); `{}` for synthetic
            and TFDS data.

        Raises:
            ConfigError: two files of a split differ in length (both keys, files and counts are named).

        Example:

        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> for name, text in (("a.en", "One.\\nTwo.\\n"), ("a.de", "Eins.\\nZwei.\\n"), ("b.de", "Eins.\\n")):
        ...     _ = (folder / name).write_text(text, encoding="utf-8")
        >>> def section(target):
        ...     return DataSection.from_dict({"kind": "text", "train_source": str(folder / "a.en"),
        ...                                   "train_target": str(folder / target)})
        >>> section("a.de").check_line_counts()
        {'train': 2}
        >>> section("b.de").check_line_counts()
        Traceback (most recent call last):
        ...
        keras_transformer.errors.ConfigError: data.train_source (.../a.en) has 2 lines but data.train_target (.../b.de) has 1: line N of one must translate line N of the other.
        """
        if self.kind != "text":
            return {}
        files = self.pipeline.get
        splits = {"train": {"train_source": files("train_source"), "train_target": files("train_target")},
                  **{f"corpus {corpus['name']}": {f"corpora[{number}].source": corpus["source"],
                                                  f"corpora[{number}].target": corpus["target"]}
                     for number, corpus in enumerate(files("corpora") or [])},
                  "valid": {"valid_source": files("valid_source"), "valid_target": files("valid_target"),
                            "valid_tokenized_target": self.valid_tokenized_target},
                  "test": {"test_source": self.test_source, "test_target": self.test_target,
                           "test_tokenized_target": self.test_tokenized_target}}
        counts = {}
        for split, paths in splits.items():
            lines = [(name, path, count_lines(path)) for name, path in paths.items() if path is not None]
            for name, path, count in lines[1:]:
                first, first_path, first_count = lines[0]
                if count != first_count:
                    raise ConfigError(f"data.{first} ({first_path}) has {first_count} lines but data.{name} "
                                      f"({path}) has {count}: line N of one must translate line N of the other.")
            if lines:
                counts[split] = lines[0][2]
        return counts

    def resolved(self, seed, workdir=None):
        """The section as `train` reads it, every field of this kind given: the kind's own fields (vocab_size,
        max_length and seed filled in), and for text and TFDS data every `DataConfig` field.

        Args:
            seed: `training.seed`, the seed of a section without `data.seed`.
            workdir: the run's folder: `tokenizer_dir` becomes `workdir/data/vocab`, where `train` keeps it.

        Example:

        >>> DataSection.from_dict({"kind": "synthetic"}).resolved(seed=1234)["vocab_size"]
        32
        """
        values = {name: value for name, value in self.to_dict().items() if name not in self.pipeline}
        values["seed"] = self.seed if self.seed is not None else seed
        if self.kind == "synthetic":
            values.update(vocab_size=self.synthetic_vocab_size, max_length=self.synthetic_max_length)
            return values
        vocab = None if workdir is None else pathlib.Path(workdir) / "data" / "vocab"
        values.update(self.data_config(tokenizer_dir=vocab, seed=seed).to_dict())
        return values


@dataclasses.dataclass(frozen=True)
class TrainingSection:
    """How to train: length, hardware, precision, checkpoints.

    Example:

    >>> TrainingSection(epochs=3, strategy="mirrored").batch_scaling
    'per_replica'
    """

    epochs: int = 10  # epochs in total (a resumed run counts the ones already done)
    steps_per_epoch: typing.Optional[int] = None  # batches an epoch (updates without gradient accumulation),
                                                  # from the training data repeated without end
                                                  # (each pass shuffled anew); None: an epoch is one pass
    strategy: str = "auto"  # see keras_transformer.STRATEGIES
    devices: typing.Optional[list] = None  # devices for "mirrored" / "one_device", e.g. ["/gpu:0", "/gpu:1"]
    communication: str = "auto"  # multi_worker all-reduce: "auto", "ring" or "nccl"
    batch_scaling: str = "per_replica"  # data batch sizes are "per_replica" or "global" (docs/distributed.md)
    mixed_precision: typing.Any = "float32"  # "float32", "auto", "mixed_float16", "mixed_bfloat16" (or bool)
    jit_compile: typing.Any = "auto"  # XLA: true, false or "auto" (Keras decides)
    steps_per_execution: int = 1  # batches per tf.function call (fewer Python round trips)
    gradient_accumulation_steps: int = 1  # update with the mean gradient of this many batches; the schedule,
                                          # `step` and initial_updates count updates (docs/training.md)
    clipnorm: typing.Optional[float] = None  # clip each gradient to this norm
    cooldown_epochs: typing.Optional[int] = None  # over the last K epochs the learning rate falls linearly to zero
    rdrop_alpha: typing.Optional[float] = None  # R-Drop (null or 0: off): every pair runs twice a batch, with
                                                # two dropout masks, and alpha / 4 times their symmetric KL joins
                                                # the loss (losses.RDropLoss); a batch computes twice the positions
    ema_decay: typing.Optional[float] = None  # keep an exponential moving average of the weights (Keras' use_ema)
                                              # with this decay, e.g. 0.999 (null: off); checkpoints, validation,
                                              # BLEU, average and export use it, the backup keeps the raw weights
    seed: int = 1234  # keras.utils.set_random_seed: initial weights, dropout, shuffling
    checkpoint_every_steps: typing.Optional[int] = None  # also write checkpoints/step-XXXXXXXX.weights.h5
    keep_step_checkpoints: int = 3  # how many step checkpoints to keep
    keep_checkpoints: typing.Optional[int] = None  # epoch checkpoints to keep; None keeps all (for averaging)
    backup_every_steps: typing.Optional[int] = None  # also back up every N batches (resume inside an epoch)
    on_nonfinite: str = "stop"  # a non-finite loss or weight stops the run before anything of its epoch is saved;
                                # the only choice: no "skip" (docs/training.md, "When the loss is not finite")
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
        if not _is_integer(self.epochs) or self.epochs <= 0:
            raise ConfigError(f"training.epochs must be a positive integer, got {self.epochs!r}.")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"training.strategy must be one of {STRATEGIES}, got {self.strategy!r}.")
        if self.communication not in COMMUNICATIONS:
            raise ConfigError(f"training.communication must be one of {COMMUNICATIONS}, got {self.communication!r}.")
        if self.batch_scaling not in BATCH_SCALINGS:
            raise ConfigError(f"training.batch_scaling must be one of {BATCH_SCALINGS}, "
                              f"got {self.batch_scaling!r}.")
        if not (isinstance(self.mixed_precision, bool) or self.mixed_precision is None
                or self.mixed_precision in PRECISIONS):
            raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS} or a bool, "
                              f"got {self.mixed_precision!r}.")
        if not (isinstance(self.jit_compile, bool) or self.jit_compile == "auto"):  # not `in JIT_COMPILE`: 1 == True
            raise ConfigError(f"training.jit_compile must be true, false or 'auto', got {self.jit_compile!r}.")
        if self.on_nonfinite == "skip":
            raise ConfigError("training.on_nonfinite: 'skip' is not offered: dropping an update needs a check inside "
                              "the compiled training step, which Keras' fit does not expose, and a run that keeps "
                              "skipping is better stopped and resumed with a lower learning rate (mixed_float16's "
                              "loss scaling already skips its overflowing updates). Use 'stop', the default.")
        if self.on_nonfinite not in NONFINITE:
            raise ConfigError(f"training.on_nonfinite must be 'stop', got {self.on_nonfinite!r}.")
        if isinstance(self.verbose, bool) or self.verbose not in VERBOSITIES:
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
        if self.ema_decay is not None and (isinstance(self.ema_decay, bool)
                                           or not isinstance(self.ema_decay, (int, float))
                                           or not 0 < self.ema_decay < 1):
            raise ConfigError(f"training.ema_decay must be a number between 0 and 1 (exclusive; e.g. 0.999) or null, "
                              f"got {self.ema_decay!r}.")
        if self.steps_per_epoch is not None and self.steps_per_epoch % self.steps_per_execution:
            raise ConfigError(f"training.steps_per_epoch={self.steps_per_epoch} is not a multiple of "
                              f"training.steps_per_execution={self.steps_per_execution}: Keras runs whole executions, "
                              f"so an epoch would train "
                              f"{-(-self.steps_per_epoch // self.steps_per_execution) * self.steps_per_execution} "
                              f"updates.")
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
    """How the run's model decodes: the `DecodeOptions` keys (`keras_transformer/decoding/options.py`), written
    into `workdir/model.yaml` so that evaluation, translation and export use them, and two settings of the
    evaluation at the end of training.

    The YAML section is flat: the `DecodeOptions` fields (old names accepted: `length_penalty` for `alpha`,
    `max_decode_extra` for `max_extra`) beside `batch_size` and `average_last`.

    Example:

    >>> section = DecodingSection.from_dict({"beam_size": 5, "length_penalty": 1.0, "batch_size": 32})
    >>> section.options.beam_size, section.options.alpha, section.batch_size
    (5, 1.0, 32)
    """

    options: DecodeOptions = DecodeOptions()  # the DecodeOptions keys, flat in the section
    batch_size: int = 64  # sentences decoded together when evaluating
    average_last: typing.Optional[int] = None  # test evaluation averages the last N checkpoints (paper: 5 / 20)

    def validate(self):
        """Raises `ConfigError` naming the first bad field (the options validate themselves)."""
        for name in ("batch_size", "average_last"):
            value = getattr(self, name)
            if value is None and name != "batch_size":
                continue
            if not _is_integer(value) or value <= 0:
                raise ConfigError(f"decoding.{name} must be a positive integer, got {value!r}.")

    @classmethod
    def from_dict(cls, values):
        """The section from its flat YAML mapping; unknown keys are refused by name."""
        values = dict(values or {})
        _reject_unknown(values, [f.name for f in dataclasses.fields(DecodeOptions)] + list(OLD_DECODING_NAMES)
                        + ["batch_size", "average_last"], "decoding.")
        own = {name: values.pop(name) for name in ("batch_size", "average_last") if name in values}
        section = cls(options=DecodeOptions.from_dict(values), **own)
        section.validate()
        return section

    def to_dict(self):
        """The flat YAML mapping: the options' fields, then `batch_size` and `average_last`."""
        return {**self.options.to_dict(), "batch_size": self.batch_size, "average_last": self.average_last}


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
        moved = [name for name in DECODING_FIELDS if name in model]
        if moved:
            raise ConfigError(f"model.{moved[0]} is a decoding setting: give it in the decoding section "
                              f"(decoding.{OLD_DECODING_NAMES.get(moved[0], moved[0])}).")
        _reject_unknown(model, [f.name for f in dataclasses.fields(TransformerConfig)] + ["preset"], "model.")
        if "preset" in model:
            if model["preset"] not in PRESETS:
                raise ConfigError(f"model.preset must be one of {sorted(PRESETS)}, got {model['preset']!r}.")
        sections = {}
        for name, section_class in (("data", DataSection), ("training", TrainingSection),
                                    ("decoding", DecodingSection)):
            section_values = values.get(name) or {}
            if section_class in (DataSection, DecodingSection):
                sections[name] = section_class.from_dict(section_values)
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
                "training": dataclasses.asdict(self.training), "decoding": self.decoding.to_dict()}

    def model_config(self, vocabulary=None):
        """The `TransformerConfig`: preset (if any), the model fields, the data's vocabulary.

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
        keras_transformer.errors.CheckpointNotFoundError: training.init_checkpoint: Checkpoint not found: /nonexistent.weights.h5
        """
        self.data.check_files()
        path = self.training.init_checkpoint
        if path is not None:
            path = pathlib.Path(path)
            if path.is_dir():
                raise CheckpointError(f"training.init_checkpoint: {path} is a directory, not a weights file.")
            if not path.is_file():
                raise CheckpointNotFoundError(f"training.init_checkpoint: Checkpoint not found: {path}")

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
        keras_transformer.errors.ConfigError: model: TransformerConfig: d_model=60 is not divisible by num_heads=7; ...
        """
        self.model_config(self._configured_vocabulary())

    def training_memory(self):
        """`footprint.training_memory` of this experiment: its model (with the configured vocabulary, as
        `check_model`), a batch of its tokens (synthetic data: `batch_size` sentences of `max_length`), its
        dtype policy ("auto" counted as float32), moving average and gradient accumulation.

        Example:

        >>> ExperimentConfig.from_dict({"model": {"preset": "tiny"}}).training_memory()["parameters"]
        235520
        """
        config = self.model_config(self._configured_vocabulary())
        if self.data.kind == "synthetic":
            tokens = self.data.batch_size * (self.data.synthetic_max_length + 1)
        else:
            tokens = self.data.data_config().tokens_per_batch
        return training_memory(config, tokens, self.training.policy, moving_average=self.training.ema_decay is not None,
                               accumulation=self.training.gradient_accumulation_steps > 1)

    def check_memory(self):
        """Refuses (`ConfigError`) a model whose training needs more memory than this machine has available
        (`footprint.check_training_memory`), naming the estimate and the memory; returns the estimate.

        `train` and `train --dry-run` call it before anything is written.
        """
        memory = self.training_memory()
        check_training_memory(memory)
        return memory

    def _configured_vocabulary(self):
        """The vocabulary `model_config` takes before the data's is learned: synthetic data's own, else the
        model section's sizes (None when it gives vocab_size), else `data.vocab_size`."""
        if self.data.kind == "synthetic":  # the vocabulary is the configured one
            return self.data.synthetic_vocab_size
        if self.model.get("vocab_size") is not None:
            return None
        given = [size for size in (self.model.get("source_vocab_size"), self.model.get("target_vocab_size"))
                 if _is_integer(size) and size > 0]
        return max(given) if given else self.data.data_config().vocab_size

    def resolved(self, workdir=None):
        """The experiment with every default filled in: the model section as the whole `TransformerConfig`
        (preset expanded), each other section with all of its fields.

        Fed back as a config, it resolves to itself. Unlike `to_dict` (what `train` writes to
        `experiment.yaml`), it holds defaults too. For text and TFDS data the model's vocabulary size is the
        configured one (`data.vocab_size`) until `train` learns the vocabulary.

        Example:

        >>> resolved = ExperimentConfig.from_dict({"model": {"preset": "tiny"}}).resolved()
        >>> resolved["model"]["d_model"], "preset" in resolved["model"], resolved["data"]["seed"]
        (64, False, 1234)
        """
        model = self.model_config(self._configured_vocabulary()).to_dict()
        return {"model": model, "data": self.data.resolved(self.training.seed, workdir),
                "training": dataclasses.asdict(self.training), "decoding": self.decoding.to_dict()}

    def dry_run(self, workdir=None):
        """What `keras-transformer train --dry-run` prints: the `resolved` experiment as YAML, after the checks
        that need no data work (`check_files`, then `DataSection.check_line_counts`), with comment lines on
        what `train` settles later.

        Raises:
            ConfigError: a data file is missing, or two files of a split differ in length (named).

        Example:

        >>> print(ExperimentConfig.from_dict({"model": {"preset": "tiny"}}).dry_run())  # doctest: +ELLIPSIS
        # keras-transformer train --dry-run: ...
        model:
          vocab_size: 32
        ...
        """
        self.check_files()
        memory = self.check_memory()
        counts = self.data.check_line_counts()
        notes = ["keras-transformer train --dry-run: the experiment resolved, every default filled in (each key: "
                 "docs/config.md); nothing trained or written",
                 f"model: {describe_memory(memory)}; this machine has {_available()} available"]
        if self.model.get("preset"):
            notes.append(f"model: preset {self.model['preset']!r} expanded, the model keys given override it")
        if self.data.kind != "synthetic":
            notes.append("model vocabulary sizes: the configured ones until train learns the vocabulary (or finds "
                         "it in WORKDIR/data/vocab) and takes its size")
        if counts:
            notes.append("data files: " + ", ".join(f"{split} {lines} lines" for split, lines in counts.items())
                         + ", in each file of the split")
        return "".join(f"# {note}\n" for note in notes) + yaml.safe_dump(self.resolved(workdir), sort_keys=False)


def _available():
    available = available_memory()
    return "an unknown amount of memory" if available is None else format_size(available)


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


# Keys that may change between runs in one workdir: they do not change the weights' meaning or the vocabulary.
_RESUMABLE_CHANGES = {
    "model": {"beam_size", "length_penalty", "max_decode_extra", "early_exit", "dropout", "attention_dropout",
              "ffn_dropout", "label_smoothing", "warmup_steps", "learning_rate_scale"},
    "data": {"batch_size", "shuffle", "tokens_per_batch", "bucket_width", "window", "cache", "seed",
             "max_length", "errors", "valid_source", "valid_target", "valid_tokenized_target", "test_source",
             "test_target", "test_tokenized_target", "tfds_valid_split", "tfds_test_split", "tfds_data_dir"},
}


def changed_experiment(path, resolved, sections=("model", "data")):
    """The changes between the experiment a workdir's `experiment.yaml` (`path`) records and `resolved` that a
    run cannot resume across (`_RESUMABLE_CHANGES` lists the ones it can), one `section.key: old -> new` each;
    [] when there is no such file.

    Raises:
        CorruptFileError: the file is not YAML.

    Example:

    >>> import tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "experiment.yaml"
    >>> write_yaml(path, {"model": {"d_model": 64, "dropout": 0.1}, "data": {}})
    >>> changed_experiment(path, {"model": {"d_model": 32, "dropout": 0.3}, "data": {}})
    ['model.d_model: 64 -> 32']
    """
    if not path.is_file():
        return []
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise CorruptFileError(f"{path} is not valid YAML ({_first_line(error)}): restore it, or delete "
                               f"{path.parent} to start over.") from None
    if not isinstance(saved, dict):
        raise CorruptFileError(f"{path} is not an experiment config (a mapping of sections): restore it, or delete "
                               f"{path.parent} to start over.")
    changed = []
    for section in sections:
        old, new = saved.get(section) or {}, resolved[section]
        for key in sorted(set(old) | set(new)):
            if key in _RESUMABLE_CHANGES[section]:
                continue
            if old.get(key) != new.get(key):
                changed.append(f"{section}.{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changed


def check_same_experiment(path, resolved):
    """A workdir belongs to one model and one vocabulary: refuse to resume it with others.

    Training settings, batch sizes, regularisation and evaluation files may
    change between runs (`_RESUMABLE_CHANGES`); model sizes and the data the
    vocabulary was learned from may not (a run that never trained may start
    again with another config: `training.train` replaces it).
    """
    changed = changed_experiment(path, resolved)
    if changed:
        raise ConfigError(f"{path.parent} holds a run with another model or data config ({'; '.join(changed)}). "
                          f"Use a new --workdir, or delete {path.parent} to start over.")


def _first_line(error):
    return " ".join(str(error).split())[:200]


def write_yaml(path, values):
    """Writes `values` as YAML to `path` atomically, keys in their order."""
    atomic_write_text(path, yaml.safe_dump(values, sort_keys=False))
