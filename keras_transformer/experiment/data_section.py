"""`DataSection`, the experiment's `data:` section: synthetic pairs, text files or TensorFlow Datasets, with the
pipeline's `DataConfig` fields beside its own."""

import dataclasses
import pathlib
import typing

from keras_transformer.data.synthetic import TASKS
from keras_transformer.errors import ConfigError
from keras_transformer.experiment.data_config import DataConfig
from keras_transformer.experiment.data_files import check_data_files, count_split_lines
from keras_transformer.experiment.validation import DATA_KINDS, is_integer, reject_unknown


def _pipeline_fields() -> list[str]:
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

    kind: str = "synthetic"  # "synthetic", "text" (parallel files; the default when train_source or corpora is
                             # given) or "tfds" (TensorFlow Datasets)
    vocab_size: typing.Optional[int] = None  # synthetic: 32 by default; text: DataConfig.vocab_size (10000)
    max_length: typing.Optional[int] = None  # synthetic: longest sentence (10); text: model.max_length or less
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
    def from_dict(cls, values: typing.Optional[dict[str, typing.Any]]) -> "DataSection":
        """Builds the section from its flat YAML mapping, rejecting unknown keys by name."""
        values = dict(values or {})
        own = [f.name for f in dataclasses.fields(cls) if f.name != "pipeline"]
        if "pipeline" in values:
            raise ConfigError("data.pipeline is not a key: write the DataConfig fields directly under data:.")
        if "kind" not in values and ("train_source" in values or "corpora" in values):
            values["kind"] = "text"  # files given: the section reads text, whatever the default kind
        kind = values.get("kind", "synthetic")
        pipeline_keys = _pipeline_fields() if kind != "synthetic" else []
        for key in values:
            if key not in own and key not in pipeline_keys:
                if kind == "synthetic" and key in _pipeline_fields():
                    raise ConfigError(f"data.{key} applies to data.kind 'text' or 'tfds', not 'synthetic'.")
                reject_unknown({key: None}, own + pipeline_keys, "data.")
        section = cls(**{k: v for k, v in values.items() if k in own},
                      pipeline={k: v for k, v in values.items() if k not in own})
        section.validate()
        return section

    def to_dict(self) -> dict[str, typing.Any]:
        """The flat mapping written to YAML: the fields that apply to this kind, pipeline fields beside them."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k != "pipeline"}
        names = list(values)
        synthetic = names[names.index("task"):names.index("shuffle") + 1]
        text = names[names.index("valid_tokenized_target"):names.index("test_tokenized_target") + 1]
        tfds = names[names.index("tfds_name"):]
        dropped = {"synthetic": text + tfds, "text": synthetic + tfds, "tfds": synthetic}[self.kind]
        return {**{k: v for k, v in values.items() if k not in dropped}, **self.pipeline}

    @property
    def synthetic_vocab_size(self) -> int:
        """The synthetic task's vocabulary (reserved ids included)."""
        return self.vocab_size if self.vocab_size is not None else 32

    @property
    def synthetic_max_length(self) -> int:
        """The synthetic task's longest sentence."""
        return self.max_length if self.max_length is not None else 10

    def data_config(self, tokenizer_dir: typing.Any = None, tokens_per_batch: typing.Optional[int] = None,
                    seed: typing.Optional[int] = None) -> DataConfig:
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

    def validate(self) -> None:
        """Raises `ConfigError` naming the first bad field."""
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"data.kind must be one of {DATA_KINDS}, got {self.kind!r}.")
        if self.seed is not None and (not is_integer(self.seed) or self.seed < 0):
            raise ConfigError(f"data.seed must be a non-negative integer or null, got {self.seed!r}.")
        if self.kind == "synthetic":
            if self.task not in TASKS:
                raise ConfigError(f"data.task must be one of {TASKS}, got {self.task!r}.")
            for name in ("train_examples", "val_examples", "min_length", "batch_size", "synthetic_vocab_size",
                         "synthetic_max_length"):
                value = getattr(self, name)
                if not is_integer(value) or value <= 0:
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
        if self.kind == "text" and config.train_source is None and config.corpora is None:
            raise ConfigError("data.kind 'text' needs data.train_source and data.train_target (file paths), or "
                              "data.corpora.")
        if self.kind == "tfds":
            if not self.tfds_name:
                raise ConfigError("data.kind 'tfds' needs data.tfds_name, e.g. wmt14_translate/de-en.")
            if config.train_source is not None:
                raise ConfigError("data.kind 'tfds' reads TensorFlow Datasets: leave data.train_source unset.")
            if self.tfds_max_examples is not None and (not is_integer(self.tfds_max_examples)
                                                       or self.tfds_max_examples <= 0):
                raise ConfigError(f"data.tfds_max_examples must be a positive integer or null, "
                                  f"got {self.tfds_max_examples!r}.")
        if bool(self.test_source) != bool(self.test_target):
            raise ConfigError("data.test_source and data.test_target must be given together.")

    def check_files(self) -> None:
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
        check_data_files(files)

    def check_line_counts(self) -> dict[str, int]:
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
        keras_transformer.errors.ConfigError: data.train_source (.../a.en) has 2 lines but data.train_target ...
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
        return count_split_lines(splits)

    def describe_line_counts(self, counts: typing.Mapping[str, int]) -> list[str]:
        """`check_line_counts`'s counts in words, as `train --dry-run` prints them: each training corpus with its
        weight (when several mix) and the cap that reads only its first lines (`max_pairs`, `max_train_pairs`).

        Example:

        >>> section = DataSection.from_dict({"corpora": [
        ...     {"name": "a", "source": "a.en", "target": "a.de"},
        ...     {"name": "b", "source": "b.en", "target": "b.de", "weight": 3, "max_pairs": 100}]})
        >>> print("\\n".join(section.describe_line_counts({"corpus a": 600, "corpus b": 401, "valid": 50})))
        corpus a 600 lines (weight 1)
        corpus b 401 lines (weight 3, the first 100 read: max_pairs)
        valid 50 lines
        >>> DataSection.from_dict({"train_source": "a.en", "train_target": "a.de", "max_train_pairs": 3000}
        ...                       ).describe_line_counts({"train": 29000})
        ['train 29000 lines (the first 3000 read: max_train_pairs)']
        """
        config = self.data_config()
        several = config.corpora is not None and len(config.corpora) > 1
        caps = {("train" if config.corpora is None else f"corpus {corpus['name']}"): corpus
                for corpus in config.training_corpora()}
        words = []
        for split, lines in counts.items():
            corpus = caps.get(split)
            notes = []
            if corpus is not None and several:
                notes.append(f"weight {corpus['weight']:g}")
            if corpus is not None and corpus["max_pairs"] is not None and corpus["max_pairs"] < lines:
                key = "max_pairs" if config.corpora is not None else "max_train_pairs"
                notes.append(f"the first {corpus['max_pairs']} read: {key}")
            words.append(f"{split} {lines} lines" + (f" ({', '.join(notes)})" if notes else ""))
        return words

    def resolved(self, seed: typing.Optional[int], workdir: typing.Any = None) -> dict[str, typing.Any]:
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
