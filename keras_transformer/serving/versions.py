"""The models a server serves and their versions, as TensorFlow Serving keeps them.

A model is one folder (served as version 1, as before) or a base folder of numbered versions (`base/1`,
`base/2`, ...): the highest is served; a higher one that appears is loaded and warmed up beside the one serving,
then takes the new requests, while the old one finishes the requests it has (UNLOADING) and is dropped (END).
A version folder is loaded once its files have stopped changing between two looks, so a copy in progress is not
loaded half-written. Standard library only: loading and warming up are the caller's (`serving.app`).
"""

import dataclasses
import os
import pathlib
import re
import typing
from collections.abc import Callable, Iterable

from keras_transformer.errors import ConfigError
from keras_transformer.workdir import layout

# TensorFlow Serving's states of a version (`ManagerState`), in the order a version goes through them.
START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"
NAME_PATTERN = r"[A-Za-z0-9._-]+"  # a model's name in URLs


@dataclasses.dataclass
class Version:
    """One version of a model: its number, its folder (None: the model's own folder, given to `load` as None),
    its state, the engine serving it (once loaded), the error that ended it, and the requests it still owes."""

    number: int
    path: typing.Optional[str]
    state: str = START
    engine: typing.Any = None  # a `serving.batching.Engine`
    error: str = ""
    active: int = 0  # requests admitted for this version and not yet answered
    signature: tuple = ()  # the folder's files when it was loaded (a changed folder is tried again)

    def status(self) -> dict[str, typing.Any]:
        """This version as TensorFlow Serving's `model_version_status` lists it."""
        return {"version": str(self.number), "state": self.state,
                "status": {"error_code": "UNKNOWN" if self.error else "OK", "error_message": self.error}}


class ServedModel:
    """A model the server serves under `name`: `load(path)` gives its translator (path: a version's folder, or
    None for a model that is one folder), and `base` is the folder of numbered versions (None: one folder,
    version 1).

    Example:

    >>> model = ServedModel("en_de", load=lambda path: None)
    >>> [v.status()["state"] for v in model.listed()], model.current is None
    (['START'], True)
    """

    def __init__(self, name: str, load: Callable[..., typing.Any],
                 base: str | os.PathLike[str] | None = None) -> None:
        self.name, self.load, self.base = name, load, base
        self.versions: dict[int, Version] = {}
        # version number -> the folder's files at the last look
        self._seen: dict[int, tuple[tuple[str, int, int], ...]] = {}
        if base is None:
            self.versions[1] = Version(1, None)

    @property
    def current(self) -> Version | None:
        """The version new requests go to: the highest AVAILABLE one (None while none is)."""
        available = [v for v in self.versions.values() if v.state == AVAILABLE]
        return max(available, key=lambda v: v.number) if available else None

    def listed(self, number: int | None = None) -> list[Version]:
        """The versions, highest first (TensorFlow Serving's order), or the one numbered `number` (a list of one,
        or empty when there is no such version)."""
        versions = sorted(self.versions.values(), key=lambda v: -v.number)
        return [v for v in versions if number is None or v.number == number]

    def to_load(self) -> Version | None:
        """The version to load next, or None: at start, the highest numbered folder; later, a folder numbered
        higher than every version known whose files have not changed since the last look (or one that failed to
        load, once its files have changed)."""
        if self.base is None:
            version = self.versions[1]
            return version if version.state == START else None
        found = numbered_versions(self.base)
        if not found:
            return None
        number = max(found)
        files = folder_signature(found[number])
        stable = self._seen.get(number) == files or not self.versions  # at start: load what is there
        self._seen[number] = files
        known = self.versions.get(number)
        if known is not None and (not known.error or known.signature == files):
            return None  # loading or loaded already, or failed and unchanged since
        if any(v.number > number and not v.error for v in self.versions.values()):
            return None  # a higher version's folder was removed: the loaded one keeps serving
        if not stable or not files:
            return None
        version = Version(number, str(found[number]), signature=files)
        self.versions[number] = version
        return version

    def replaced(self) -> list[Version]:
        """The versions below the current one still AVAILABLE: they take no new request (UNLOADING)."""
        current = self.current
        return [v for v in self.versions.values() if current is not None and v.state == AVAILABLE
                and v.number < current.number]


def numbered_versions(base: str | os.PathLike[str]) -> dict[int, pathlib.Path]:
    """`{number: path}` of the folders of `base` named by a number that hold a model (hidden ones left out).

    Example:

    >>> import tempfile
    >>> numbered_versions(tempfile.mkdtemp())
    {}
    """
    found: dict[int, pathlib.Path] = {}
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    for entry in entries:
        if re.fullmatch(r"[0-9]+", entry.name) and entry.is_dir() and layout.model_kind(entry.path) is not None:
            found[int(entry.name)] = pathlib.Path(entry.path)
    return found


def is_version_base(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a folder of numbered model versions rather than a model itself.

    Example:

    >>> import tempfile
    >>> is_version_base(tempfile.mkdtemp())
    False
    """
    return layout.model_kind(path) is None and bool(numbered_versions(path))


def folder_signature(path: str | os.PathLike[str]) -> tuple[tuple[str, int, int], ...]:
    """Every file under `path` with its size and modification time (what changes while a copy is written)."""
    files = []
    for root, _, names in os.walk(path):
        for name in names:
            with_path = os.path.join(root, name)
            try:
                info = os.stat(with_path)
            except OSError:
                continue
            files.append((os.path.relpath(with_path, path), info.st_size, info.st_mtime_ns))
    return tuple(sorted(files))


def parse_model_argument(values: Iterable[str]) -> list[tuple[str | None, str]]:
    """The `--model` values of `serve` as `[(name or None, path)]`: `NAME=PATH` names a model (repeatable: one
    server, several models), a plain `PATH` repeated is one ensemble. Raises `ConfigError` for a mix or a name
    given twice.

    Example:

    >>> parse_model_argument(["en_de=saved_models/multi30k_en_de", "en_fr=saved_models/multi30k_en_fr"])
    [('en_de', 'saved_models/multi30k_en_de'), ('en_fr', 'saved_models/multi30k_en_fr')]
    >>> parse_model_argument(["runs/a", "runs/b"])
    [(None, 'runs/a'), (None, 'runs/b')]
    """
    parsed: list[tuple[str | None, str]] = []
    for value in values:
        name, equals, path = value.partition("=")
        named = equals and re.fullmatch(NAME_PATTERN, name) and not os.path.exists(value)
        parsed.append((name, path) if named else (None, value))
    names = [name for name, _ in parsed if name is not None]
    if names and len(names) != len(parsed):
        raise ConfigError("serve --model: give every model as NAME=PATH (several models) or none (one model, or an "
                         "ensemble of the --model folders), not a mix.")
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ConfigError(f"serve --model: the name {', '.join(twice)} is given twice.")
    return parsed
