"""LoRA checkpoints: the adapters of a run with `training.lora`, and the base weights file they adapt, named by
its path and its SHA-256.

A LoRA run's `checkpoints/ckpt-0001.weights.h5` (and step, best checkpoints) is an HDF5 file of its own layout:

```
attrs: format = "keras_transformer.lora", base = the base weights file (absolute path), base_sha256
adapters/<kernel path>/lora_kernel_a, lora_kernel_b   with attrs rank and alpha
```

Loading one into a plain model (`checkpoints.load_weights`, and so translate, export, average) loads the base, after
checking its digest, and merges each adapter into its kernel: W + (alpha / r) A B. The training backup is a plain
Keras weights file (base and adapters apart, and the optimizer's state: `layers.lora.AdaptedDense`).
"""

import os
import pathlib
from collections.abc import Callable
from typing import Any

import h5py  # type: ignore[import-untyped]
import numpy as np

from keras_transformer.errors import CheckpointError
from keras_transformer.files import atomic_write, file_digest
from keras_transformer.layers.lora import adapted_layers, base_kernel, merged_kernel

FORMAT = "keras_transformer.lora"
BASE_ATTRIBUTE = "_keras_transformer_lora_base"  # (path, sha256) of the base, on the training model


def set_base(model: Any, base: str | os.PathLike[str]) -> str:
    """Records on the adapted `model` the base weights file its checkpoints name; returns its SHA-256."""
    path = pathlib.Path(base).resolve()
    digest = file_digest(path, "sha256")
    setattr(model, BASE_ATTRIBUTE, (str(path), digest))
    return digest


def base_of(model: Any) -> tuple[str, str]:
    """`(path, sha256)` of the base weights file `set_base` recorded on `model`."""
    return getattr(model, BASE_ATTRIBUTE)


def has_adapters(model: Any) -> bool:
    """Whether `model` carries LoRA adapters (its checkpoints are then adapter files)."""
    return getattr(model, BASE_ATTRIBUTE, None) is not None and bool(adapted_layers(model))


def is_adapter_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a LoRA checkpoint (not a plain Keras weights file).

    Example:

    >>> import tempfile
    >>> is_adapter_file(tempfile.mkdtemp() + "/missing.weights.h5")
    False
    """
    try:
        with h5py.File(path, "r") as handle:
            return handle.attrs.get("format") == FORMAT
    except OSError:
        return False


def save_adapters(model: Any, path: str | os.PathLike[str]) -> pathlib.Path:
    """Writes the adapters of `model` and the name and digest of its base to `path` (atomically)."""
    base, digest = base_of(model)

    def write(temporary: str) -> None:
        with h5py.File(temporary, "w") as handle:
            handle.attrs["format"] = FORMAT
            handle.attrs["base"] = base
            handle.attrs["base_sha256"] = digest
            group = handle.create_group("adapters")
            for layer in adapted_layers(model):
                entry = group.create_group(base_kernel(layer).path)
                entry.attrs["rank"] = int(layer.lora_rank)
                entry.attrs["alpha"] = float(layer.lora_alpha)
                entry.create_dataset("lora_kernel_a", data=np.asarray(layer.lora_kernel_a.numpy()))
                entry.create_dataset("lora_kernel_b", data=np.asarray(layer.lora_kernel_b.numpy()))

    return atomic_write(path, write)


def adapter_base(path: str | os.PathLike[str]) -> tuple[pathlib.Path, str]:
    """The base weights file a LoRA checkpoint names and the SHA-256 it recorded of it."""
    with h5py.File(path, "r") as handle:
        return pathlib.Path(str(handle.attrs["base"])), str(handle.attrs["base_sha256"])


def check_base(path: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The base of the LoRA checkpoint `path`, `base` instead if given, after checking its digest.

    Raises:
        CheckpointError: the base is missing, or is not the file the adapters were trained on (one line).
    """
    named, digest = adapter_base(path)
    base = pathlib.Path(base) if base is not None else named
    if not base.is_file():
        raise CheckpointError(f"The LoRA checkpoint {path} adapts {base}, which is missing.")
    if file_digest(base, "sha256") != digest:
        raise CheckpointError(f"The LoRA checkpoint {path} adapts {base} of SHA-256 {digest[:16]}..., but that file "
                              f"has changed: its adapters do not apply to these weights.")
    return base


def load_merged(model: Any, path: str | os.PathLike[str], load_base: Callable[[Any, pathlib.Path], Any]) -> Any:
    """Loads the base of the LoRA checkpoint `path` into the plain `model` (`load_base(model, base)`), then merges
    each adapter into its kernel. Returns `model`."""
    load_base(model, check_base(path))
    kernels = {variable.path: variable for variable in model.weights}
    with h5py.File(path, "r") as handle:
        entries: list[tuple[str, Any]] = []
        handle["adapters"].visititems(lambda name, item: entries.append((name, item))
                                      if isinstance(item, h5py.Group) and "lora_kernel_a" in item else None)
        for name, entry in entries:
            kernel = kernels.get(name)
            if kernel is None:
                raise CheckpointError(f"The LoRA checkpoint {path} adapts {name}, which this model does not have.")
            kernel.assign(merged_kernel(kernel.numpy(), entry["lora_kernel_a"][()], entry["lora_kernel_b"][()],
                                        int(entry.attrs["rank"]), float(entry.attrs["alpha"])))
    return model
