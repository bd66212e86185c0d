"""The Hugging Face Hub: a repository's files downloaded (or found in its cache), and ``hf://`` names.

A Hub id is ``owner/name``, optionally ``owner/name@revision`` (a branch, tag or commit). `download` fetches
the files an import reads with `huggingface_hub` (the ``hub`` extra): the configs, the tokenizer's files and the
weights, ``*.safetensors`` where the repository has them and ``*.bin`` where that is all it has, each shard of a
sharded checkpoint included. The token is the one huggingface_hub finds itself (``HF_TOKEN``, or ``hf auth
login``'s); ``HF_HUB_OFFLINE=1`` reads the Hub's cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``) and never the
network. Both variables are read when a download starts, not when the package is imported.

An ``hf://owner/name`` model name (`load_translator`, ``translate --model``, ``serve --model``) is imported once
into ``KERAS_TRANSFORMER_HOME`` (default: ``~/.cache/keras_transformer``, under ``XDG_CACHE_HOME`` where set);
`cached_model` says where, `imports.cache.hf_model` imports it there.
"""

from __future__ import annotations

import os
import pathlib
import re

from keras_transformer.errors import CheckpointNotFoundError, ConfigError

HF_PREFIX = "hf://"
# what an import reads besides the weights: configs, tokenizer files (SentencePiece, vocabularies), the model card
_FILES = ["*.json", "*.spm", "*.model", "*.txt", "README.md"]
# one Hub id: owner/name (letters, digits, '-', '_', '.'), then an optional @revision
_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(@(?P<revision>[A-Za-z0-9._/-]+))?")
_TRUE = {"1", "true", "yes", "on"}


def is_hf_name(model: object) -> bool:
    """Whether `model` is an ``hf://`` model name (a string or path starting with it).

    Example:

    >>> is_hf_name("hf://Helsinki-NLP/opus-mt-en-de"), is_hf_name("runs/en_de")
    (True, False)
    """
    return isinstance(model, str) and model.startswith(HF_PREFIX)


def parse_hub_id(text: str, where: str = "") -> tuple[str, str | None]:
    """`(repository, revision or None)` of a Hub id ``owner/name[@revision]`` (an ``hf://`` prefix is dropped).

    Raises:
        ConfigError: not of that form (named).

    Example:

    >>> parse_hub_id("hf://Helsinki-NLP/opus-mt-en-de@v1.0")
    ('Helsinki-NLP/opus-mt-en-de', 'v1.0')
    >>> parse_hub_id("hf://opus-mt-en-de")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: hf://opus-mt-en-de is not a Hugging Face model name: ...
    """
    name = text[len(HF_PREFIX):] if text.startswith(HF_PREFIX) else text
    match = _ID.fullmatch(name)
    if match is None or ".." in name:
        raise ConfigError(f"{where or text} is not a Hugging Face model name: hf://owner/name or "
                          "hf://owner/name@revision (for example hf://Helsinki-NLP/opus-mt-en-de).")
    return match["repo"], match["revision"]


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids the network (read now, as huggingface_hub reads it: 1, true, yes, on).

    Example:

    >>> os.environ.pop("HF_HUB_OFFLINE", None) and None; hub_offline()
    False
    """
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_cache() -> pathlib.Path:
    """The Hugging Face cache folder: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``.

    Example:

    >>> hub_cache().name
    'hub'
    """
    if os.environ.get("HF_HUB_CACHE"):
        return pathlib.Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return pathlib.Path(home).expanduser() / "hub"


def home() -> pathlib.Path:
    """The package's cache folder: ``KERAS_TRANSFORMER_HOME``, else ``keras_transformer`` in the user's cache
    folder (``XDG_CACHE_HOME``, else ``~/.cache``).

    Example:

    >>> os.environ["KERAS_TRANSFORMER_HOME"] = "/tmp/kt-home"; home()
    PosixPath('/tmp/kt-home')
    >>> del os.environ["KERAS_TRANSFORMER_HOME"]
    """
    if os.environ.get("KERAS_TRANSFORMER_HOME"):
        return pathlib.Path(os.environ["KERAS_TRANSFORMER_HOME"]).expanduser()
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "keras_transformer"


def cached_model(name: str) -> pathlib.Path:
    """The workdir an ``hf://`` name is imported into: ``<home>/hf/<owner>/<name>`` (``@revision`` appended
    where one is given), whether it exists yet or not.

    Example:

    >>> os.environ["KERAS_TRANSFORMER_HOME"] = "/tmp/kt-home"
    >>> cached_model("hf://Helsinki-NLP/opus-mt-en-de@v1")
    PosixPath('/tmp/kt-home/hf/Helsinki-NLP/opus-mt-en-de@v1')
    >>> del os.environ["KERAS_TRANSFORMER_HOME"]
    """
    repository, revision = parse_hub_id(name)
    owner, model = repository.split("/")
    return home() / "hf" / owner / (model if revision is None else f"{model}@{revision.replace('/', '--')}")


def download(repository: str, revision: str | None = None) -> pathlib.Path:
    """The local snapshot of Hub `repository` at `revision` (default: main) holding what an import reads:
    downloaded with huggingface_hub, or found in its cache offline (``HF_HUB_OFFLINE=1``).

    Raises:
        CheckpointNotFoundError: huggingface_hub missing, no such repository or revision, offline without it in
            the cache, or a network failure: one line each, naming the repository.

    Example:

    >>> download("Helsinki-NLP/opus-mt-en-de")  # doctest: +SKIP
    PosixPath('/root/.cache/huggingface/hub/models--Helsinki-NLP--opus-mt-en-de/snapshots/...')
    """
    name = repository if revision is None else f"{repository}@{revision}"
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise CheckpointNotFoundError(f"{name}: fetching from the Hugging Face Hub needs huggingface_hub: pip "
                                      "install 'keras-transformer[hub]'.") from None
    cache = hub_cache()
    offline = hub_offline()
    try:
        patterns = None  # offline: whatever the cache holds of it
        if not offline:
            try:
                files = huggingface_hub.HfApi().list_repo_files(repository, revision=revision)
            except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
                raise
            except Exception:  # noqa: BLE001 - no network: the cache's copy, where it has one
                offline = True
            else:
                weights = "*.safetensors" if any(file.endswith(".safetensors") for file in files) else "*.bin"
                patterns = [*_FILES, weights]
        folder = huggingface_hub.snapshot_download(repository, revision=revision, cache_dir=cache,
                                                   local_files_only=offline, allow_patterns=patterns)
    except errors.GatedRepoError:
        raise CheckpointNotFoundError(f"{name} is a gated repository on the Hugging Face Hub: accept its terms on "
                                      "its page and set HF_TOKEN (or run hf auth login).") from None
    except errors.RepositoryNotFoundError:
        raise CheckpointNotFoundError(f"{name}: no such model on the Hugging Face Hub (a private one needs "
                                      "HF_TOKEN).") from None
    except errors.RevisionNotFoundError:
        raise CheckpointNotFoundError(f"{name}: the Hugging Face Hub repository {repository} has no revision "
                                      f"{revision!r}.") from None
    except errors.LocalEntryNotFoundError:
        if hub_offline():
            raise CheckpointNotFoundError(f"{name} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
                                          "forbids downloading it: download it once online.") from None
        raise CheckpointNotFoundError(f"{name}: the Hugging Face Hub cannot be reached, and the model is not in "
                                      f"its cache ({cache}).") from None
    except Exception as error:  # noqa: BLE001 - connection errors, refusals, full disks: one line either way
        problem = " ".join(str(error).split())[:200]
        raise CheckpointNotFoundError(f"{name}: fetching it from the Hugging Face Hub failed ({problem}).") from None
    return pathlib.Path(str(folder))
