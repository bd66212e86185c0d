"""An export folder's life: one writer at a time, built aside, described by a manifest, swapped in whole.

Every exporter (SavedModel: `exports.savedmodel.export_translator`; CTranslate2:
`exports.ctranslate2.export_ctranslate2`) writes through `writing_export`:

1. `export_lock(out)` holds the folder's writer lock for the export's whole life (an `flock` on `.NAME.lock`
   beside `out`: `files.exclusive_lock(out, beside=True)`), so a second export to the same folder is refused,
   naming the first. Under it, an old export that a writer killed between two renames left beside `out` is
   renamed back (`files.recover_replaced_folder`), and the staging folders killed exports left
   (`.NAME.tmp-PID-...`) are removed (`files.remove_stale_staging`).
2. The export is written into a new staging folder beside `out` and checked by its writer (it loads and
   translates a sentence).
3. `manifest.json` is written into it, atomically: the size and SHA-256 digest of every file.
4. `files.replace_folder` swaps it in: `out` holds a whole export at every instant.

`verify_export` checks every file against the manifest (`keras-transformer verify`);
`check_export_sizes` checks their sizes only, which costs a `stat` per file, and every loader does it
(`layout.check_model_folder`), so a truncated `variables/variables.data-*` is named before TensorFlow reads it.
An export written before manifests existed (the shipped ones) has none: it loads as before, and `verify`
says there is nothing to check it against.

Standard library only.
"""

import contextlib
import json
import os
import pathlib
import shutil
import typing
from collections.abc import Iterator
from typing import Any

from keras_transformer.errors import CheckpointNotFoundError, ExportDamagedError, WorkdirBusyError
from keras_transformer.files import (
    atomic_write_text,
    exclusive_lock,
    file_digest,
    recover_replaced_folder,
    remove_stale_staging,
    replace_folder,
    staging_folder,
)
from keras_transformer.workdir.provenance import provenance_summary, read_provenance

# In an export folder: {"format", "version", "algorithm", "precision", "files": {path: {size, sha256}}}.
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "keras_transformer-manifest"
MANIFEST_VERSION = 1

# `keras-transformer verify`'s exit codes (0: every file matches the manifest).
# The corrupt-file status of errors.EXIT_CODES: a file is missing, or its size or digest differs from the manifest's.
VERIFY_DAMAGED = 3
# Bad input (a missing file): an export written before manifests existed: nothing to check it against.
VERIFY_NO_MANIFEST = 2


def _listed_files(folder: str | os.PathLike[str]) -> list[str]:
    """Every regular file under `folder` but the manifest, as sorted relative POSIX paths."""
    folder = pathlib.Path(folder)
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*")
                  if path.is_file() and not path.is_symlink() and path.relative_to(folder).as_posix() != MANIFEST)


def write_manifest(folder: str | os.PathLike[str], precision: str | None = None) -> pathlib.Path:
    """Writes `folder/manifest.json`, atomically: the size and SHA-256 of every file under `folder`, and the
    `precision` of the export's weights and matrix products where one is given ("float32", "bfloat16", "int8", ...:
    `keras-transformer export --precision`; `export_precision` reads it back), and for an export that holds an
    import record (`imported.json`) its `provenance`: the source, the licence, the original files' SHA-256
    (`workdir.provenance.provenance_summary`).

    Returns:
        The manifest's path.

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "saved_model.pb").write_bytes(b"graph")
    >>> read_manifest(write_manifest(folder).parent)["saved_model.pb"]["size"]
    5
    """
    folder = pathlib.Path(folder)
    files = {name: {"size": (folder / name).stat().st_size, "sha256": file_digest(folder / name, "sha256")}
             for name in _listed_files(folder)}
    record = read_provenance(folder)  # an import's, or a model derived from one: its source and licence
    manifest = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "algorithm": "sha256",
                **({"precision": precision} if precision else {}),
                **({"provenance": provenance_summary(record)} if record is not None else {}), "files": files}
    return atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The files a folder's manifest lists, `{relative path: {"size": ..., "sha256": ...}}`, or None without one.

    Raises:
        ExportDamagedError: the manifest itself cannot be read.

    Example:

    >>> import tempfile
    >>> read_manifest(tempfile.mkdtemp()) is None
    True
    """
    path = pathlib.Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT or not all(
                isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
                for entry in files.values()):
            raise ValueError("not a manifest of this package")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ExportDamagedError(f"{path} is damaged ({error}): it cannot say which files the export holds. "
                                 "Copy the export again from a whole copy, or export it again.") from None
    return files


def export_precision(folder: str | os.PathLike[str]) -> str | None:
    """The precision an export's manifest records ("float32", "bfloat16", "int8", ...; `write_manifest`), or None
    for a folder without a manifest or one written before manifests recorded it (float32).

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_manifest(folder, precision="bfloat16")
    >>> export_precision(folder)
    'bfloat16'
    """
    path = pathlib.Path(folder) / MANIFEST
    if read_manifest(folder) is None:
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("precision")


def _damaged(folder: str | os.PathLike[str], name: str, what: str) -> ExportDamagedError:
    return ExportDamagedError(f"{pathlib.Path(folder) / name} {what}: the export is damaged (truncated or changed "
                              f"since it was written). Copy it again from a whole copy, or export it again; "
                              f"`keras-transformer verify {folder}` checks every file.")


def check_export_sizes(folder: str | os.PathLike[str]) -> None:
    """Checks that every file the manifest of `folder` lists is there with its size (a `stat` per file, no
    reading); nothing to check without a manifest. What every loader runs (`layout.check_model_folder`).

    Raises:
        ExportDamagedError: a file is missing or of another size (the first such file is named).

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "weights").write_bytes(b"12345678")
    >>> _ = write_manifest(folder)
    >>> _ = (folder / "weights").write_bytes(b"1234")
    >>> check_export_sizes(folder)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ExportDamagedError: .../weights is 4 bytes where the export's manifest records 8: ...
    """
    listed = read_manifest(folder)
    for name, entry in (listed or {}).items():
        try:
            size = (pathlib.Path(folder) / name).stat().st_size
        except FileNotFoundError:
            raise _damaged(folder, name,
                           f"is missing (the export's manifest lists it, {entry['size']} bytes)") from None
        if size != entry["size"]:
            raise _damaged(folder, name, f"is {size} bytes where the export's manifest records {entry['size']}")


class Verification(typing.NamedTuple):
    """What `verify_export` found in a whole export: how many files and bytes it checked, and the files that lie
    in the folder but not in its manifest (added after the export; not part of the model)."""

    files: int
    size: int
    unlisted: tuple


def verify_export(path: str | os.PathLike[str]) -> Verification | None:
    """Checks every file of an export against its manifest: presence, size and SHA-256 digest
    (`keras-transformer verify`).

    Args:
        path: an export folder (SavedModel or CTranslate2).

    Returns:
        A `Verification`, or None when the folder has no manifest (written before manifests existed).

    Raises:
        CheckpointNotFoundError: no such folder.
        ExportDamagedError: a file is missing, or its size or digest differs (the first such file is named).

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "saved_model.pb").write_bytes(b"graph")
    >>> _ = write_manifest(folder)
    >>> verify_export(folder)
    Verification(files=1, size=5, unlisted=())
    >>> _ = (folder / "saved_model.pb").write_bytes(b"Graph")
    >>> verify_export(folder)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ExportDamagedError: .../saved_model.pb differs from the export's manifest (its SHA-256 ...
    """
    path = pathlib.Path(path)
    recover_export(path)
    if not path.is_dir():
        raise CheckpointNotFoundError(f"Export folder not found: {path}")
    listed = read_manifest(path)
    if listed is None:
        return None
    check_export_sizes(path)
    for name, entry in listed.items():
        if file_digest(path / name, "sha256") != entry["sha256"]:
            raise _damaged(path, name, f"differs from the export's manifest (its SHA-256 is not the one recorded; "
                                       f"same size, {entry['size']} bytes)")
    unlisted = tuple(name for name in _listed_files(path) if name not in listed)
    return Verification(len(listed), sum(entry["size"] for entry in listed.values()), unlisted)


@contextlib.contextmanager
def export_lock(out: str | os.PathLike[str], command: str = "export") -> Iterator[pathlib.Path]:
    """Holds `out`'s writer lock for the `with` block (re-entrant in one process), after putting back an export
    that a killed writer left between two renames and removing the staging folders killed writers left.

    Raises:
        WorkdirBusyError: another process writes to `out`; the message names it.

    Example:

    >>> import tempfile
    >>> parent = pathlib.Path(tempfile.mkdtemp())
    >>> (parent / ".out.tmp-99999999-1a2b").mkdir()  # what a killed export left
    >>> with export_lock(parent / "out"):
    ...     sorted(p.name for p in parent.iterdir())
    ['.out.lock']
    >>> sorted(p.name for p in parent.iterdir())
    []
    """
    out = pathlib.Path(out)
    with exclusive_lock(out, command, beside=True):
        recover_replaced_folder(out)
        remove_stale_staging(out)
        yield out


@contextlib.contextmanager
def writing_export(out: str | os.PathLike[str], command: str = "export",
                   precision: str | None = None) -> Iterator[pathlib.Path]:
    """Yields a new staging folder beside `out` to write an export into; when the block ends, writes its
    manifest and swaps it in for `out` (see the module docstring). An exception in the block removes the
    staging folder and leaves `out` as it was. The whole runs under `export_lock(out)`. `precision`: what the
    manifest records of the export's weights (`write_manifest`).

    Example:

    >>> import tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "en_de"
    >>> with writing_export(out) as staging:
    ...     _ = (staging / "saved_model.pb").write_bytes(b"graph")
    >>> sorted(p.name for p in out.iterdir()), sorted(p.name for p in out.parent.iterdir())
    (['manifest.json', 'saved_model.pb'], ['en_de'])
    """
    out = pathlib.Path(out)
    with export_lock(out, command):
        staging = staging_folder(out)
        try:
            yield staging
            write_manifest(staging, precision)
            replace_folder(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def recover_export(path: str | os.PathLike[str]) -> bool:
    """For a loader: when `path` is missing because an export was killed between two renames (see
    `files.replace_folder`), renames the old export back; nothing when an export to `path` is running (it puts
    its own in place) or nothing is to be recovered.

    Returns:
        Whether an export was put back.
    """
    path = pathlib.Path(path)
    if path.exists() or not path.parent.is_dir() or not any(
            name.startswith(f".{path.name}.tmp-") and name.endswith("-old") for name in os.listdir(path.parent)):
        return False
    try:
        with exclusive_lock(path, "load", beside=True):
            return recover_replaced_folder(path) is not None
    except (WorkdirBusyError, PermissionError):
        return False


__all__ = ["MANIFEST", "VERIFY_DAMAGED", "VERIFY_NO_MANIFEST", "Verification", "check_export_sizes", "export_lock",
           "export_precision", "read_manifest", "recover_export", "verify_export", "write_manifest", "writing_export"]
