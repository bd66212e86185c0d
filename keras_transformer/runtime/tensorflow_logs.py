"""TensorFlow's C++ log lines kept off stderr, in the command line and in programs that import the package.

TensorFlow's C++ runtime logs through absl straight to file descriptor 2, some
lines before `TF_CPP_MIN_LOG_LEVEL` is read ("Could not find cuda drivers",
"WARNING: All log messages before absl::InitializeLog()", "oneDNN custom
operations are on"). `quiet_tensorflow_import()`, which `import
keras_transformer` runs, sets `TF_CPP_MIN_LOG_LEVEL=3` (unless set) and, when
TensorFlow is later imported (by Keras, or by the package's data pipeline), sends
descriptor 2 to a temporary file while it imports; what is not such a log line
(Python warnings, real errors) is written to stderr afterwards.
`KERAS_TRANSFORMER_TF_LOGS=1` in the environment leaves TensorFlow's logging alone.

Example:

>>> bool(CPP_LOG_LINE.match("I0000 00:00:1795742845.927650    5474 port.cc:153] oneDNN custom operations are on."))
True
"""

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

from keras_transformer.runtime import import_hooks

TF_LOGS_VARIABLE = "KERAS_TRANSFORMER_TF_LOGS"  # set (not 0) to see TensorFlow's C++ log lines
CPP_LOG_LINE = re.compile(r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl::InitializeLog"
                          r"|To enable the following instructions"
                          r"|INFO: Created TensorFlow Lite XNNPACK delegate)")  # LiteRT's interpreter, at load


def tensorflow_logs_wanted() -> bool:
    """Whether the environment asks for TensorFlow's own log lines (`KERAS_TRANSFORMER_TF_LOGS` set, not 0).

    Example:

    >>> import os
    >>> tensorflow_logs_wanted() == (os.environ.get("KERAS_TRANSFORMER_TF_LOGS", "0") not in ("", "0"))
    True
    """
    return os.environ.get(TF_LOGS_VARIABLE, "0") not in ("", "0")


@contextlib.contextmanager
def without_cpp_log_lines() -> Iterator[None]:
    """Inside, file descriptor 2 goes to a temporary file; on leaving, its lines that are not C++ log lines go to
    stderr.

    Example:

    >>> with without_cpp_log_lines():
    ...     _ = os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.\\n")
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not CPP_LOG_LINE.match(line)]
            sys.stderr.write("".join(kept))


def quiet_tensorflow_import() -> None:
    """Unless `KERAS_TRANSFORMER_TF_LOGS` is set: `TF_CPP_MIN_LOG_LEVEL=3` if unset, and TensorFlow's import,
    whenever it comes, `without_cpp_log_lines`.

    Example:

    >>> quiet_tensorflow_import()
    """
    if tensorflow_logs_wanted() or "tensorflow" in sys.modules:
        return
    if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = _SET_LEVEL[0] = "3"
    import_hooks.around_first_import("tensorflow", _quietly)


def _quietly(module: ModuleType) -> contextlib.AbstractContextManager[None]:
    """TensorFlow's module runs `without_cpp_log_lines` (`import_hooks.around_first_import`)."""
    return without_cpp_log_lines()


_SET_LEVEL: list[str | None] = [None]  # the TF_CPP_MIN_LOG_LEVEL quiet_tensorflow_import set, if it set one


def loud_tensorflow_import() -> None:
    """Undoes `quiet_tensorflow_import` before TensorFlow is imported (`keras-transformer --verbose`).

    Example:

    >>> loud_tensorflow_import(); quiet_tensorflow_import()
    """
    import_hooks.cancel("tensorflow", _quietly)
    if _SET_LEVEL[0] is not None and os.environ.get("TF_CPP_MIN_LOG_LEVEL") == _SET_LEVEL[0]:
        del os.environ["TF_CPP_MIN_LOG_LEVEL"]
    _SET_LEVEL[0] = None
