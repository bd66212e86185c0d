"""The on-disk layout of a training run and of an export, and the one way to load models from them.

A training workdir (`keras-transformer train`, `pack`):

```
workdir/
  experiment.yaml, model.yaml     the resolved experiment and its TransformerConfig
  data/vocab/                     the tokenizers (SentencePiece files; `source/` and `target/` when separate)
  checkpoints/ckpt-0001.weights.h5 ...   one per epoch (weights only); step-XXXXXXXX.weights.h5, best.weights.h5
  checkpoints/.readers.lock       held shared by readers, so that rotation spares what they read (`workdir.rotation`)
  averaged.weights.h5             `keras-transformer average`, and the packed trainer's average of its last epochs
  backup/                         the resumable training state (`trainer.backup`)
```

An export (`keras-transformer export`) keeps the same three things under
`assets.extra/`: `model.yaml`, `model.weights.h5` and `vocab/`; an ensemble
keeps one `members/<i>/` folder of `model.yaml` and `model.weights.h5` per
member. Every loader of the package (translate, evaluate, export,
plot-attention, distillation, the packed path's evaluation) goes through
`load_models` here, and every unreadable file raises `CheckpointError`.

Keras and numpy only: a machine without TensorFlow loads the same folders.
"""

import contextlib
import dataclasses
import logging
import os
import pathlib
import typing
from collections.abc import Iterable, Sequence
from typing import Any

import h5py  # type: ignore[import-untyped]
import keras
import numpy as np
import yaml

from keras_transformer.config import DECODING_FIELDS, TransformerConfig, read_yaml_file
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from keras_transformer.exports.folder import export_precision
from keras_transformer.files import atomic_write, atomic_write_text, check_not_an_input, exclusive_lock
from keras_transformer.model import build_model
from keras_transformer.runtime.keras_internals import load_weights_from, write_weights_to
from keras_transformer.workdir import adapters
from keras_transformer.workdir.layout import (
    CHECKPOINT_PATTERN,
    CHECKPOINTS_DIR,
    EXTRA_DIR,
    MEMBERS_DIR,
    MODEL_CONFIG,
    MODEL_WEIGHTS,
    VOCAB_DIR,
    WORKDIR_VOCAB,
    check_average_output,
    check_models,
    is_export,
    model_kind,
    not_a_model,
    same_vocabulary,
)
from keras_transformer.workdir.provenance import IMPORT_RECORD, read_provenance, write_provenance
from keras_transformer.workdir.rotation import pinned_checkpoints

log = logging.getLogger("keras_transformer")



# ------------------------------------------------------------------ weights files
def load_weights(model: Any, path: str | os.PathLike[str]) -> Any:
    """Loads a `.weights.h5` file into `model`, with errors that name the file.

    Args:
        model: a model from `build_model`.
        path: a checkpoint such as `workdir/checkpoints/ckpt-0008.weights.h5`.

    Returns:
        `model`.

    A LoRA checkpoint (`workdir.adapters`) loads its base, checked by its digest, with the adapters merged.

    Raises:
        CheckpointNotFoundError: the file is missing (also a `FileNotFoundError`).
        CheckpointError: the file is not a readable HDF5 weights file, or holds
            weights of another shape (another config), or is a LoRA checkpoint whose base is missing or changed.

    Example:

    >>> import tempfile
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> load_weights(model, tempfile.mkdtemp() + "/missing.weights.h5")
    Traceback (most recent call last):
    ...
    keras_transformer.errors.CheckpointNotFoundError: Checkpoint not found: .../missing.weights.h5
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"Checkpoint not found: {path}")
    if adapters.is_adapter_file(path):  # a LoRA run's: its base, with the adapters merged into the kernels
        return adapters.load_merged(model, path, load_weights)
    try:
        load_weights_from(model, path)
    except OSError as error:
        raise CheckpointError(f"Checkpoint {path} is corrupt or truncated and cannot be read ({error}).") from error
    except ValueError as error:
        raise CheckpointError(f"Checkpoint {path} does not match this model "
                              f"(was it written with another config?): {error}") from error
    return model


def weights_only(model: Any) -> Any:
    """The same layers as an uncompiled model: its `save_weights` leaves out the optimizer's state.

    A compiled model's `.weights.h5` also holds Adam's two moments (three times
    the size); checkpoints for evaluation, averaging and export need only the
    weights. The training backup keeps the optimizer, so a resumed run goes on
    with its moments and its update count.

    Example:

    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> weights_only(model) is weights_only(model), len(weights_only(model).weights) == len(model.weights)
    (True, True)
    """
    view = getattr(model, "_keras_transformer_weights_view", None)
    if view is None:
        view = keras.Model(model.inputs, model.outputs, name=model.name)
        model._keras_transformer_weights_view = view
    return view


def save_weights(model: Any, path: str | os.PathLike[str]) -> pathlib.Path:
    """Writes the model's weights (no optimizer state) under a temporary name and renames it, so a kill never
    leaves a half-written checkpoint. A model with LoRA adapters writes only them and the name of its base.

    Example:

    >>> import tempfile
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> save_weights(model, pathlib.Path(tempfile.mkdtemp()) / "ckpt-0001.weights.h5").is_file()
    True
    """
    if adapters.has_adapters(model):  # a LoRA run: the adapters, naming their base (`workdir.adapters`)
        return adapters.save_adapters(model, path)
    return atomic_write(path, lambda temporary: write_weights_file(weights_only(model), temporary))


def write_weights_file(model: Any, path: str | os.PathLike[str]) -> None:
    """Writes `model.save_weights`' file to `path` (weights, and a compiled model's optimizer state) through a
    Python file object (`keras_internals.write_weights_to`), with no copy of the weights in memory: a full disk
    raises an `OSError` (ENOSPC) here, with nothing left open, instead of failing inside HDF5. Every weights file
    the package writes goes through here (under a temporary name: `files.atomic_write`).

    Example:

    >>> import tempfile
    >>> from keras_transformer.model import build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=20))
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.weights.h5"
    >>> write_weights_file(model, path)
    >>> load_weights(build_model(TransformerConfig.preset("tiny", vocab_size=20)), path) is not None
    True
    """
    with open(path, "w+b") as handle:
        write_weights_to(model, handle)


def checkpoint_number(name: str | os.PathLike[str]) -> int | None:
    """The epoch or step of a checkpoint file name, or None for other names.

    Example:

    >>> checkpoint_number("ckpt-0012.weights.h5"), checkpoint_number("best.weights.h5")
    (12, None)
    """
    match = CHECKPOINT_PATTERN.match(os.path.basename(os.fspath(name)))
    return int(match.group(1)) if match else None


def epoch_checkpoints(workdir: str | os.PathLike[str]) -> list[pathlib.Path]:
    """The per-epoch checkpoints in `workdir/checkpoints`, oldest first.

    Example:

    >>> epoch_checkpoints("/nonexistent")
    []
    """
    return sorted(pathlib.Path(workdir, CHECKPOINTS_DIR).glob("ckpt-[0-9][0-9][0-9][0-9].weights.h5"))


def latest_checkpoints(directory: str | os.PathLike[str], n: int = 5) -> list[str]:
    """The last `n` checkpoints in `directory`, oldest first.

    Checkpoints are files named `ckpt-{epoch}.weights.h5` (e.g.
    `ckpt-0012.weights.h5`, one per epoch) or `step-{step}.weights.h5` (every
    N steps); "last" means the highest numbers. The two kinds are not mixed:
    if epoch checkpoints exist they are used, else the step ones.

    Args:
        directory: the checkpoint folder (`{workdir}/checkpoints`).
        n: how many (paper: 5 for base, 20 for big); fewer are returned if
            fewer exist, with a warning (logged) that names how many.

    Returns:
        List of paths (`str`).

    Raises:
        CheckpointNotFoundError: no such folder, or no checkpoint in it.

    Example:

    >>> latest_checkpoints("workdir/checkpoints", n=2)  # doctest: +SKIP
    ['workdir/checkpoints/ckpt-0009.weights.h5', 'workdir/checkpoints/ckpt-0010.weights.h5']
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointNotFoundError(f"Checkpoint directory not found: {directory}")
    if n < 1:
        raise ValueError(f"latest_checkpoints: n must be >= 1, got {n}.")
    names = [name for name in os.listdir(directory) if checkpoint_number(name) is not None]
    epochs = [name for name in names if name.startswith("ckpt-")]
    names = epochs or names
    if not names:
        raise CheckpointNotFoundError(f"No checkpoints named ckpt-NNNN.weights.h5 or step-NNNN.weights.h5 in "
                                      f"{directory}")
    names.sort(key=lambda name: checkpoint_number(name) or 0)  # every name has a number
    if len(names) < n and (directory, n, len(names)) not in _SHORT_WARNED:  # once a process, though a command
        _SHORT_WARNED.add((directory, n, len(names)))                     # may look twice (check, then load)
        log.warning("Asked for the last %d checkpoints, but %s has only %s.", n, directory,
                    "one: using it" if len(names) == 1 else f"{len(names)}: using those {len(names)}")
    return [os.path.join(directory, name) for name in names[-n:]]


# (folder, asked, found) of `latest_checkpoints` warnings already given
_SHORT_WARNED: set[tuple[str, int, int]] = set()


def average_checkpoints(paths: Iterable[str | os.PathLike[str]], model: Any) -> Any:
    """Loads the element-wise mean of several checkpoints' weights into `model`.

    Each checkpoint is loaded into `model` in turn and its weights are summed
    in float64; the mean is then assigned (in each weight's own dtype).
    Integer-valued variables, if any, keep the last checkpoint's value.

    Args:
        paths: list of `.weights.h5` files of the same architecture as `model`.
        model: the model to fill (its current weights are overwritten).

    Returns:
        `model`, holding the averaged weights.

    Example:

    >>> average_checkpoints(latest_checkpoints("workdir/checkpoints", 5), model)  # doctest: +SKIP
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints: no checkpoint paths given.")
    totals: list[np.ndarray] | None = None
    for path in paths:
        load_weights(model, path)
        values = [np.asarray(v) for v in model.get_weights()]
        if totals is None:
            totals = [v.astype("float64") for v in values]
        else:
            totals = [t + v for t, v in zip(totals, values)]
    assert totals is not None  # paths is not empty
    last = model.get_weights()
    averaged = [(t / len(paths)).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v
                for t, v in zip(totals, last)]
    model.set_weights(averaged)
    return model


def average_workdir(workdir: str | os.PathLike[str], last: int | None = None,
                    output: str | os.PathLike[str] | None = None,
                    checkpoints: Sequence[str | os.PathLike[str]] | None = None) -> tuple[pathlib.Path, list[str]]:
    """Averages a workdir's last `last` checkpoints, or the given files, into one weights file.

    What `keras-transformer average` runs, and the packed trainer at the end of training: the output is
    checked first (`layout.check_average_output`: a training workdir, a `.weights.h5` name, not inside
    `checkpoints/`, and not one of the averaged files), then, under the workdir's writer lock
    (`files.exclusive_lock`, re-entrant: a caller that holds it may call this), the model is built from
    `model.yaml`, the checkpoints averaged (`average_checkpoints`) and the file written atomically.

    Args:
        workdir: a training workdir (`model.yaml`, `checkpoints/`).
        last: how many of the latest checkpoints (`latest_checkpoints`; the paper: 5 for base, 20 for big);
            default 5.
        output: the `.weights.h5` file to write; default `workdir/averaged.weights.h5`.
        checkpoints: instead of the last ones, these `.weights.h5` files of the
            workdir's architecture (from any folder), e.g. a run's
            average and that of its continuation in another workdir.

    Returns:
        `(output, paths)`: the written file (a `pathlib.Path`) and the averaged checkpoints.

    Raises:
        ConfigError: both `last` and `checkpoints`, or an output that cannot be right (named).
        CheckpointNotFoundError: not a training workdir, or no checkpoint to average.
        CheckpointError: an unreadable checkpoint (named).
        WorkdirBusyError: another process writes to the workdir.

    Example:

    >>> average_workdir("runs/en_de", last=5)  # doctest: +SKIP
    (PosixPath('runs/en_de/averaged.weights.h5'), [... 5 paths ...])
    """
    workdir = pathlib.Path(workdir)
    if checkpoints and last is not None:
        raise ConfigError("average: give --last N (the workdir's last checkpoints) or --checkpoint files, not both.")
    output = check_average_output(workdir, output)
    with exclusive_lock(workdir, "average"), pinned_checkpoints(workdir):  # one writer per workdir
        model = build_model(TransformerConfig.from_yaml(workdir / MODEL_CONFIG))
        paths = ([os.fspath(path) for path in checkpoints] if checkpoints
                 else latest_checkpoints(workdir / CHECKPOINTS_DIR, int(5 if last is None else last)))
        check_not_an_input(output, paths)
        average_checkpoints(paths, model)
        save_weights(model, output)
        _carry_provenance(workdir, output)
    return output, paths


def _carry_provenance(workdir: pathlib.Path, output: pathlib.Path) -> None:
    """An average written outside its workdir takes the workdir's import record beside it (`imported.json`, where
    `provenance.checkpoint_provenance` finds it), unless that folder holds another one (then a warning)."""
    record = read_provenance(workdir)
    folder = output.resolve().parent
    if record is None or folder == workdir.resolve():
        return
    there = read_provenance(folder)
    if there is None:
        write_provenance(folder, record)
    elif there != record:
        log.warning("%s holds the import record of another model (%s): %s's (%s) is not written beside %s.",
                    folder / IMPORT_RECORD, there.get("source"), workdir, record.get("source"), output.name)


def load_weights_files(model: Any, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Any:
    """Loads one weights file, or the average of several, into `model`; returns `model`."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return load_weights(model, paths[0]) if len(paths) == 1 else average_checkpoints(paths, model)


# ------------------------------------------------------------------ model files
def read_model_file(path: str | os.PathLike[str]) -> tuple[TransformerConfig, DecodeOptions]:
    """A model folder's `model.yaml`: `(TransformerConfig, DecodeOptions)`.

    The file holds the architecture's fields and a `decoding:` mapping (the model's decoding defaults).

    Raises:
        CheckpointNotFoundError: no such file.
        ConfigError / ValueError: a field that is not valid (named); decoding settings among the architecture's
            fields (`config.DECODING_FIELDS`: the layout before the `decoding:` mapping, which no release wrote).

    Example:

    >>> config, options = read_model_file("saved_models/multi30k_en_de/assets.extra/model.yaml")  # doctest: +SKIP
    >>> options.describe()                                                                        # doctest: +SKIP
    'beam: beam_size 4, alpha 1.0, max_extra 50'
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"Model config not found: {path}")
    values = read_yaml_file(path, "TransformerConfig fields")
    decoding = values.get("decoding") or {}
    if not isinstance(decoding, dict):
        raise ConfigError(f"{path}: decoding must be a mapping of decoding settings, got {decoding!r}.")
    old = [name for name in DECODING_FIELDS if name in values]
    if old:
        raise ConfigError(f"{path}: {', '.join(old)} among the architecture's fields is the layout of model files "
                          "before the decoding: mapping, which this version does not read; move them under "
                          "decoding: (length_penalty as alpha, max_decode_extra as max_extra).")
    return TransformerConfig.from_yaml(path), DecodeOptions.from_dict(decoding, where=f"{path}: decoding")


def write_model_file(path: str | os.PathLike[str], config: TransformerConfig,
                     options: DecodeOptions | None = None) -> None:
    """Writes a model folder's `model.yaml`: `config`'s fields, then `options` (default: `DecodeOptions()`) as
    its `decoding:` mapping; atomically. `read_model_file` reads it back.

    Example:

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "model.yaml")
    >>> write_model_file(path, TransformerConfig.preset("tiny", vocab_size=100), DecodeOptions(beam_size=5))
    >>> read_model_file(path)[1].beam_size
    5
    """
    values = {**config.to_dict(), "decoding": (options or DecodeOptions()).to_dict()}
    atomic_write_text(path, yaml.safe_dump(values, sort_keys=False))


# ------------------------------------------------------------------ model folders
@dataclasses.dataclass(frozen=True)
class Member:
    """One model of a folder: its config, the weights file(s) to load (several are averaged), and the dtype policy
    to build it under (None: the global one; "bfloat16" for an export of that precision)."""

    config: TransformerConfig
    weights: tuple
    dtype: typing.Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """What a workdir or export holds: `kind` ("workdir" or "export"), its members, its vocabulary folder
    (None for a run on synthetic data) and its decoding defaults (`decoding`, from its model.yaml)."""

    path: pathlib.Path
    kind: str
    members: tuple
    vocab_dir: typing.Optional[pathlib.Path] = None
    decoding: DecodeOptions = DecodeOptions()


class LoadedModels(typing.NamedTuple):
    """What `load_models` returns: the built models, their configs, the shared vocabulary folder (None for a
    run on synthetic data) and the first folder's decoding defaults."""

    models: list
    configs: list
    vocab_dir: typing.Optional[pathlib.Path]
    decoding: DecodeOptions


def model_folder(path: str | os.PathLike[str], checkpoint: str | os.PathLike[str] | None = None,
                 average: int | None = None, checked: bool = False) -> ModelFolder:
    """Reads what a training workdir or an export holds, without building any model.

    Args:
        path: a workdir (`model.yaml`, `checkpoints/`) or an export (`saved_model.pb`, `assets.extra/`).
        checkpoint: a `.weights.h5` file (workdirs only); default: the last epoch checkpoint.
        average: average the last `average` checkpoints instead (workdirs only).
        checked: the caller ran `layout.check_models` on these arguments already (`load_models` does).

    Returns:
        A `ModelFolder`.

    Raises:
        ConfigError: `checkpoint` and `average` together, or either for an export.
        CheckpointNotFoundError: a missing folder, config, checkpoint or weights file.

    Example:

    >>> folder = model_folder("saved_models/multi30k_en_de")  # doctest: +SKIP
    >>> folder.kind, len(folder.members)                       # doctest: +SKIP
    ('export', 1)
    """
    if not checked:
        check_models(path, checkpoint, average)
    path = pathlib.Path(path)
    if is_export(path):
        extra = path / EXTRA_DIR
        members_dir = extra / MEMBERS_DIR
        if members_dir.is_dir():
            folders = [members_dir / name for name in sorted((n for n in os.listdir(members_dir) if n.isdigit()),
                                                             key=int)]
        else:
            folders = [extra]
        members, decoding = [], []
        # A bfloat16 export (its manifest says so) rebuilds in bfloat16: the Python engine decodes as its graph does.
        dtype = "bfloat16" if export_precision(path) == "bfloat16" else None
        for folder in folders:
            weights_file = folder / MODEL_WEIGHTS
            if not weights_file.is_file():
                raise CheckpointNotFoundError(f"{path} has no Keras weights ({weights_file}); export it with a config.")
            config, options = read_model_file(folder / MODEL_CONFIG)
            members.append(Member(config, (str(weights_file),), dtype))
            decoding.append(options)
        return ModelFolder(path, "export", tuple(members), extra / VOCAB_DIR, decoding[0])
    if not (path / MODEL_CONFIG).is_file():
        if model_kind(path) in ("ctranslate2", "litert"):
            what = "a CTranslate2" if model_kind(path) == "ctranslate2" else "a LiteRT"
            raise CheckpointError(f"{path} is {what} export, which holds no Keras model: this needs a training "
                                  "workdir or a SavedModel export.")
        raise not_a_model(path)
    weights: tuple[str, ...]
    if checkpoint is not None:
        weights = (os.fspath(checkpoint),)
    else:
        weights = tuple(latest_checkpoints(path / CHECKPOINTS_DIR, int(average or 1)))
    vocab = path / WORKDIR_VOCAB
    config, options = read_model_file(path / MODEL_CONFIG)
    member = Member(config, weights, weights_dtype(weights[0]))  # bfloat16 weights (an import's) stay so
    return ModelFolder(path, "workdir", (member,), vocab if vocab.exists() else None, options)


def weights_dtype(path: str | os.PathLike[str]) -> str | None:
    """"bfloat16" for a weights file whose weights are bfloat16 (`import --dtype bfloat16`), else None (float32,
    as every training run's, mixed precision included, writes them); read from its first weight's type.

    Example:

    >>> import tempfile
    >>> from keras_transformer.model import build_model
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.weights.h5"
    >>> save_weights(build_model(TransformerConfig.preset("tiny", vocab_size=20), dtype="bfloat16"), path) and None
    >>> weights_dtype(path)
    'bfloat16'
    """
    first: list[np.dtype] = []

    def visit(_: str, item: Any) -> bool | None:
        if isinstance(item, h5py.Dataset) and item.ndim and item.dtype.kind in "fV":
            first.append(item.dtype)
            return True  # stops the walk
        return None

    try:
        with h5py.File(path, "r") as handle:
            handle.visititems(visit)
    except OSError:  # unreadable: loading it names the problem
        return None
    return "bfloat16" if first and first[0].kind == "V" and first[0].itemsize == 2 else None


def build_member(member: Member) -> Any:
    """Builds the Keras model of a `Member` and loads (or averages) its weights into it."""
    return load_weights_files(build_model(member.config, dtype=member.dtype), member.weights)


def load_models(paths: Any, checkpoint: Any = None, average: int | None = None, require_vocabulary: bool = False,
                checked: bool = False) -> LoadedModels:
    """Loads the Keras models of a workdir, an export, or several of them (an ensemble).

    Args:
        paths: a workdir or export folder, or a list of them; the members of an
            ensemble must share their vocabulary files.
        checkpoint: a `.weights.h5` file (workdirs only), or for several paths a
            list with one entry (or None) per path.
        average: average the last `average` epoch checkpoints of each workdir.
        require_vocabulary: refuse, before building any model, a run without
            one (trained on synthetic data: no text to translate).
        checked: the caller ran `layout.check_models` on these arguments already (`load_translator` does);
            otherwise this runs it, once for all paths.

    Returns:
        `LoadedModels(models, configs, vocab_dir, decoding)`: lists of built
        models and their `TransformerConfig`s, the vocabulary folder (None for
        a run on synthetic data) and the decoding defaults of the first folder.

    Raises:
        ConfigError: options that cannot apply, or members whose vocabularies differ.
        CheckpointError: a missing or unreadable folder, config or weights file (named).

    The checkpoints of each workdir are pinned while they are listed and read (`pinned_checkpoints`): a
    `train` running there meanwhile does not rotate them away.

    Example:

    >>> models, configs, vocab = load_models("saved_models/multi30k_en_de")  # doctest: +SKIP
    """
    paths = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    if not checked:
        check_models(paths, checkpoint, average)
    if len(paths) == 1:
        if isinstance(checkpoint, (list, tuple)):
            if len(checkpoint) != 1:
                raise ConfigError(f"One model takes one checkpoint, got {len(checkpoint)}.")
            checkpoint = checkpoint[0]
        checkpoints = [checkpoint]
    elif checkpoint is None:
        checkpoints = [None] * len(paths)
    elif isinstance(checkpoint, (str, os.PathLike)):
        raise ConfigError(f"An ensemble of {len(paths)} models takes one checkpoint per model (or none), "
                          f"got the single checkpoint {checkpoint}.")
    else:
        checkpoints = list(checkpoint)
        if len(checkpoints) != len(paths):
            raise ConfigError(f"An ensemble of {len(paths)} models takes one checkpoint per model (or none), "
                              f"got {len(checkpoints)}.")
    with contextlib.ExitStack() as pins:  # the checkpoints listed stay until they are read (rotation waits)
        for path in paths:
            pins.enter_context(pinned_checkpoints(path))
        return _load_folders(paths, checkpoints, average, require_vocabulary)


def _load_folders(paths: list[Any], checkpoints: list[Any], average: int | None,
                  require_vocabulary: bool) -> LoadedModels:
    folders = [model_folder(path, path_checkpoint, average, checked=True)
               for path, path_checkpoint in zip(paths, checkpoints)]
    for folder in folders[1:]:
        if not same_vocabulary(folder.vocab_dir or "", folders[0].vocab_dir or "") or \
                (folder.vocab_dir is None) != (folders[0].vocab_dir is None):
            raise ConfigError(f"{folder.path} has a different vocabulary from {folders[0].path} ({folder.vocab_dir} "
                              f"against {folders[0].vocab_dir}): ensembled models must share their vocabulary.")
    if require_vocabulary and folders[0].vocab_dir is None:
        raise ConfigError(f"{folders[0].path} has no vocabulary (data/vocab): it was trained on synthetic data, "
                          "which has no text to translate.")
    members = [member for folder in folders for member in folder.members]
    return LoadedModels([build_member(member) for member in members], [member.config for member in members],
                        folders[0].vocab_dir, folders[0].decoding)
