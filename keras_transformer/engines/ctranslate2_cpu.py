"""CTranslate2 on this machine: its CPU backend, chosen before `ctranslate2` is imported, and its threads.

CTranslate2 picks its CPU matrix-product backend (Intel MKL or oneDNN) once, when it is imported, from the
`CT2_USE_MKL` environment variable; `select_cpu_backend` sets it by the package's rule first. A translator's
OpenMP threads default to the CPUs the process may use (`default_intra_threads`). Standard library only: what
`engines.ctranslate2` calls before it imports `ctranslate2`.
"""

import os
import sys

from keras_transformer.errors import ConfigError

# CTranslate2 reads it once, when `ctranslate2` is imported: "1" for Intel MKL, "0" for oneDNN (its default: MKL on
# GenuineIntel CPUs, oneDNN on others).
CPU_BACKEND_VARIABLE = "CT2_USE_MKL"
CPU_BACKENDS = {"mkl": "1", "dnnl": "0"}


def _backend_of(value: object) -> str:
    """The backend a value of CT2_USE_MKL selects ("1"/"true": mkl; else dnnl)."""
    return "mkl" if str(value).strip().lower() in ("1", "true", "yes", "on") else "dnnl"


def cpu_vendor() -> str:
    """The CPU's vendor string as Linux reports it ("GenuineIntel", "AuthenticAMD"; "" where unknown).

    Example:

    >>> isinstance(cpu_vendor(), str)
    True
    """
    return _cpuinfo_field("vendor_id")


def _cpuinfo_field(name: str) -> str:
    """The first value of field `name` in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def select_cpu_backend(backend: str | None = None) -> str:
    """Chooses CTranslate2's CPU matrix-product backend for this process, before `ctranslate2` is imported.

    The rule: oneDNN ("dnnl") on every CPU, unless asked otherwise. CTranslate2's
    own default is Intel MKL on Intel CPUs, and MKL with more than one thread
    stalled a 2-core Intel Xeon (95 ms for one sentence against 7.7 ms with
    oneDNN); on AMD it already uses oneDNN, which docs/BENCHMARKS.md times
    against MKL there. `backend` ("dnnl" or "mkl"), else the environment's
    `CT2_USE_MKL` ("0" or "1"), overrides it. CTranslate2 reads `CT2_USE_MKL`
    once, when it is imported, so this sets it then; in a process that
    imported `ctranslate2` already, the backend it chose stays, and asking for
    another is an error.

    Args:
        backend: "dnnl", "mkl", or None / "auto" (the rule above).

    Returns:
        "dnnl" or "mkl": the backend CTranslate2 uses in this process.

    Raises:
        ConfigError: an unknown backend, or one other than the backend the
            already imported `ctranslate2` uses.

    Example:

    >>> select_cpu_backend("dnnl") if "ctranslate2" not in sys.modules else "dnnl"
    'dnnl'
    """
    if backend in (None, "auto"):
        wanted = None
    elif backend in CPU_BACKENDS:
        wanted = backend
    else:
        raise ConfigError(f"CTranslate2Translator: cpu_backend must be 'auto', 'dnnl' or 'mkl', got {backend!r}.")
    if "ctranslate2" in sys.modules:  # the choice was made when it was imported
        value = os.environ.get(CPU_BACKEND_VARIABLE)
        active = _backend_of(value) if value is not None else ("mkl" if cpu_vendor() == "GenuineIntel" else "dnnl")
        if wanted is not None and wanted != active:
            raise ConfigError(f"CTranslate2Translator: cpu_backend={wanted!r}, but ctranslate2 was already imported "
                              f"in this process with its {active} backend, which it keeps: create the translator "
                              f"before anything imports ctranslate2, or set {CPU_BACKEND_VARIABLE}="
                              f"{CPU_BACKENDS[wanted]} before the process starts.")
        return active
    if wanted is None:
        value = os.environ.get(CPU_BACKEND_VARIABLE)
        wanted = _backend_of(value) if value is not None else "dnnl"
    os.environ[CPU_BACKEND_VARIABLE] = CPU_BACKENDS[wanted]
    return wanted


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one).

    Example:

    >>> usable_cpus() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_intra_threads(inter_threads: int = 1) -> int:
    """Threads per batch when none are given: `OMP_NUM_THREADS` if set, else every CPU the process may use
    (`usable_cpus`, its affinity mask), shared by `inter_threads` translators; at least 1.

    A server owns its machine: one sentence of the shipped model took 8 ms on 2 threads of a 2-core Xeon
    against 13 ms on one (docs/BENCHMARKS.md). CTranslate2's OpenMP threads wait for each other by spinning,
    so on a machine shared with other busy processes a team as large as the machine stalls whenever one of
    its cores is taken (2 threads 8-30x slower than 1 under load, docs/serving.md): there, give
    `intra_threads` (or `OMP_NUM_THREADS`) fewer threads than cores.

    Example:

    >>> default_intra_threads() == int(os.environ.get("OMP_NUM_THREADS") or usable_cpus())
    True
    """
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, usable_cpus() // max(1, int(inter_threads)))


def cpu_model() -> str:
    """The CPU's model name as Linux reports it ("" where unknown).

    Example:

    >>> isinstance(cpu_model(), str)
    True
    """
    return _cpuinfo_field("model name")

