"""Reading an experiment: YAML files merged key by key (later files win), then `--set section.key=value`
overrides applied in order."""

import os
import pathlib
import typing

import yaml

from keras_transformer.config import load_yaml
from keras_transformer.errors import ConfigError
from keras_transformer.experiment.experiment_config import ExperimentConfig
from keras_transformer.experiment.validation import SECTIONS


def _deep_merge(base: dict[str, typing.Any], update: dict[str, typing.Any]) -> dict[str, typing.Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> tuple[list[str], typing.Any]:
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


def load_experiment(paths: typing.Union[str, os.PathLike[str], typing.Iterable[typing.Any]] = (),
                    overrides: typing.Iterable[str] = ()) -> ExperimentConfig:
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
    values: dict[str, typing.Any] = {}
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


def as_experiment(config: typing.Any) -> ExperimentConfig:
    """Accepts an `ExperimentConfig`, a dict or a YAML path and returns an `ExperimentConfig`."""
    if isinstance(config, ExperimentConfig):
        return config
    if isinstance(config, dict):
        return ExperimentConfig.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        return load_experiment([config])
    raise ConfigError(f"An experiment config is an ExperimentConfig, a dict of sections or a YAML file's path, not "
                      f"a {type(config).__name__}.")
