"""The names of the on-disk layout of runs and exports, and the checks on it that need no TensorFlow.

The command line runs these before it imports TensorFlow (seconds), so that a
wrong path or a folder that is not a model is reported at once.
`keras_transformer.workdir` loads what these name. Standard library only.
"""

import os
import pathlib
import re

from keras_transformer.errors import CheckpointNotFoundError, ConfigError
from keras_transformer.exports.folder import check_export_sizes, recover_export
from keras_transformer.files import is_inside

MODEL_CONFIG = "model.yaml"  # a workdir's TransformerConfig, and an export's in assets.extra/
CHECKPOINTS_DIR = "checkpoints"
WORKDIR_VOCAB = os.path.join("data", "vocab")
AVERAGED_WEIGHTS = "averaged.weights.h5"  # `average`'s default output in a workdir
EXTRA_DIR = "assets.extra"  # an export's Keras model: model.yaml, model.weights.h5, vocab/ (members/<i>/)
MODEL_WEIGHTS = "model.weights.h5"
MEMBERS_DIR = "members"
VOCAB_DIR = "vocab"
CHECKPOINT_PATTERN = re.compile(r"^(?:ckpt|step)-(\d+)\.weights\.h5$")
SAVED_MODEL = "saved_model.pb"
CTRANSLATE2_METADATA = "keras_transformer.json"  # a CTranslate2 export's own metadata (ctranslate2_translator)


def model_kind(path):
    """What a model folder is: "workdir", "export" (a SavedModel), "ctranslate2", or None.

    >>> import tempfile
    >>> model_kind(tempfile.mkdtemp()) is None
    True
    """
    path = pathlib.Path(path)
    if (path / SAVED_MODEL).is_file():
        return "export"
    if (path / CTRANSLATE2_METADATA).is_file() and (path / "model.bin").is_file():
        return "ctranslate2"
    if (path / MODEL_CONFIG).is_file():
        return "workdir"
    return None


def check_model_path(path):
    """Refuses a `--model` that is missing or not one of the three kinds of model folder, naming it.

    Raises:
        CheckpointNotFoundError: the folder is missing, or holds no model.
    """
    check_model_folder(path)
    if model_kind(path) is None:
        raise not_a_model(path)


def not_a_model(path):
    """The error for a folder that holds no model: it names the three kinds and the file each would have."""
    return CheckpointNotFoundError(f"{path} is not a model folder: not a training workdir (no {MODEL_CONFIG}), a "
                                   f"SavedModel export (no {SAVED_MODEL}) or a CTranslate2 export (no "
                                   f"{CTRANSLATE2_METADATA}).")


def is_training_workdir(path):
    """Whether `path` is a training workdir: a `model.yaml` beside `experiment.yaml` or `checkpoints/`."""
    path = pathlib.Path(path)
    return (path / MODEL_CONFIG).is_file() and ((path / "experiment.yaml").is_file() or
                                                 (path / CHECKPOINTS_DIR).is_dir())


def check_export_destination(directory):
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


def is_export(path):
    """Whether `path` is a SavedModel export folder (it has `saved_model.pb`)."""
    return (pathlib.Path(path) / "saved_model.pb").is_file()


def check_weights_choice(model, checkpoint, average):
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


def check_model_folder(path):
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


def check_average_output(workdir, output=None):
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
