"""A checkpoint in the Hugging Face layout, read: its config, generation config, weights and the folder it lies in.

Weights come from ``model.safetensors`` (read here, one tensor at a time) or,
without it, ``pytorch_model.bin`` (read with `torch`, which only that needs), or
from the shards a ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``
names (read shard by shard, one tensor at a time). A Hub id (``owner/name``,
``owner/name@revision``) is fetched with `huggingface_hub` where the network allows
(`imports.hub`); a local folder is never sent anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from keras_transformer.errors import CheckpointNotFoundError, ConfigError, CorruptFileError
from keras_transformer.imports.hub import download, parse_hub_id

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SAFETENSORS = "model.safetensors"
PYTORCH = "pytorch_model.bin"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint: {"weight_map": {tensor: shard file}}
PYTORCH_INDEX = "pytorch_model.bin.index.json"
WEIGHTS = (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH, PYTORCH_INDEX)  # the first one a folder holds is read


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What `read_checkpoint` found.

    Attributes:
        folder: the local folder (a Hub id's download).
        source: what was asked for (the folder or the Hub id).
        config: ``config.json`` as a dict.
        generation: ``generation_config.json`` as a dict ({} without one).
        weights_file: the weights file read (a sharded checkpoint's index).
    """

    folder: pathlib.Path
    source: str
    config: dict
    generation: dict
    weights_file: pathlib.Path

    def file(self, name: str, what: str) -> pathlib.Path:
        """The path of `name` in the folder.

        Raises:
            CheckpointNotFoundError: it is missing (the file and what it is named).
        """
        path = self.folder / name
        if not path.is_file():
            raise CheckpointNotFoundError(f"{path} is missing: the {what} of a {self.config.get('model_type')} "
                                          "checkpoint (save_pretrained writes it with the tokenizer).")
        return path

    def tensors(self) -> Mapping[str, np.ndarray]:
        """The weights as a read-only mapping `{name: float32 numpy array}` that reads each tensor from the file
        when asked for it (and its shape, `shape(name)`, without reading it), so that an import holds one tensor
        at a time beside the model, not a second copy of the checkpoint.

        Raises:
            CorruptFileError: the file cannot be read (truncated, not a weights file), named; a tensor's read
                raises it too.
        """
        if self.weights_file.name == SAFETENSORS:
            return SafetensorsFile(self.weights_file)
        if self.weights_file.name in (SAFETENSORS_INDEX, PYTORCH_INDEX):
            return ShardedTensors(self.weights_file)
        return _torch_tensors(self.weights_file)


ALIGNMENT = 64  # bytes: where a tensor read here starts (TensorFlow's CPU kernels assume it of a tensor's data)


def aligned_empty(shape: int | tuple[int, ...], dtype: DTypeLike, zeros: bool = False) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of `ALIGNMENT` bytes: TensorFlow can
    take it as a tensor's memory without a copy (`imports.tensorflow_weights`). With `zeros`, filled with zeros
    (`calloc`: a large one is memory the operating system maps in only where it is written to).

    Example:

    >>> array = aligned_empty((3, 5), np.float32)
    >>> array.shape, array.ctypes.data % ALIGNMENT, array.flags.c_contiguous
    ((3, 5), 0, True)
    """
    dtype = np.dtype(dtype)
    size = dtype.itemsize * int(np.prod(shape))
    raw = (np.zeros if zeros else np.empty)(size + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + size].view(dtype).reshape(shape)


# safetensors' dtype names -> numpy dtypes (BF16 is read as uint16 and widened: numpy has no bfloat16)
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                       "BOOL": np.bool_}


class SafetensorsFile(Mapping):
    """A ``.safetensors`` file as a mapping `{name: float32 numpy array}`, each tensor read (with one `readinto`,
    no memory map) when asked for.

    The format: 8 bytes (little-endian) giving the length of a JSON header, the header
    (``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` plus an optional ``__metadata__``), then the
    tensors' bytes, offsets counted from the header's end. The header is checked against the file's size when
    the file is opened, so a truncated file is refused before anything is built.

    Raises:
        CorruptFileError: not a safetensors file, or truncated (named).

    Example:

    >>> import tempfile, struct
    >>> header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> _ = path.write_bytes(struct.pack("<Q", len(header)) + header + np.array([1, 2], np.float32).tobytes())
    >>> weights = SafetensorsFile(path)
    >>> list(weights), weights.shape("w"), weights["w"].tolist()
    (['w'], (2,), [1.0, 2.0])
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if not 2 <= length <= size - 8:
                    raise ValueError(f"a header of {length} bytes in a file of {size}")
                header = json.loads(handle.read(length))
            self._start = 8 + length
            header.pop("__metadata__", None)
            self._entries = {}
            for name, entry in header.items():
                begin, end = (int(offset) for offset in entry["data_offsets"])
                dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
                shape = tuple(int(n) for n in entry["shape"])
                if end - begin != dtype.itemsize * int(np.prod(shape)) or self._start + end > size:
                    raise ValueError(f"{name} ends at byte {self._start + end} of {size}")
                self._entries[name] = (entry["dtype"], dtype, shape, begin)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise _unreadable(self.path, error) from None

    def __getitem__(self, name: str) -> np.ndarray:
        shape = self._entries[name][2]
        return self._read(name, 0, shape[0] if shape else 1, shape)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows `start:stop` of tensor `name` (of two or more dimensions), read alone, as float32."""
        shape = self._entries[name][2]
        stop = min(stop, shape[0])
        return self._read(name, start, stop - start, (stop - start, *shape[1:]))

    def _read(self, name: str, start: int, count: int, shape: tuple[int, ...]) -> np.ndarray:
        """`count` rows of tensor `name` from row `start`, read with one `readinto`, as float32 of `shape`."""
        kind, dtype, full, begin = self._entries[name]
        row = dtype.itemsize * int(np.prod(full[1:]))  # bytes a row (the whole tensor for a scalar)
        buffer = aligned_empty(row * count, np.uint8)
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._start + begin + row * start)
                if handle.readinto(buffer) != buffer.size:  # type: ignore[arg-type]  # numpy: a buffer from 3.12
                    raise ValueError(f"{name} is cut short")
        except (OSError, ValueError) as error:
            raise _unreadable(self.path, error) from None
        value = buffer.view(dtype).reshape(shape)
        if kind == "BF16":  # the upper half of a float32
            return (value.astype(np.uint32) << 16).view(np.float32)
        return value.astype(np.float32, copy=False)

    def __contains__(self, name: object) -> bool:  # from the header: `Mapping`'s would read the tensor
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name`, read from the header."""
        return self._entries[name][2]


def _unreadable(path: str | os.PathLike[str], error: Exception) -> CorruptFileError:
    problem = " ".join(str(error).split())[:160]
    return CorruptFileError(f"{path} cannot be read as weights (truncated or damaged? {problem}); copy or download "
                            "it again.")


def _torch_tensors(path: pathlib.Path) -> _TorchTensors:
    try:
        import torch
    except ImportError:
        raise ConfigError(f"{path} is a PyTorch file, which needs torch to read: install torch (docs/install.md) or "
                          "convert it to model.safetensors.") from None
    try:
        try:  # memory-mapped: tensors are read when asked for (torch's zip format, the one save_pretrained writes)
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy format, which cannot be mapped: read whole
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises its own types for a damaged file
        raise _unreadable(path, error) from None
    return _TorchTensors(state)


def _shard(path: pathlib.Path) -> Mapping[str, Any]:
    """One shard's tensors: a `SafetensorsFile`, or a memory-mapped PyTorch state dict."""
    return SafetensorsFile(path) if path.name.endswith(".safetensors") else _torch_tensors(path)


class ShardedTensors(Mapping):
    """A sharded checkpoint (``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``) as one mapping
    `{name: float32 numpy array}`: each tensor is read from its shard when asked for, and at most one shard is
    open at a time (safetensors shards keep only their headers; a PyTorch shard is memory-mapped), so an import
    never holds the checkpoint in memory.

    The index's ``weight_map`` names each tensor's shard (a file beside the index). Every shard is checked when the
    index is opened: a missing shard, or a tensor that its shard does not hold, is refused (named) before anything
    is built.

    Raises:
        CheckpointNotFoundError: a shard the index names is missing (named).
        CorruptFileError: the index cannot be read, a shard cannot be read, or a tensor is not in its shard (named).

    Example:

    >>> import tempfile, struct
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for shard, name in (("a.safetensors", "w"), ("b.safetensors", "v")):
    ...     header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    ...     _ = (folder / shard).write_bytes(struct.pack("<Q", len(header)) + header + np.ones(1, np.float32).tobytes())
    >>> index = folder / SAFETENSORS_INDEX
    >>> _ = index.write_text(json.dumps({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}}))
    >>> weights = ShardedTensors(index)
    >>> sorted(weights), weights.shape("v"), weights["w"].tolist()
    (['v', 'w'], (1,), [1.0])
    """

    def __init__(self, index: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(index)
        weight_map = _read_json(self.path, required=True).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
            raise CorruptFileError(f"{self.path} has no weight_map ({{tensor: shard file}}): not a sharded "
                                   "checkpoint's index.")
        for shard in weight_map.values():
            if pathlib.Path(shard).name != shard or shard in (".", ".."):
                raise CorruptFileError(f"{self.path} names the shard {shard!r}: a file beside it is expected.")
        self._shard_of = {name: self.path.parent / shard for name, shard in weight_map.items()}
        self._shapes: dict[str, tuple[int, ...]] = {}
        for shard in dict.fromkeys(self._shard_of.values()):  # each shard once, in the index's order
            if not shard.is_file():
                raise CheckpointNotFoundError(f"{shard} is missing: a shard that {self.path.name} names.")
            tensors = _shard(shard)
            for name in (name for name, where in self._shard_of.items() if where == shard):
                if name not in tensors:
                    raise CorruptFileError(f"{self.path}: {name} is in no shard ({self.path.name} names "
                                           f"{shard.name}, which does not hold it).")
                self._shapes[name] = tuple(tensors.shape(name))  # type: ignore[attr-defined]
            del tensors
        self._open: tuple[pathlib.Path, Mapping[str, Any]] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self._tensors(name)[name]

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows `start:stop` of tensor `name`, as float32, read alone where its shard allows."""
        return self._tensors(name).rows(name, start, stop)  # type: ignore[attr-defined]  # both kinds of shard

    def _tensors(self, name: str) -> Mapping[str, Any]:
        """The shard that holds `name`, opened (the previous one closed first)."""
        shard = self._shard_of[name]
        if self._open is None or self._open[0] != shard:
            self._open = None  # the previous shard closed before the next one opens
            self._open = (shard, _shard(shard))
        return self._open[1]

    def __contains__(self, name: object) -> bool:  # from the index: `Mapping`'s would read the tensor
        return name in self._shard_of

    def __iter__(self) -> Iterator[str]:
        return iter(self._shard_of)

    def __len__(self) -> int:
        return len(self._shard_of)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name`, from its shard's header."""
        return self._shapes[name]


class _TorchTensors(Mapping):
    """A ``pytorch_model.bin`` state dict (memory-mapped), each tensor widened to float32 when asked for."""

    path: pathlib.Path | None = None

    def __init__(self, state: Mapping[str, Any]) -> None:
        self._state = state

    def __getitem__(self, name: str) -> np.ndarray:
        return self._state[name].float().numpy()

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return self._state[name][start:stop].float().numpy()

    def __contains__(self, name: object) -> bool:
        return name in self._state

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._state[name].shape)


def _read_json(path: pathlib.Path, required: bool) -> dict[str, Any]:
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


def checked_source(source: str | os.PathLike[str]) -> pathlib.Path | None:
    """`source` as a local folder, or None for a Hub id (``owner/name``), looked at without reading anything.

    Raises:
        CheckpointNotFoundError: neither a folder nor a Hub id (named).

    Example:

    >>> checked_source("Helsinki-NLP/opus-mt-en-de") is None
    True
    """
    path = pathlib.Path(os.fspath(source)).expanduser()
    if path.is_dir():
        return path
    text = os.fspath(source)
    try:
        if path.exists() or text.startswith((".", "/")):
            raise ConfigError(text)
        parse_hub_id(text)
    except ConfigError:
        raise CheckpointNotFoundError(f"{source} is not a folder (config.json, weights, tokenizer files) nor a "
                                      "Hub id (owner/name or owner/name@revision).") from None
    return None


def local_folder(source: str | os.PathLike[str]) -> pathlib.Path:
    """`source` as a local folder: itself, or a Hub id (``owner/name``, ``owner/name@revision``, ``hf://`` in front
    or not) downloaded with huggingface_hub (`imports.hub.download`).

    Raises:
        CheckpointNotFoundError: neither a folder nor a Hub id that could be fetched (the reason named).

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> local_folder(folder) == pathlib.Path(folder)
    True
    """
    path = checked_source(source)
    if path is not None:
        return path
    return download(*parse_hub_id(os.fspath(source)))


def read_checkpoint(source: str | os.PathLike[str]) -> Checkpoint:
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
    weights = next((folder / name for name in WEIGHTS if (folder / name).is_file()), None)
    if weights is None:
        raise CheckpointNotFoundError(f"{folder} holds no weights: expected {SAFETENSORS}, {PYTORCH} or a sharded "
                                      f"checkpoint's index ({SAFETENSORS_INDEX}, {PYTORCH_INDEX}).")
    return Checkpoint(folder, os.fspath(source), config, generation, weights)


def licence(folder: str | os.PathLike[str]) -> str | None:
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
