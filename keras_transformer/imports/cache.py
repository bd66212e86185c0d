"""`hf_model`: an ``hf://owner/name`` model name as a workdir, imported once into the package's cache.

The first use downloads the checkpoint (`imports.hub.download`; offline, it finds it in the Hugging Face
cache) and imports it (`import_checkpoint`, which records the ``hf://`` name as its source) into a hidden
folder inside ``KERAS_TRANSFORMER_HOME/hf``, then renames it to `imports.hub.cached_model`'s path. Later uses
read that workdir and touch neither the Hub nor its cache. Two processes importing the same name at once each
build their own folder: the first rename wins, the other process drops its copy and uses the winner's, so the
cache never holds half an import.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil

from keras_transformer.files import staging_folder
from keras_transformer.imports.hub import cached_model
from keras_transformer.imports.importer import import_checkpoint

log = logging.getLogger("keras_transformer")


def hf_model(name: str) -> pathlib.Path:
    """The workdir of ``hf://`` model `name`, imported into the cache on its first use.

    Args:
        name: ``hf://owner/name`` or ``hf://owner/name@revision``.

    Returns:
        The cached workdir (`imports.hub.cached_model`).

    Raises:
        ConfigError: not an ``hf://`` name (named), or a checkpoint the importer refuses.
        CheckpointNotFoundError: not on the Hub, not in the cache offline, or the network failed (one line).

    Example:

    >>> hf_model("hf://Helsinki-NLP/opus-mt-en-de")  # doctest: +SKIP
    PosixPath('/root/.cache/keras_transformer/hf/Helsinki-NLP/opus-mt-en-de')
    """
    workdir = cached_model(name)
    if workdir.is_dir():
        return workdir
    staging = staging_folder(workdir)
    try:
        import_checkpoint(name, staging / "workdir")  # downloads it (imports.hub.download); records the name
        try:
            os.rename(staging / "workdir", workdir)
        except OSError:  # another process renamed its import first: its copy is as good as ours
            if not workdir.is_dir():
                raise
            log.info("%s was imported by another process meanwhile: using its copy", name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("%s is cached in %s (later uses read it there)", name, workdir)
    return workdir


__all__ = ["hf_model"]
