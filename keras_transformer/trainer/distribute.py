"""Choosing and building the `tf.distribute` strategy that training runs under.

One name in the experiment config (`training.strategy`) picks the strategy:

| name           | strategy                                   | when `auto` picks it                          |
|----------------|--------------------------------------------|-----------------------------------------------|
| `default`      | `tf.distribute.get_strategy()` (no-op)     | one GPU or CPU only                           |
| `one_device`   | `OneDeviceStrategy` on `devices[0]`        | never                                         |
| `mirrored`     | `MirroredStrategy` over the local devices  | more than one local GPU                       |
| `multi_worker` | `MultiWorkerMirroredStrategy` (`TF_CONFIG`)| `TF_CONFIG` names more than one worker        |
| `tpu`          | `TPUStrategy` from a `TPUClusterResolver`  | a TPU is announced (`TPU_NAME`, Colab, Cloud) |

Batch sizes scale with replicas as follows (see `global_batch_size` and
`docs/distributed.md`): with `batch_scaling: per_replica` (the default, as in
OpenNMT-tf) the configured batch is what each replica sees and the global batch
grows with the number of replicas; with `batch_scaling: global` the configured
batch is the global one and each replica gets its share, so one step does the
same arithmetic on 1 or 8 devices.

This module is TensorFlow-specific on purpose: model code never imports it.
"""

import json
import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_transformer.experiment import BATCH_SCALINGS, DISTRIBUTION_STRATEGIES
from keras_transformer.runtime import keras_internals

# Environment variables that announce a TPU (Cloud TPU VMs, Colab, GKE).
_TPU_ENV = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS")
_TPU_DEVICE = "/dev/accel0"  # a TPU VM's first TPU chip


def cluster_spec_from_env() -> dict[str, Any] | None:
    """Returns the parsed `TF_CONFIG` (a dict) or `None` when it is not set.

    Raises:
        ValueError: `TF_CONFIG` is set but is not valid JSON with a `cluster` and a `task`.

    Example:

    >>> import json, os
    >>> os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["host:2222"]},
    ...                                       "task": {"type": "worker", "index": 0}})
    >>> cluster_spec_from_env()["task"]
    {'type': 'worker', 'index': 0}
    >>> del os.environ["TF_CONFIG"]
    """
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): {raw!r}") from error
    if not isinstance(spec, dict) or "cluster" not in spec or "task" not in spec:
        raise ValueError(f"TF_CONFIG must hold 'cluster' and 'task', got {raw!r}.")
    return spec


def _num_workers(spec: dict[str, Any]) -> int:
    cluster = spec.get("cluster", {})
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def _tpu_announced() -> bool:
    return any(os.environ.get(name) for name in _TPU_ENV) or os.path.exists(_TPU_DEVICE)


def resolve_strategy_name(name: str = "auto") -> str:
    """Turns `"auto"` into the concrete strategy name for this machine; checks explicit names.

    `auto` looks, in this order, for `TF_CONFIG` with more than one worker
    (`multi_worker`), an announced TPU (`tpu`), more than one local GPU
    (`mirrored`), and otherwise uses `default`.

    Args:
        name: one of `DISTRIBUTION_STRATEGIES`.

    Returns:
        A name from `DISTRIBUTION_STRATEGIES` other than `"auto"`.

    Example:

    >>> resolve_strategy_name("mirrored")
    'mirrored'
    """
    if name not in DISTRIBUTION_STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {DISTRIBUTION_STRATEGIES}.")
    if name != "auto":
        return name
    spec = cluster_spec_from_env()
    if spec is not None and _num_workers(spec) > 1:
        return "multi_worker"
    if _tpu_announced():
        return "tpu"
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return "mirrored"
    return "default"


def make_strategy(name: str = "auto", devices: Sequence[str] | None = None, tpu: str | None = None,
                  communication: str = "auto") -> Any:
    """Builds the `tf.distribute.Strategy` called `name`.

    Call it before any other TensorFlow work in the process: multi-worker and TPU
    strategies configure the runtime and fail once it is running.

    Args:
        name: one of `DISTRIBUTION_STRATEGIES` (`"auto"` chooses with `resolve_strategy_name`).
        devices: device strings for `mirrored` (default: all local GPUs, else the CPU)
            and `one_device` (default: the first GPU, else the CPU).
        tpu: TPU name or address for `tpu` (default: taken from the environment).
        communication: all-reduce for `multi_worker`: `"auto"`, `"ring"` or `"nccl"`.

    Returns:
        The strategy. Use it as `with strategy.scope(): model = build_model(config)`.

    Example:

    >>> strategy = make_strategy("default")
    >>> strategy.num_replicas_in_sync
    1
    """
    resolved = resolve_strategy_name(name)
    if resolved == "default":
        return tf.distribute.get_strategy()
    if resolved == "one_device":
        if devices:
            device = devices[0]
        else:
            device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    if resolved == "mirrored":
        return tf.distribute.MirroredStrategy(devices=list(devices) if devices else None)
    if resolved == "multi_worker":
        spec = cluster_spec_from_env()
        if spec is None:
            raise ValueError("strategy 'multi_worker' needs TF_CONFIG describing the cluster and this task; "
                             "see docs/distributed.md.")
        implementations = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                           "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                           "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
        if communication not in implementations:
            raise ValueError(f"Unknown communication {communication!r}; choose one of {sorted(implementations)}.")
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementations[communication])
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    # TPU
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def global_batch_size(batch_size: int, num_replicas: int, scaling: str = "per_replica") -> int:
    """The global batch (sentences or tokens) that one training step consumes.

    Args:
        batch_size: the configured batch size.
        num_replicas: `strategy.num_replicas_in_sync`.
        scaling: `"per_replica"`: `batch_size` is each replica's share, so the
            global batch is `batch_size * num_replicas`; `"global"`: `batch_size`
            is the global batch and must split evenly over the replicas.

    Returns:
        The global batch size as an int.

    Example:

    >>> global_batch_size(4096, 8), global_batch_size(4096, 8, "global")
    (32768, 4096)
    """
    if scaling not in BATCH_SCALINGS:
        raise ValueError(f"Unknown batch_scaling {scaling!r}; choose one of {BATCH_SCALINGS}.")
    if scaling == "per_replica":
        return int(batch_size) * int(num_replicas)
    if batch_size % num_replicas:
        raise ValueError(f"The global batch size {batch_size} does not split evenly over "
                         f"{num_replicas} replicas; choose a multiple of {num_replicas}.")
    return int(batch_size)


def task_info(strategy: Any = None) -> tuple[str | None, int, bool]:
    """Returns `(task_type, task_id, is_chief)` for this process.

    Without a multi-worker cluster this is `(None, 0, True)`. The chief is task
    `chief` 0, or `worker` 0 when the cluster has no `chief` entry; only the
    chief writes the shared outputs (checkpoints, history, TensorBoard logs).

    Example:

    >>> task_info(make_strategy("default"))
    (None, 0, True)
    """
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if resolver is None or not getattr(resolver, "task_type", None):
        return None, 0, True
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    has_chief = bool(resolver.cluster_spec().as_dict().get("chief"))
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
    return task_type, task_id, is_chief


def input_shard(strategy: Any = None) -> tuple[int, int]:
    """`(workers, index)`: how many workers read the training data, and which part this process reads.

    Each worker of a multi-worker run reads the lines whose number is its index
    modulo the number of workers (the chief first, then the workers in order), so
    that over one pass every pair is trained once across them. `(1, 0)` without a
    multi-worker cluster.

    Example:

    >>> input_shard(make_strategy("default"))
    (1, 0)
    """
    resolver = getattr(strategy, "cluster_resolver", None) if strategy is not None else None
    if resolver is None or not getattr(resolver, "task_type", None):
        return 1, 0
    cluster = resolver.cluster_spec().as_dict()
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    if chiefs + workers <= 1 or resolver.task_type not in ("chief", "worker"):
        return 1, 0
    index = 0 if resolver.task_type == "chief" else chiefs + int(resolver.task_id or 0)
    return chiefs + workers, index


def describe(strategy: Any) -> str:
    """One line naming the strategy, its replicas and this task, for logs.

    Example:

    >>> describe(make_strategy("default"))
    'the default strategy (one device) with 1 replica(s)'
    """
    task_type, task_id, is_chief = task_info(strategy)
    name = type(strategy).__name__
    if name.startswith("_Default"):  # tf.distribute's private class for "no strategy"
        name = "the default strategy (one device)"
    line = f"{name} with {strategy.num_replicas_in_sync} replica(s)"
    if task_type:
        line += f", task {task_type}:{task_id}{' (chief)' if is_chief else ''}"
    return line



def apply_keras_workarounds(model: Any) -> Any:
    """Lets `model.fit`/`evaluate` run under `MultiWorkerMirroredStrategy`: Keras 3's two multi-worker bugs,
    fixed by `keras_internals.apply_multi_worker_workarounds` (which names them).

    Harmless under the other strategies, and a no-op for models built outside any strategy scope.

    Example:

    >>> import keras
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> apply_keras_workarounds(model) is model
    True
    """
    return keras_internals.apply_multi_worker_workarounds(model, tf)
