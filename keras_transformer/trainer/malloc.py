"""The C library's allocator in a training process: one malloc arena for all its threads.

glibc's malloc gives the threads of a process arenas of their own, up to eight
per core, and memory freed in an arena is kept there for that arena's later
requests. TensorFlow's thread pools, tf.data's and the data stream's threads
all allocate: freed memory then sits in one arena while another grows. With the
EN-DE recipe, 4,096-token batches and a 32k vocabulary on a 2-core machine, one
arena lowers the peak resident memory of `train` from 2.98 to 2.83 GB at 4.5M
pairs and from 2.94 to 2.78 GB at 13.5M, the fifth update coming as soon
(docs/BENCHMARKS.md, "Large corpora"). A `MALLOC_ARENA_MAX` in the environment
is left to glibc.
"""

import ctypes
import os
from collections.abc import Mapping

_M_ARENA_MAX = -8  # mallopt's parameter number for the arena limit (glibc's malloc.h)


def limit_malloc_arenas(arenas: int = 1, environ: Mapping[str, str] | None = None) -> bool:
    """Caps glibc's malloc at `arenas` arenas for the threads that start allocating from now on.

    Args:
        arenas: the most arenas.
        environ: the environment (default `os.environ`); with `MALLOC_ARENA_MAX`
            in it nothing is changed.

    Returns:
        Whether the limit was set: False with `MALLOC_ARENA_MAX` set, or
        where the C library has no `mallopt` (not glibc: macOS, Windows) or
        refuses the value.

    Example:

    >>> limit_malloc_arenas(1, environ={"MALLOC_ARENA_MAX": "4"})
    False
    >>> limit_malloc_arenas(0)  # at least one
    False
    """
    environ = os.environ if environ is None else environ
    if "MALLOC_ARENA_MAX" in environ or arenas < 1:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (AttributeError, OSError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_ARENA_MAX, int(arenas)) == 1
