"""`import_checkpoint`: a published checkpoint (Hugging Face layout) into an ordinary workdir.

The workdir is what a training run leaves, so every command takes it as it
takes a run: ``model.yaml`` (the architecture and, under ``decoding:``, the
checkpoint's decoding defaults), ``data/vocab`` (the tokenizers, ids as the
checkpoint numbers them), ``checkpoints/ckpt-0000.weights.h5`` (the weights,
before any update of ours) and ``imported.json`` (where it came from: the
source, its family, its files' SHA-256, its licence where its model card names
one, the checkpoint's own config). It is built in a hidden folder beside the
destination and renamed into place only when complete: a failure writes nothing.
"""

import datetime
import hashlib
import json
import logging
import os
import pathlib
import shutil
import time

from keras_transformer.data.tokenizers import save_tokenizers
from keras_transformer.errors import ConfigError
from keras_transformer.files import atomic_write_text, fsync_folder, staging_folder
from keras_transformer.imports import family_for
from keras_transformer.imports.checkpoint import licence, read_checkpoint
from keras_transformer.imports.family import WeightSource
from keras_transformer.imports.tensorflow_weights import unmapped_zeros
from keras_transformer.model import build_model
from keras_transformer.runtime.keras_internals import initial_values
from keras_transformer.workdir.checkpoints import save_weights, write_model_file
from keras_transformer.workdir.layout import CHECKPOINTS_DIR, MODEL_CONFIG, WORKDIR_VOCAB, check_new_workdir
from keras_transformer.workdir.provenance import IMPORT_RECORD

log = logging.getLogger("keras_transformer")

FIRST_CHECKPOINT = "ckpt-0000.weights.h5"  # epoch 0: the published weights, before any update of ours


def _sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_checkpoint(source: str | os.PathLike[str], workdir: str | os.PathLike[str],
                      dtype: str = "float32") -> pathlib.Path:
    """Imports a published checkpoint as a workdir that translates, scores, exports, serves and fine-tunes.

    Args:
        source: a folder in the Hugging Face layout (``config.json``, ``model.safetensors`` or
            ``pytorch_model.bin``, the tokenizer's files), or a Hub id (``Helsinki-NLP/opus-mt-en-de``)
            fetched with huggingface_hub where the network allows.
        workdir: the folder to create (it must not exist, or be empty).
        dtype: "float32", or "bfloat16": the model built under Keras' bfloat16 policy, each tensor rounded to
            bfloat16 as it is read (a block of rows at a time: no float32 matrix beside it), and the checkpoint
            written in bfloat16 (half the size); loading the workdir builds it in bfloat16 again.

    Returns:
        The workdir, as a `pathlib.Path`.

    Raises:
        ConfigError: a family the package does not import (the supported ones named), a config the model cannot
            hold, weights whose shapes disagree with the config (the key named), a workdir that exists.
        CheckpointNotFoundError: a missing file (named). CorruptFileError: a file that cannot be read (named).

    Example:

    >>> import_checkpoint("opus-mt-en-de", "runs/en_de")  # doctest: +SKIP
    PosixPath('runs/en_de')
    """
    start = time.perf_counter()
    workdir = pathlib.Path(os.fspath(workdir))
    check_new_workdir(workdir, "import")
    checkpoint = read_checkpoint(source)
    family = family_for(checkpoint.config.get("model_type"), checkpoint.folder / "config.json")
    if dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"import: dtype must be float32 or bfloat16, got {dtype!r}.")
    tensors = WeightSource(checkpoint.tensors(), checkpoint.weights_file, dtype)
    config = family.config(checkpoint, tensors)
    options = family.decoding(checkpoint)
    source_tokenizer, target_tokenizer = family.tokenizers(checkpoint, config)
    with initial_values(unmapped_zeros):  # no random draws held beside the checkpoint's values (large weights)
        model = build_model(config, dtype=None if dtype == "float32" else dtype)
    family.assign_weights(model, tensors, config)
    unused = tensors.unused()
    if unused:
        raise ConfigError(f"{checkpoint.weights_file}: {unused[0]} (and {len(unused) - 1} more) is not a weight of "
                          f"the {family.name} model config.json describes." if len(unused) > 1 else
                          f"{checkpoint.weights_file}: {unused[0]} is not a weight of the {family.name} model "
                          "config.json describes.")
    record = {
        "source": checkpoint.source,
        "folder": os.fspath(checkpoint.folder.resolve()),
        "family": family.name,
        "description": family.description,
        "licence": licence(checkpoint.folder),
        "imported": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": {path.name: {"bytes": path.stat().st_size, "sha256": _sha256(path)}
                  for path in sorted(checkpoint.folder.iterdir()) if path.is_file()},
        "config": checkpoint.config,
        "generation_config": checkpoint.generation,
    }
    staging = staging_folder(workdir)
    try:
        (staging / CHECKPOINTS_DIR).mkdir()
        save_weights(model, staging / CHECKPOINTS_DIR / FIRST_CHECKPOINT)
        save_tokenizers(staging / WORKDIR_VOCAB, source_tokenizer, target_tokenizer)
        write_model_file(staging / MODEL_CONFIG, config, options)
        atomic_write_text(staging / IMPORT_RECORD, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        for folder in [staging, *(path for path in staging.rglob("*") if path.is_dir())]:
            fsync_folder(folder)
        if workdir.exists():
            workdir.rmdir()  # empty (checked above)
        os.replace(staging, workdir)
        fsync_folder(workdir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("Imported %s (%s, %s parameters) into %s in %.1f s", checkpoint.source, family.description,
             f"{model.count_params():,}", workdir, time.perf_counter() - start)
    return workdir


__all__ = ["FIRST_CHECKPOINT", "IMPORT_RECORD", "import_checkpoint"]
