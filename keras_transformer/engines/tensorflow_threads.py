"""TensorFlow's thread pools and XLA's threading for a process that translates (`configure_threads`)."""

import os

import tensorflow as tf

# The XLA flag that runs a compiled program's matrix products on the calling thread (see configure_threads).
SINGLE_THREADED_EIGEN = "--xla_cpu_multi_thread_eigen=false"


def xla_flags_for_threads(intra_op: int, flags: str = "") -> str:
    """`flags` (an `XLA_FLAGS` value) with what `intra_op` intra-op threads call for.

    With one intra-op thread, `SINGLE_THREADED_EIGEN` is added unless `flags`
    already set that flag; otherwise `flags` come back as they are.

    Example:

    >>> xla_flags_for_threads(1, "--xla_dump_to=dump"), xla_flags_for_threads(2)
    ('--xla_dump_to=dump --xla_cpu_multi_thread_eigen=false', '')
    """
    if int(intra_op) == 1 and SINGLE_THREADED_EIGEN.split("=")[0] not in flags:
        return f"{flags} {SINGLE_THREADED_EIGEN}".strip()
    return flags


def configure_threads(inter_op: int | None = None, intra_op: int | None = None) -> tuple[int, int]:
    """Sets the sizes of TensorFlow's two thread pools, for this whole process.

    The search is a long chain of small ops, one decoding step after another,
    so extra inter-op threads mostly hand work between cores: for
    single-sentence latency on CPU, `inter_op=1` (and `intra_op` = the cores
    given to the process) is the measured best (docs/decoding.md). Large
    batches gain from intra-op threads. Nothing in this package calls it: a
    process's thread pools are its owner's choice. It must run before
    TensorFlow runs its first op; afterwards TensorFlow cannot resize the
    pools and this raises.

    With `intra_op=1` it also has XLA run matrix products on the calling
    thread (`XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`, added to the
    process's `XLA_FLAGS` unless they already set that flag): otherwise XLA
    hands every product of the compiled search to the one-thread pool and
    waits for it, which made single-sentence decoding 5-8% slower
    (docs/decoding.md, "Threads"). The flag is read when XLA first compiles,
    which is after this call.

    Args:
        inter_op: threads running independent ops side by side (None: leave as is; 0: TF's default).
        intra_op: threads inside one op (a matmul, a reduction) (None: leave as is; 0: TF's default).

    Returns:
        `(inter_op, intra_op)` as TensorFlow reports them afterwards.

    Raises:
        RuntimeError: TensorFlow already started (naming the fix).

    Example:

    >>> configure_threads(inter_op=1)  # doctest: +SKIP
    (1, 0)
    """
    try:
        if inter_op is not None:
            tf.config.threading.set_inter_op_parallelism_threads(int(inter_op))
        if intra_op is not None:
            tf.config.threading.set_intra_op_parallelism_threads(int(intra_op))
    except RuntimeError as error:
        raise RuntimeError("configure_threads: TensorFlow has already run an op in this process, so its thread "
                           "pools are fixed; call configure_threads first thing after importing "
                           f"(TensorFlow said: {error})") from error
    if intra_op is not None:
        flags = xla_flags_for_threads(intra_op, os.environ.get("XLA_FLAGS", ""))
        if flags:
            os.environ["XLA_FLAGS"] = flags
    return (tf.config.threading.get_inter_op_parallelism_threads(),
            tf.config.threading.get_intra_op_parallelism_threads())
