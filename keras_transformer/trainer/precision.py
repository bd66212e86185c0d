"""Precision and progress settings of a training run: the dtype policy for `training.mixed_precision`, and
the progress display for `training.verbose`. Backend-neutral."""

import sys
from typing import Any, TextIO

import keras

from keras_transformer.errors import ConfigError
from keras_transformer.experiment import PRECISIONS

_NATIVE_BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def progress_verbosity(setting: int | str, stream: TextIO | None = None) -> int | str:
    """The `verbose` value for `Model.fit`: `setting` itself, or for "auto" a progress bar when `stream`
    (default: stdout) is a terminal and one line per epoch otherwise.

    Keras' own "auto" draws the bar everywhere, so a run under `nohup ... > train.log` would write a redrawn bar
    line for every batch into its log.

    >>> import io
    >>> progress_verbosity("auto", io.StringIO()), progress_verbosity(1, io.StringIO())
    (2, 1)
    """
    if setting != "auto":
        return setting
    stream = sys.stdout if stream is None else stream
    try:
        return 1 if stream.isatty() else 2
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return 2


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (the `flags` line of `/proc/cpuinfo`), as a set; empty where it cannot be read.

    Args:
        cpuinfo: the text of `/proc/cpuinfo`; read from the machine when None.
            Where it cannot be read (not Linux), the answer is empty.

    Example:

    >>> sorted(cpu_flags("flags\t: fpu avx2 avx512_bf16"))
    ['avx2', 'avx512_bf16', 'fpu']
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cpu_has_native_bfloat16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512_BF16 or AMX), from `/proc/cpuinfo`.

    Without those instructions oneDNN converts bfloat16 to float32 around every
    matmul, so `mixed_bfloat16` trains *slower* than float32 (1.14x slower for
    the throughput bench's model on an AVX2-only AMD EPYC; docs/BENCHMARKS.md).

    Args:
        cpuinfo: as `cpu_flags`.

    Example:

    >>> cpu_has_native_bfloat16("flags\t: fpu avx2 avx512f avx512_bf16"), cpu_has_native_bfloat16("flags : avx2")
    (True, False)
    """
    return bool(cpu_flags(cpuinfo) & set(_NATIVE_BFLOAT16_CPU_FLAGS))


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has AMX's bfloat16 tile products (`amx_bf16`: Intel Xeon from Sapphire Rapids).

    Decoding is made of small matrix products (a few rows per step), where AVX512_BF16 alone did not beat float32
    (docs/BENCHMARKS.md, "Low precision"); AMX's tiles did.

    Example:

    >>> cpu_has_amx("flags : avx512f avx512_bf16"), cpu_has_amx("flags : avx512_bf16 amx_bf16 amx_tile")
    (False, True)
    """
    return "amx_bf16" in cpu_flags(cpuinfo)


def resolve_precision(requested: str | bool | None, strategy: Any = None) -> str:
    """The Keras dtype policy name for `training.mixed_precision`.

    `"auto"` (or `true`) picks `mixed_float16` on GPUs (Keras then wraps the
    optimizer in a `LossScaleOptimizer`), `mixed_bfloat16` on TPUs and on CPUs
    with native bfloat16 instructions (AVX512_BF16 or AMX: bfloat16 has
    float32's range and needs no loss scaling), and `float32` on other CPUs,
    where bfloat16 would only add conversions (`cpu_has_native_bfloat16`).

    Example:

    >>> resolve_precision("float32"), resolve_precision(False), resolve_precision("mixed_bfloat16")
    ('float32', 'float32', 'mixed_bfloat16')
    """
    if requested in (False, None, "float32"):
        return "float32"
    if requested in (True, "auto"):
        on_tpu = strategy is not None and "TPU" in type(strategy).__name__
        if on_tpu:
            return "mixed_bfloat16"
        if any(device.lower().startswith("gpu") for device in keras.distribution.list_devices()):
            return "mixed_float16"
        return "mixed_bfloat16" if cpu_has_native_bfloat16() else "float32"
    if requested not in PRECISIONS:
        raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS}, got {requested!r}.")
    return requested


