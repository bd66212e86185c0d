"""The names of the on-disk layout of runs and exports, and the checks on it that need no TensorFlow.

The command line runs these before it imports TensorFlow (seconds), so that a
wrong path or a folder that is not a model is reported at once.
`workdir.checkpoints` loads what these name. Also the vocabulary folders: where a run or an export keeps
its vocabulary, whether two are the same, and a fine-tuning run's adoption of its checkpoint's.
Standard library only.
"""

import json
import logging
import os
import pathlib
import re
import shutil
from typing import Any

from keras_transformer.errors import CheckpointNotFoundError, ConfigError
from keras_transformer.exports.folder import check_export_sizes, recover_export
from keras_transformer.files import is_inside, staging_folder

log = logging.getLogger("keras_transformer")

MODEL_CONFIG = "model.yaml"  # a workdir's TransformerConfig, and an export's in assets.extra/
CHECKPOINTS_DIR = "checkpoints"
WORKDIR_VOCAB = os.path.join("data", "vocab")
AVERAGED_WEIGHTS = "averaged.weights.h5"  # `average`'s default output in a workdir
EXTRA_DIR = "assets.extra"  # an export's Keras model: model.yaml, model.weights.h5, vocab/ (members/<i>/)
MODEL_WEIGHTS = "model.weights.h5"
MEMBERS_DIR = "members"
VOCAB_DIR = "vocab"
TOKENIZER_SETTINGS = "tokenizer.json"  # a tokenizer folder's settings (its model_type, model_file, ...)
SENTENCEPIECE_MODELS = ("bpe", "unigram")  # the model types of a SentencePiece tokenizer
CHECKPOINT_PATTERN = re.compile(r"^(?:ckpt|step)-(\d+)\.weights\.h5$")
SAVED_MODEL = "saved_model.pb"
CTRANSLATE2_METADATA = "keras_transformer.json"  # a CTranslate2 export's own metadata (engines.ctranslate2)
LITERT_METADATA = "litert.json"  # a LiteRT export's own metadata (engines.litert)
LITERT_MODEL = "model.tflite"  # a LiteRT export's model: the search's signatures (engines.litert)


def model_kind(path: str | os.PathLike[str]) -> str | None:
    """What a model folder is: "workdir", "export" (a SavedModel), "ctranslate2", "litert", or None.

    >>> import tempfile
    >>> model_kind(tempfile.mkdtemp()) is None
    True
    """
    path = pathlib.Path(path)
    if (path / SAVED_MODEL).is_file():
        return "export"
    if (path / CTRANSLATE2_METADATA).is_file() and (path / "model.bin").is_file():
        return "ctranslate2"
    if (path / LITERT_METADATA).is_file() and (path / LITERT_MODEL).is_file():
        return "litert"
    if (path / MODEL_CONFIG).is_file():
        return "workdir"
    return None


def check_model_path(path: str | os.PathLike[str]) -> None:
    """Refuses a `--model` that is missing or not one of the kinds of model folder, naming it.

    Raises:
        CheckpointNotFoundError: the folder is missing, or holds no model.
    """
    check_model_folder(path)
    if model_kind(path) is None:
        raise not_a_model(path)


def not_a_model(path: str | os.PathLike[str]) -> CheckpointNotFoundError:
    """The error for a folder that holds no model: it names the kinds and the file each would have."""
    return CheckpointNotFoundError(f"{path} is not a model folder: not a training workdir (no {MODEL_CONFIG}), a "
                                   f"SavedModel export (no {SAVED_MODEL}), a CTranslate2 export (no "
                                   f"{CTRANSLATE2_METADATA}) or a LiteRT export (no {LITERT_METADATA}).")


def is_training_workdir(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a training workdir: a `model.yaml` beside `experiment.yaml` or `checkpoints/`."""
    path = pathlib.Path(path)
    return (path / MODEL_CONFIG).is_file() and ((path / "experiment.yaml").is_file() or
                                                 (path / CHECKPOINTS_DIR).is_dir())


def check_export_destination(directory: str | os.PathLike[str]) -> None:
    """Refuses an export folder inside a training workdir (the workdir itself included).

    Written there, the export's files would make the workdir look like an
    export to every loader, which would then serve the exported weights
    instead of the run's newer checkpoints.

    Raises:
        ConfigError: `directory` is or lies in a training workdir (named).
    """
    directory = pathlib.Path(directory)
    for folder in (directory, *directory.resolve().parents):
        if is_training_workdir(folder):
            raise ConfigError(f"Not exporting to {directory}: it {'is' if folder == directory else 'lies in'} the "
                              f"training workdir {folder}, whose loaders would then read the export instead of "
                              f"its checkpoints. Export outside it (saved_models/NAME, say).")


def check_new_workdir(path: str | os.PathLike[str], command: str) -> None:
    """Refuses a folder that exists and is not empty, where `command` writes a whole workdir of its own (`import`).

    Raises:
        ConfigError: `path` is a file, or a folder that holds something (named).

    Example:

    >>> import tempfile
    >>> check_new_workdir(pathlib.Path(tempfile.mkdtemp()) / "new", "import")
    """
    path = pathlib.Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"{path} already exists and is not empty; {command} into a new folder.")


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a SavedModel export folder (it has `saved_model.pb`)."""
    return (pathlib.Path(path) / "saved_model.pb").is_file()


def check_weights_choice(model: Any, checkpoint: Any, average: int | None) -> None:
    """Refuses weights options that cannot apply: a checkpoint and an average together (for any model), or either
    for an exported model, whose weights are fixed.

    Raises:
        ConfigError: naming the option that cannot apply.
    """
    checkpoints = checkpoint if isinstance(checkpoint, (list, tuple)) else [checkpoint]
    given = any(path is not None for path in checkpoints)
    if given and average is not None:
        raise ConfigError("Give --checkpoint FILE or --average N (the last N epoch checkpoints), not both.")
    models = model if isinstance(model, (list, tuple)) else [model]
    for path in models:
        if (given or average is not None) and is_export(path):
            raise ConfigError(f"{path} is an exported model: --checkpoint and --average apply to training workdirs.")


def check_models(model: Any, checkpoint: Any, average: int | None) -> list[Any]:
    """The checks every loader runs once, before it reads anything: the weights options (`check_weights_choice`)
    and each model folder (`check_model_folder`).

    Args:
        model: a model folder, or a list of them (an ensemble).
        checkpoint, average: the weights options, as the loaders take them.

    Returns:
        The model folders, as a list.

    Raises:
        ConfigError: an empty list, or weights options that cannot apply (named).
        CheckpointNotFoundError / ExportDamagedError: as `check_model_folder`.

    Example:

    >>> check_models([], None, None)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: No model given (an empty list).
    """
    paths = list(model) if isinstance(model, (list, tuple)) else [model]
    if not paths:
        raise ConfigError("No model given (an empty list).")
    check_weights_choice(paths, checkpoint, average)
    for path in paths:
        check_model_folder(path)
    return paths


def check_model_folder(path: str | os.PathLike[str]) -> None:
    """A missing `--model` folder is named as missing (not as "neither a workdir nor an export"); an export's
    files are checked against the sizes its manifest records (`exports.folder.check_export_sizes`).

    An export that a writer killed between the two renames of a swap left beside its folder is first put back
    (`exports.folder.recover_export`).

    Raises:
        CheckpointNotFoundError: the folder is missing.
        ExportDamagedError: an export's file is missing or of another size than its manifest says (named).
    """
    recover_export(path)
    check_export_sizes(path)
    if not pathlib.Path(path).exists():
        raise CheckpointNotFoundError(f"Model folder not found: {path} (expected a training workdir, a "
                                      "SavedModel export or a CTranslate2 export).")


def check_average_output(workdir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The file `average` writes for `workdir` (default `workdir/averaged.weights.h5`), refused when it cannot be
    right: `workdir` is not a training workdir, the name does not end in `.weights.h5`, or it lies in
    `checkpoints/` (it could replace a checkpoint it averages, or pass for the latest).

    Returns:
        The output path, as a `pathlib.Path`.
    """
    workdir = pathlib.Path(workdir)
    if not (workdir / MODEL_CONFIG).is_file():
        raise CheckpointNotFoundError(f"{workdir} is not a training workdir: {workdir / MODEL_CONFIG} is missing.")
    output = pathlib.Path(output) if output is not None else workdir / AVERAGED_WEIGHTS
    if not output.name.endswith(".weights.h5"):
        raise ConfigError(f"The averaged weights file must end in .weights.h5, got {output}.")
    if is_inside(output, workdir / CHECKPOINTS_DIR):
        raise ConfigError(f"average --output {output} lies in {workdir / CHECKPOINTS_DIR}, the checkpoints it "
                          f"averages: it could replace one of them or pass for the latest. Write it elsewhere "
                          f"(default: {workdir / AVERAGED_WEIGHTS}).")
    return output


# ------------------------------------------------------------------ vocabularies
def vocabulary_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """The vocabulary folder of a training workdir or an export.

    Example:

    >>> str(vocabulary_dir("runs/en_de")), str(vocabulary_dir("saved_models/multi30k_en_de"))
    ('runs/en_de/data/vocab', 'saved_models/multi30k_en_de/assets.extra/vocab')
    """
    path = pathlib.Path(path)
    return path / EXTRA_DIR / VOCAB_DIR if (path / "saved_model.pb").is_file() else path / WORKDIR_VOCAB


def check_vocabulary(path: str | os.PathLike[str]) -> None:
    """Refuses a training workdir without a vocabulary (`data/vocab`: a run on synthetic data), which has no text
    to translate; an export carries its own.

    Raises:
        ConfigError: `path` is such a workdir (named).

    Example:

    >>> import tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run / MODEL_CONFIG).write_text("d_model: 64\\n")
    >>> check_vocabulary(run)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: ... has no vocabulary (data/vocab): it was trained on synthetic data, ...
    """
    if model_kind(path) == "workdir" and not (pathlib.Path(path) / WORKDIR_VOCAB).exists():
        raise ConfigError(f"{path} has no vocabulary ({WORKDIR_VOCAB}): it was trained on synthetic data, which has "
                          "no text to translate.")


def folder_files(folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file under `folder`, subfolders included, as `{relative path: bytes}`; `{}` without the folder.

    Separate source and target vocabularies live in `source/` and `target/`:
    comparing only a folder's top-level files would find two empty sets equal.

    Example:

    >>> import tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "source").mkdir(); _ = (root / "source" / "spm.model").write_bytes(b"x")
    >>> folder_files(root)
    {'source/spm.model': b'x'}
    """
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        return {}
    return {item.relative_to(folder).as_posix(): item.read_bytes()
            for item in sorted(folder.rglob("*")) if item.is_file()}


def same_vocabulary(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    """Whether two vocabulary folders hold the same files with the same bytes (subfolders included)."""
    return folder_files(first) == folder_files(second)


def tokenizer_folders(vocab_dir: str | os.PathLike[str]) -> list[pathlib.Path]:
    """The tokenizer folders of a vocabulary folder: `[vocab_dir]` for a shared vocabulary (its own
    `tokenizer.json`), else its `source/` and `target/` folders.

    Example:

    >>> import tempfile
    >>> [folder.name for folder in tokenizer_folders(tempfile.mkdtemp())]
    ['source', 'target']
    """
    vocab_dir = pathlib.Path(vocab_dir)
    return [vocab_dir] if (vocab_dir / TOKENIZER_SETTINGS).is_file() else [vocab_dir / "source", vocab_dir / "target"]


def is_sentencepiece_vocabulary(vocab_dir: str | os.PathLike[str]) -> bool:
    """Whether every tokenizer of a vocabulary folder is a SentencePiece model ("bpe" or "unigram" in its
    `tokenizer.json`): what the TensorFlow-free engines read.

    Example:

    >>> import tempfile
    >>> is_sentencepiece_vocabulary(tempfile.mkdtemp())
    False
    """
    try:
        return all(json.loads((folder / TOKENIZER_SETTINGS).read_text(encoding="utf-8")).get("model_type") in
                   SENTENCEPIECE_MODELS for folder in tokenizer_folders(vocab_dir))
    except (OSError, ValueError, AttributeError):
        return False


def checkpoint_vocabulary(path: str | os.PathLike[str]) -> pathlib.Path | None:
    """The vocabulary folder of the run or export that wrote the weights file `path`, or None.

    Looks where this package puts it: an export's `assets.extra/vocab` beside
    `assets.extra/model.weights.h5`, a workdir's `data/vocab` beside its
    `averaged.weights.h5` or above its `checkpoints/ckpt-XXXX.weights.h5`.

    Example:

    >>> import tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp()).resolve()
    >>> (run / "data" / "vocab").mkdir(parents=True)
    >>> checkpoint_vocabulary(run / "checkpoints" / "ckpt-0003.weights.h5") == run / "data" / "vocab"
    True
    >>> checkpoint_vocabulary(run / "elsewhere" / "deeper" / "my.weights.h5") is None
    True
    """
    folder = pathlib.Path(path).resolve().parent
    candidates = (folder / VOCAB_DIR, folder / WORKDIR_VOCAB, folder.parent / WORKDIR_VOCAB)
    return next((candidate for candidate in candidates if candidate.is_dir()), None)


def model_file(path: str | os.PathLike[str]) -> pathlib.Path:
    """The `model.yaml` of one model: `path` itself (a file), a workdir's (a run, an import) or a SavedModel
    export's (`assets.extra/model.yaml`).

    Raises:
        CheckpointNotFoundError: none there (the places looked in named).
        ConfigError: an ensemble export (one model.yaml per member: no one model to start from).

    Example:

    >>> import tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run / MODEL_CONFIG).write_text("d_model: 64\\n")
    >>> model_file(run) == run / MODEL_CONFIG
    True
    """
    path = pathlib.Path(path)
    if path.is_file():
        return path
    if (path / EXTRA_DIR / MEMBERS_DIR).is_dir():
        raise ConfigError(f"{path} is an ensemble export: each member has its own {MODEL_CONFIG}; name one "
                          f"({path / EXTRA_DIR / MEMBERS_DIR}/<i>/{MODEL_CONFIG}).")
    for candidate in (path / MODEL_CONFIG, path / EXTRA_DIR / MODEL_CONFIG):
        if candidate.is_file():
            return candidate
    raise CheckpointNotFoundError(f"No {MODEL_CONFIG} at {path}: expected a file, a workdir holding {MODEL_CONFIG} "
                                  f"or an export holding {EXTRA_DIR}/{MODEL_CONFIG}.")

def adopt_vocabulary(checkpoint: str | os.PathLike[str], vocab_dir: str | os.PathLike[str]) -> None:
    """A fine-tuning run tokenizes with the vocabulary its initial weights were trained with.

    A new workdir copies it (so `data/vocab` is never learned afresh, with other
    ids); a workdir that already has a vocabulary must hold the same files.

    Raises:
        ConfigError: `vocab_dir` exists and differs from the checkpoint's vocabulary.
    """
    source = checkpoint_vocabulary(checkpoint)
    if source is None:
        log.warning("training.init_checkpoint: no vocabulary beside %s (an export's assets.extra/vocab or a "
                    "workdir's data/vocab): the workdir's own is used, so its ids must be the ones the weights "
                    "were trained with.", checkpoint)
        return
    vocab_dir = pathlib.Path(vocab_dir)
    if vocab_dir.exists():
        if not same_vocabulary(vocab_dir, source):
            raise ConfigError(f"training.init_checkpoint: the weights in {checkpoint} were trained with the "
                              f"vocabulary in {source}, and this workdir's {vocab_dir} differs from it. Fine-tune "
                              f"in a new workdir: it takes the checkpoint's vocabulary.")
        return
    staging = staging_folder(vocab_dir)
    shutil.copytree(source, staging, dirs_exist_ok=True)
    os.replace(staging, vocab_dir)
    log.info("Vocabulary copied from %s, the init checkpoint's", source)
