"""Where a model came from: the import record (`imported.json`) that an imported workdir holds, and that
fine-tuning, averaging and every export carry along.

`import_checkpoint` writes the record: the source, its family, the files' sizes and SHA-256, the licence its
card names, the checkpoint's own config. A run whose initial weights (`training.init_checkpoint`) or whose
architecture (`model.from`) come from an import copies it into its workdir with a `fine_tuned` entry added;
an export copies it beside its files and names the source, the licence and the original files' hashes in its
manifest and its model card (`provenance_summary`, `provenance_sentence`). A model without a record was trained
with this package. Standard library only.
"""

import datetime
import json
import os
import pathlib
from typing import Any

from keras_transformer.errors import CorruptFileError
from keras_transformer.files import atomic_write_text

IMPORT_RECORD = "imported.json"
PACKAGE = "keras_transformer"


def read_provenance(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The import record of a workdir or an export folder (`folder/imported.json`), or None without one.

    Raises:
        CorruptFileError: the record exists and is not a JSON object with a `source` (named).

    Example:

    >>> import tempfile
    >>> read_provenance(tempfile.mkdtemp()) is None
    True
    """
    path = pathlib.Path(folder) / IMPORT_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFileError(f"{path} cannot be read as JSON ({error}); import the checkpoint again to "
                               "rewrite it.") from error
    if not isinstance(record, dict) or not isinstance(record.get("source"), str):
        raise CorruptFileError(f"{path} is not an import record (no source); import the checkpoint again to "
                               "rewrite it.")
    return record


def checkpoint_provenance(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The import record of the run or export that wrote the weights file `path`, or None: looked for where
    this package puts weights (a workdir's `averaged.weights.h5` or `checkpoints/ckpt-XXXX.weights.h5`, an
    export's `assets.extra/model.weights.h5`), as `layout.checkpoint_vocabulary` looks for the vocabulary."""
    folder = pathlib.Path(path).resolve().parent
    for candidate in (folder, folder.parent):
        record = read_provenance(candidate)
        if record is not None:
            return record
    return None


def models_provenance(folders: list[Any]) -> dict[str, Any] | None:
    """The import record an export of these model folders (workdirs or exports; several: an ensemble) carries:
    the one record they all hold, None where one holds none or they differ (an ensemble of several origins)."""
    records = [read_provenance(folder) for folder in folders]
    first = records[0] if records else None
    return first if first is not None and all(record == first for record in records) else None


def fine_tuned_record(record: dict[str, Any], started_from: str | os.PathLike[str] | None,
                      weights: bool) -> dict[str, Any]:
    """The record a run that starts from an import writes: `record` with `fine_tuned` saying from what it
    started (`started_from`: the initial checkpoint or the `model.from` folder), whether it kept the imported
    weights (`weights`: False where only the architecture was taken), and when.

    Example:

    >>> fine_tuned_record({"source": "Helsinki-NLP/opus-mt-en-de"}, "runs/opus/checkpoints/ckpt-0000.weights.h5",
    ...                   weights=True)["fine_tuned"]["weights"]
    True
    """
    return {**record, "fine_tuned": {
        "from": None if started_from is None else os.fspath(started_from),
        "weights": bool(weights),
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}}


def run_provenance(init_checkpoint: str | os.PathLike[str] | None,
                   model_from: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The import record a training run carries: its initial weights' (`training.init_checkpoint` of an import,
    a run or an export that has one), else that of the folder `model.from` names (the architecture only), as
    `fine_tuned_record` writes it; None when neither comes from an import."""
    if init_checkpoint is not None:
        record = checkpoint_provenance(init_checkpoint)
        if record is not None:
            return fine_tuned_record(record, init_checkpoint, weights=True)
    if model_from is not None:
        folder = pathlib.Path(model_from)
        folder = folder if folder.is_dir() else folder.parent
        record = read_provenance(folder) or read_provenance(folder.parent)  # a workdir, an export's assets.extra
        if record is not None:
            return fine_tuned_record(record, model_from, weights=False)
    return None


def write_provenance(folder: str | os.PathLike[str], record: dict[str, Any]) -> pathlib.Path:
    """Writes `record` as `folder/imported.json`, atomically; returns its path."""
    return atomic_write_text(pathlib.Path(folder) / IMPORT_RECORD,
                             json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def provenance_summary(record: dict[str, Any] | None) -> dict[str, Any]:
    """What an export's manifest and metadata record of a model's origin: `{"origin": "trained"}` without a
    record; else the origin ("imported" or "fine-tuned"), the source, family, licence and the original files'
    SHA-256.

    Example:

    >>> provenance_summary(None)
    {'origin': 'trained', 'trained_with': 'keras_transformer'}
    >>> provenance_summary({"source": "x/y", "licence": "MIT", "files": {"a": {"bytes": 1, "sha256": "ab"}}})
    {'origin': 'imported', 'source': 'x/y', 'family': None, 'licence': 'MIT', 'files': {'a': 'ab'}}
    """
    if record is None:
        return {"origin": "trained", "trained_with": PACKAGE}
    tuned = record.get("fine_tuned")
    summary = {"origin": "fine-tuned" if tuned else "imported", "source": record.get("source"),
               "family": record.get("family"), "licence": record.get("licence"),
               "files": {name: entry.get("sha256") for name, entry in (record.get("files") or {}).items()
                         if isinstance(entry, dict)}}
    if tuned:
        summary["fine_tuned_with"] = PACKAGE
        summary["imported_weights"] = bool(tuned.get("weights", True))
    return summary


def provenance_sentence(record: dict[str, Any] | None) -> str:
    """One sentence of a model card on where the model came from.

    Example:

    >>> provenance_sentence(None)
    'Trained with keras_transformer.'
    >>> provenance_sentence({"source": "Helsinki-NLP/opus-mt-en-de", "licence": "cc-by-4.0"})
    'Imported from Helsinki-NLP/opus-mt-en-de (licence cc-by-4.0) with keras_transformer, its weights unchanged.'
    >>> provenance_sentence({"source": "a/b", "fine_tuned": {"weights": True}})
    'Imported from a/b (licence not stated in its model card), fine-tuned with keras_transformer.'
    """
    if record is None:
        return f"Trained with {PACKAGE}."
    licence = record.get("licence")
    where = f"{record.get('source')} (licence {licence if licence else 'not stated in its model card'})"
    tuned = record.get("fine_tuned")
    if not tuned:
        return f"Imported from {where} with {PACKAGE}, its weights unchanged."
    if not tuned.get("weights", True):
        return f"The architecture of {where}, trained from new weights with {PACKAGE}."
    return f"Imported from {where}, fine-tuned with {PACKAGE}."


def provenance_card(record: dict[str, Any] | None) -> str:
    """A model card's paragraph on the model's origin: `provenance_sentence`, and for an import the original
    files' SHA-256 (in `imported.json` beside, with the original config) and that its licence applies."""
    if record is None:
        return provenance_sentence(None)
    files = record.get("files") or {}
    hashes = "".join(f"\n- `{name}`: `{entry.get('sha256')}`" for name, entry in sorted(files.items())
                     if isinstance(entry, dict))
    return (f"{provenance_sentence(record)} The original checkpoint's licence applies to this model; "
            f"`{IMPORT_RECORD}` records the source, the licence and the original files"
            + (f", whose SHA-256 are:\n{hashes}" if hashes else "."))


__all__ = ["IMPORT_RECORD", "checkpoint_provenance", "fine_tuned_record", "models_provenance", "provenance_card",
           "provenance_sentence", "provenance_summary", "read_provenance", "run_provenance", "write_provenance"]
