"""A checkpoint in the Hugging Face layout, read: its config, generation config, weights and the folder it lies in.

Weights come from ``model.safetensors`` (read with `safetensors`) or, without
it, ``pytorch_model.bin`` (read with `torch`, which only that needs). A Hub id
is fetched with `huggingface_hub` where the network allows; a local folder is
never sent anywhere.
"""

import dataclasses
import json
import os
import pathlib

import numpy as np

from keras_transformer.errors import CheckpointNotFoundError, ConfigError, CorruptFileError

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SAFETENSORS = "model.safetensors"
PYTORCH = "pytorch_model.bin"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What `read_checkpoint` found.

    Attributes:
        folder: the local folder (a Hub id's download).
        source: what was asked for (the folder or the Hub id).
        config: ``config.json`` as a dict.
        generation: ``generation_config.json`` as a dict ({} without one).
        weights_file: the weights file read.
    """

    folder: pathlib.Path
    source: str
    config: dict
    generation: dict
    weights_file: pathlib.Path

    def file(self, name, what):
        """The path of `name` in the folder.

        Raises:
            CheckpointNotFoundError: it is missing (the file and what it is named).
        """
        path = self.folder / name
        if not path.is_file():
            raise CheckpointNotFoundError(f"{path} is missing: the {what} of a {self.config.get('model_type')} "
                                          "checkpoint (save_pretrained writes it with the tokenizer).")
        return path

    def tensors(self):
        """The weights as `{name: float32 numpy array}`.

        Raises:
            CorruptFileError: the file cannot be read (truncated, not a weights file), named.
        """
        try:
            if self.weights_file.name == SAFETENSORS:
                from safetensors.numpy import load_file
                return {name: np.asarray(value, dtype=np.float32)
                        for name, value in load_file(self.weights_file).items()}
            try:
                import torch
            except ImportError:
                raise ConfigError(f"{self.weights_file} is a PyTorch file, which needs torch to read: install torch "
                                  "(docs/install.md) or convert it to model.safetensors.") from None
            state = torch.load(self.weights_file, map_location="cpu", weights_only=True)
            return {name: value.float().numpy() for name, value in state.items()}
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - each reader raises its own types for a damaged file
            problem = " ".join(str(error).split())[:160]
            raise CorruptFileError(f"{self.weights_file} cannot be read as weights (truncated or damaged? {problem}); "
                                   "copy or download it again.") from None


def _read_json(path, required):
    if not path.is_file():
        if required:
            raise CheckpointNotFoundError(f"{path} is missing: a Hugging Face checkpoint folder holds config.json, "
                                          "the weights and the tokenizer's files (save_pretrained writes them).")
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except (OSError, ValueError) as error:
        raise CorruptFileError(f"{path} is not valid JSON ({' '.join(str(error).split())[:160]}).") from None
    if not isinstance(values, dict):
        raise CorruptFileError(f"{path} does not hold a JSON object.")
    return values


def local_folder(source):
    """`source` as a local folder: itself, or a Hub id (``owner/name``) downloaded with huggingface_hub.

    Raises:
        CheckpointNotFoundError: neither a folder nor a Hub id that could be fetched (the reason named).

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> local_folder(folder) == pathlib.Path(folder)
    True
    """
    path = pathlib.Path(os.fspath(source)).expanduser()
    if path.is_dir():
        return path
    text = os.fspath(source)
    if path.exists() or text.count("/") != 1 or text.startswith((".", "/")):
        raise CheckpointNotFoundError(f"{source} is not a folder (config.json, weights, tokenizer files) nor a "
                                      "Hub id (owner/name).")
    try:
        from huggingface_hub import snapshot_download
        return pathlib.Path(snapshot_download(text, allow_patterns=["*.json", "*.spm", "*.model", "*.safetensors",
                                                                    "README.md"]))
    except Exception as error:  # noqa: BLE001 - offline, unknown repository, refused: one line either way
        problem = " ".join(str(error).split())[:200]
        raise CheckpointNotFoundError(f"{source} is not a local folder, and fetching it from the Hugging Face Hub "
                                      f"failed ({problem}).") from None


def read_checkpoint(source):
    """Reads a Hugging Face checkpoint folder (or Hub id): its configs and which weights file to load.

    Raises:
        CheckpointNotFoundError: no folder, no config.json, or no weights file (named).
        CorruptFileError: a JSON file that cannot be read (named).

    Example:

    >>> read_checkpoint("no/such-model-here")  # doctest: +SKIP
    """
    folder = local_folder(source)
    config = _read_json(folder / CONFIG, required=True)
    generation = _read_json(folder / GENERATION_CONFIG, required=False)
    weights = next((folder / name for name in (SAFETENSORS, PYTORCH) if (folder / name).is_file()), None)
    if weights is None:
        raise CheckpointNotFoundError(f"{folder} holds no weights: expected {SAFETENSORS} or {PYTORCH} "
                                      "(sharded checkpoints are not read).")
    return Checkpoint(folder, os.fspath(source), config, generation, weights)


def licence(folder):
    """The ``license:`` of a model card's front matter (README.md), or None.

    Example:

    >>> import tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "README.md").write_text("---\\nlicense: cc-by-4.0\\n---\\n# A model\\n")
    >>> licence(folder)
    'cc-by-4.0'
    """
    card = pathlib.Path(folder) / "README.md"
    try:
        lines = card.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:]:
        if line.strip() == "---":
            break
        if line.startswith("license:"):
            return line.split(":", 1)[1].strip() or None
    return None
