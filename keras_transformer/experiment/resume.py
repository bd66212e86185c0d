"""Whether a workdir's run can go on with a config: a workdir holds one model and one vocabulary, recorded in
its `experiment.yaml`."""

import pathlib
import typing

import yaml

from keras_transformer.config import refuse_training_fields
from keras_transformer.errors import ConfigError, CorruptFileError
from keras_transformer.files import atomic_write_text

# Keys that may change between runs in one workdir: they do not change the weights' meaning or the vocabulary.
# Every training key may change too (the optimizer, schedule and loss settings among them): only these two
# sections are compared.
_RESUMABLE_CHANGES = {
    "model": {"beam_size", "length_penalty", "max_decode_extra", "early_exit", "dropout", "attention_dropout",
              "ffn_dropout"},
    "data": {"batch_size", "shuffle", "tokens_per_batch", "bucket_width", "window", "cache", "seed",
             "max_length", "errors", "valid_source", "valid_target", "valid_tokenized_target", "test_source",
             "test_target", "test_tokenized_target", "tfds_valid_split", "tfds_test_split", "tfds_data_dir"},
}


def changed_experiment(path: pathlib.Path, resolved: dict[str, typing.Any],
                       sections: typing.Sequence[str] = ("model", "data")) -> list[str]:
    """The changes between the experiment a workdir's `experiment.yaml` (`path`) records and `resolved` that a
    run cannot resume across (`_RESUMABLE_CHANGES` lists the ones it can), one `section.key: old -> new` each;
    [] when there is no such file.

    Raises:
        CorruptFileError: the file is not YAML.
        ConfigError: its model section holds a training setting (named with its place in the training section).

    Example:

    >>> import pathlib, tempfile
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
    try:
        refuse_training_fields(saved.get("model") or {})
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    changed = []
    for section in sections:
        old, new = saved.get(section) or {}, resolved[section]
        for key in sorted(set(old) | set(new)):
            if key in _RESUMABLE_CHANGES[section]:
                continue
            if old.get(key) != new.get(key):
                changed.append(f"{section}.{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changed


def check_same_experiment(path: pathlib.Path, resolved: dict[str, typing.Any]) -> None:
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


def _first_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200]


def write_yaml(path: str | pathlib.Path, values: typing.Any) -> None:
    """Writes `values` as YAML to `path` atomically, keys in their order."""
    atomic_write_text(path, yaml.safe_dump(values, sort_keys=False))
