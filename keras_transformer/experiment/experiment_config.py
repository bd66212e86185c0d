"""`ExperimentConfig`, a whole experiment: its four sections, the model config they make, and the checks and
the resolved view that `train --dry-run` prints."""

import dataclasses
import pathlib
import typing

import yaml

from keras_transformer.config import (
    DECODING_FIELDS,
    PRESETS,
    TransformerConfig,
    read_yaml_file,
    recommended_warmup_steps,
    refuse_training_fields,
)
from keras_transformer.decoding.options import OLD_NAMES as OLD_DECODING_NAMES
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import CheckpointError, CheckpointNotFoundError, ConfigError, format_size
from keras_transformer.experiment.data_section import DataSection
from keras_transformer.experiment.decoding_section import DecodingSection
from keras_transformer.experiment.training_section import TrainingSection
from keras_transformer.experiment.validation import SECTIONS, is_integer, reject_unknown
from keras_transformer.trainer.footprint import (
    available_memory,
    check_training_memory,
    describe_memory,
    training_memory,
)
from keras_transformer.workdir.layout import model_file

_DEFAULT_MAX_LENGTH = next(field.default for field in dataclasses.fields(TransformerConfig)
                           if field.name == "max_length")


def _model_section(model: dict[str, typing.Any]) -> tuple[dict[str, typing.Any], typing.Any, typing.Any]:
    """The model section with its `from:` resolved: the fields of that model's `model.yaml`, then the section's
    other keys over them; with the decoding defaults that `model.yaml` holds (None without) and the folder or
    file `from:` names (None without), whose import record a run carries along (`workdir.provenance`)."""
    model = dict(model)
    if model.get("from") is None:
        model.pop("from", None)
        return model, None, None
    source = model.pop("from")
    if model.get("preset") is not None:
        raise ConfigError("model.from and model.preset both give the model's sizes: keep one.")
    path = model_file(source)
    fields = read_yaml_file(path, "TransformerConfig fields")
    decoding = fields.pop("decoding", None)
    refuse_training_fields(fields, f"model.from: {path}")
    return {**fields, **model}, decoding, pathlib.Path(source)


def _decoding_section(given: dict[str, typing.Any], inherited: typing.Any) -> DecodingSection:
    """The decoding section: the keys given, over the decoding defaults of `model.from`'s model.yaml where it
    has some (an import's, from its generation config), as `DecodeOptions.replace` applies settings: a setting
    of one strategy only chooses that strategy (`beam_size: 5` over a greedy import is a beam search)."""
    section = DecodingSection.from_dict(given)
    if not isinstance(inherited, dict) or not inherited:
        return section
    base = DecodeOptions.from_dict(inherited, where="model.from's decoding")
    names = {field.name for field in dataclasses.fields(DecodeOptions)}
    explicit = {OLD_DECODING_NAMES.get(key, key): value for key, value in given.items()
                if OLD_DECODING_NAMES.get(key, key) in names}
    return dataclasses.replace(section, options=base.replace(**explicit))


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
    # the folder (or model.yaml) `model.from` named, whose import record the run carries (not a config key)
    model_from: typing.Optional[pathlib.Path] = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # The settings that default to the model's, resolved here so that the experiment, its experiment.yaml and
        # `train --dry-run` hold the numbers the run uses: training.warmup_steps null is the model preset's warm-up
        # (config.recommended_warmup_steps), and the text data's length limit null is the model's (`check_model`
        # refuses a larger one).
        if self.training.warmup_steps is None:
            warmup = recommended_warmup_steps(self.model.get("preset"))
            object.__setattr__(self, "training", dataclasses.replace(self.training, warmup_steps=warmup))
        limit = self._model_max_length()
        if self.data.kind != "synthetic" and self.data.max_length is None and limit is not None:
            object.__setattr__(self, "data", dataclasses.replace(self.data, max_length=limit))

    @classmethod
    def from_dict(cls, values: typing.Optional[dict[str, typing.Any]], check_model: bool = True) -> "ExperimentConfig":
        """Builds and validates an experiment from nested dicts, rejecting unknown keys by name.

        With `check_model` (the default) the model section is also built into a `TransformerConfig`
        (`check_model`), so that bad sizes fail here and not after the data work; `load_experiment` turns it off
        for each file alone, whose model section may need a later file or `--set` to be complete.
        """
        values = dict(values or {})
        reject_unknown(values, SECTIONS, "")
        for name in SECTIONS:
            if values.get(name) is not None and not isinstance(values[name], dict):
                raise ConfigError(f"Section {name!r} must be a mapping, got {values[name]!r}.")
        refuse_training_fields(values.get("model") or {})
        model, inherited, model_from = _model_section(values.get("model") or {})
        moved = [name for name in DECODING_FIELDS if name in model]
        if moved:
            raise ConfigError(f"model.{moved[0]} is a decoding setting: give it in the decoding section "
                              f"(decoding.{OLD_DECODING_NAMES.get(moved[0], moved[0])}).")
        reject_unknown(model, [f.name for f in dataclasses.fields(TransformerConfig)] + ["preset"], "model.")
        if model.get("preset") is not None:  # null: no preset, as when the key is left out
            if model["preset"] not in PRESETS:
                raise ConfigError(f"model.preset must be one of {sorted(PRESETS)}, got {model['preset']!r}.")
        sections: dict[str, typing.Any] = {}
        for name, section_class in (("data", DataSection), ("training", TrainingSection),
                                    ("decoding", DecodingSection)):
            section_values = values.get(name) or {}
            if section_class is DecodingSection:
                sections[name] = _decoding_section(section_values, inherited)
                continue
            if section_class is DataSection:
                sections[name] = section_class.from_dict(section_values)
                continue
            reject_unknown(section_values, [f.name for f in dataclasses.fields(section_class)], f"{name}.")
            sections[name] = section_class(**section_values)
            sections[name].validate()
        experiment = cls(model=model, model_from=model_from, **sections)
        if check_model:
            experiment.check_model()
        return experiment

    def to_dict(self) -> dict[str, typing.Any]:
        """Nested plain dicts (YAML-friendly)."""
        return {"model": dict(self.model), "data": self.data.to_dict(),
                "training": dataclasses.asdict(self.training), "decoding": self.decoding.to_dict()}

    def model_config(self, vocabulary: typing.Union[int, dict[str, int], None] = None) -> TransformerConfig:
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

    def check_files(self) -> None:
        """Names the first missing input file: the data files (`ConfigError`), then `training.init_checkpoint`
        (`CheckpointError`).

        `train` and `keras-transformer train` (``--dry-run`` too) call it before any data work.

        Example:

        >>> ExperimentConfig.from_dict({"model": {"preset": "tiny"}, "data": {"kind": "synthetic"},
        ...                             "training": {"init_checkpoint": "/nonexistent.weights.h5"}}).check_files()
        Traceback (most recent call last):
        ...
        keras_transformer.errors.CheckpointNotFoundError: training.init_checkpoint: Checkpoint not found: ...
        """
        self.data.check_files()
        path: typing.Any = self.training.init_checkpoint
        if path is not None:
            path = pathlib.Path(path)
            if path.is_dir():
                raise CheckpointError(f"training.init_checkpoint: {path} is a directory, not a weights file.")
            if not path.is_file():
                raise CheckpointNotFoundError(f"training.init_checkpoint: Checkpoint not found: {path}")

    def check_model(self) -> None:
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

        The data's length limit is the model's: a `data.max_length` over `model.max_length` is refused (for text
        data, counted in positions as the model counts them, tokens + bos/eos; for synthetic data, its longest
        sentence and the bos/eos position).

        >>> ExperimentConfig.from_dict({"model": {"preset": "tiny", "max_length": 64},
        ...                             "data": {"train_source": "a.en", "train_target": "a.de", "max_length": 128}})
        Traceback (most recent call last):
        ...
        keras_transformer.errors.ConfigError: data.max_length=128 is more than model.max_length=64: ...
        """
        config = self.model_config(self._configured_vocabulary())
        data, limit = self.data, config.max_length
        if data.kind != "synthetic" and data.max_length is not None and data.max_length > limit:
            raise ConfigError(f"data.max_length={data.max_length} is more than model.max_length={limit}: the data "
                              f"would keep pairs the model has no positions for; leave data.max_length out (it is "
                              f"the model's) or make it at most {limit}.")
        if data.kind != "synthetic":
            data.data_config()  # the limit the model gave it, checked against the batch size (named in one line)
        if data.kind == "synthetic" and data.synthetic_max_length + 1 > limit:
            raise ConfigError(f"data.max_length={data.synthetic_max_length} makes synthetic sequences of "
                              f"{data.synthetic_max_length + 1} positions (the sentence and bos/eos), more than "
                              f"model.max_length={limit}: lower data.max_length or raise model.max_length.")

    def _model_max_length(self) -> typing.Optional[int]:
        """The model's `max_length` as its section gives it (the preset's, else TransformerConfig's default);
        None when the section gives no positive integer (`check_model` names that)."""
        value: typing.Any = self.model.get("max_length")
        if value is None:
            preset = self.model.get("preset")
            fields = PRESETS.get(preset, {}) if isinstance(preset, str) else {}
            value = fields.get("max_length", _DEFAULT_MAX_LENGTH)
        return value if is_integer(value) and value > 0 else None

    def training_memory(self) -> dict[str, typing.Any]:
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

    def check_memory(self) -> dict[str, typing.Any]:
        """Refuses (`ConfigError`) a model whose training needs more memory than this machine has available
        (`footprint.check_training_memory`), naming the estimate and the memory; returns the estimate.

        `train` and `train --dry-run` call it before anything is written.
        """
        memory = self.training_memory()
        check_training_memory(memory)
        return memory

    def _configured_vocabulary(self) -> typing.Optional[int]:
        """The vocabulary `model_config` takes before the data's is learned: synthetic data's own, else the
        model section's sizes (None when it gives vocab_size), else `data.vocab_size`."""
        if self.data.kind == "synthetic":  # the vocabulary is the configured one
            return self.data.synthetic_vocab_size
        if self.model.get("vocab_size") is not None:
            return None
        given = [size for size in (self.model.get("source_vocab_size"), self.model.get("target_vocab_size"))
                 if is_integer(size) and size > 0]
        return max(given) if given else self.data.data_config().vocab_size

    def resolved(self, workdir: typing.Any = None) -> dict[str, typing.Any]:
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

    def dry_run(self, workdir: typing.Any = None) -> str:
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
            notes.append("data files: " + ", ".join(self.data.describe_line_counts(counts))
                         + ", in each file of the split")
        return "".join(f"# {note}\n" for note in notes) + yaml.safe_dump(self.resolved(workdir), sort_keys=False)


def _available() -> str:
    available = available_memory()
    return "an unknown amount of memory" if available is None else format_size(available)
