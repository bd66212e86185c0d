"""What a model costs before it is built: its parameter count and the memory training it needs.

`train` and `train --dry-run` check a config with these before anything is
written, so that a model no machine here could hold (`d_model: 1000000000`) is
refused in a second, naming the estimate and the memory, instead of ending in
an out-of-memory error after the vocabulary is learned. Backend-neutral: the
arithmetic of `model.build_model`'s layers, and the standard library for the
machine's memory.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from keras_transformer.errors import ConfigError, format_size

if TYPE_CHECKING:
    from keras_transformer.config import TransformerConfig

# Bytes of one number of each dtype a policy names; variables of a mixed policy stay float32.
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
MEMORY_CHECK_VARIABLE = "KERAS_TRANSFORMER_MEMORY_CHECK"  # set to 0 to train whatever the estimate says


def parameter_count(config: TransformerConfig) -> int:
    """The number of weights of `build_model(config)`, from the config alone (exact).

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> parameter_count(TransformerConfig.preset("base", vocab_size=37000))
    63082496
    """
    d, ff, heads = config.d_model, config.d_ff, config.num_heads
    keys, values = heads * config.head_dim, heads * config.head_value_dim
    bias = 1 if config.use_bias else 0
    attention = d * (2 * keys + values) + values * d + bias * (2 * keys + values + d)  # Q, K, V and output
    relative = (2 * config.max_relative_position + 1) * (config.head_dim + config.head_value_dim) \
        if config.position == "relative" else 0
    buckets = config.relative_attention_num_buckets * heads if config.position == "relative_bias" else 0
    inner = 2 if config.gated_feed_forward else 1  # a gated network's second inner projection
    feed_forward = inner * (d * ff + bias * ff) + ff * d + bias * d
    norm = d if config.normalization == "rms" else 2 * d  # RMS normalization has no bias
    sublayer = norm + (1 if config.use_rezero else 0)  # its LayerNorm (and ReZero's scalar)
    final_norm = norm if config.norm_first else 0
    encoder = config.encoder_layers * (attention + relative + feed_forward + 2 * sublayer) + final_norm + buckets
    decoder = config.decoder_layers * (2 * attention + relative + feed_forward + 3 * sublayer) + final_norm + buckets
    if config.tie_embeddings == "all":
        embeddings = config.vocab_size * d
    elif config.tie_embeddings == "embeddings":
        embeddings = config.vocab_size * d + config.tgt_vocab_size * d  # one shared matrix, a softmax of its own
    else:
        embeddings = (config.src_vocab_size + config.tgt_vocab_size) * d
        if config.tie_embeddings == "none":
            embeddings += config.tgt_vocab_size * d  # the pre-softmax projection's own matrix, no bias
    positions = 2 * config.max_length * d if config.position == "learned" else 0
    output_bias = config.tgt_vocab_size if config.output_bias else 0  # a bias added to the logits
    embedding_norms = 2 * 2 * d if config.embedding_norm else 0  # a LayerNorm on each side's embeddings
    return embeddings + positions + encoder + decoder + output_bias + embedding_norms


def training_memory(config: TransformerConfig, tokens_per_batch: int, policy: str | None = "float32", *,
                    moving_average: bool = False, accumulation: bool = False) -> dict[str, int]:
    """Bytes that training `config` needs, roughly: weights, Adam's two moments and the gradients (one number
    each per weight, at the variables' precision), a moving average and accumulated gradients where asked,
    plus the activations of a batch of `tokens_per_batch` source and as many target tokens kept for the
    backward pass (sub-layer outputs, attention weights up to `max_length` keys, the logits and their softmax).

    Args:
        config: the `TransformerConfig`.
        tokens_per_batch: the tokens of one side of a batch (padding included).
        policy: the dtype policy name ("float32", "mixed_float16", "mixed_bfloat16", "bfloat16", ...).
        moving_average, accumulation: `training.ema_decay` and `training.gradient_accumulation_steps` > 1.

    Returns:
        `{"parameters", "weights", "optimizer", "activations", "total"}`: the count, then bytes.

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> memory = training_memory(TransformerConfig.preset("base", vocab_size=37000), 4096)
    >>> memory["parameters"], memory["weights"] // 2**20, memory["total"] // 2**30
    (63082496, 240, 5)
    """
    parameters = parameter_count(config)
    policy = str(policy or "float32")
    compute = _BYTES.get(policy.split("_")[-1], 4)  # "mixed_bfloat16" computes in bfloat16
    variable = 4 if policy.startswith("mixed") else compute
    weights = parameters * variable
    optimizer = parameters * variable * (3 + int(moving_average) + int(accumulation))  # 2 moments + gradients
    d, ff, heads = config.d_model, config.d_ff, config.num_heads
    keys = min(config.max_length, tokens_per_batch)  # the longest a sentence can be
    encoder = config.encoder_layers * (10 * d + 2 * ff + 2 * heads * keys)
    decoder = config.decoder_layers * (15 * d + 2 * ff + 4 * heads * keys)
    logits = 3 * config.tgt_vocab_size  # the logits, their softmax and its gradient, in float32
    activations = tokens_per_batch * ((encoder + decoder) * compute + logits * 4)
    return {"parameters": parameters, "weights": weights, "optimizer": optimizer, "activations": activations,
            "total": weights + optimizer + activations}


def available_memory() -> int | None:
    """Bytes of memory this process may still take: Linux's MemAvailable plus free swap (less, in a container
    whose cgroup sets a lower limit), else the physical memory (`os.sysconf`); None where neither can be read.

    Example:

    >>> available_memory() is None or available_memory() > 0
    True
    """
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle if line.count(":") == 1}
        if "MemAvailable" in fields:
            available = fields["MemAvailable"] + fields.get("SwapFree", 0)
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    try:  # cgroup v2: the container's own limit, less what it uses
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as limit, \
                open("/sys/fs/cgroup/memory.current", encoding="ascii") as used:
            text = limit.read().strip()
            if text != "max":
                available = min(available, int(text) - int(used.read().strip()))
    except (OSError, ValueError):
        pass
    return available


def describe_memory(memory: dict[str, int]) -> str:
    """One line of `training_memory`'s estimate, for the log and `--dry-run`.

    Example:

    >>> print(describe_memory({"parameters": 63082496, "weights": 252329984, "optimizer": 756989952,
    ...                        "activations": 1400000000, "total": 2409319936}))  # doctest: +NORMALIZE_WHITESPACE
    63.1M parameters; training needs about 2.2 GiB (weights 240.6 MiB, optimizer state and gradients
    721.9 MiB, activations 1.3 GiB)
    """
    parameters = memory["parameters"]
    count = (f"{parameters / 1e9:.1f}G" if parameters >= 1e9 else f"{parameters / 1e6:.1f}M" if parameters >= 1e6
             else str(parameters))
    sizes = {name: format_size(memory[name]) for name in ("total", "weights", "optimizer", "activations")}
    return (f"{count} parameters; training needs about {sizes['total']} (weights {sizes['weights']}, optimizer "
            f"state and gradients {sizes['optimizer']}, activations {sizes['activations']})")


def check_training_memory(memory: dict[str, int], available: int | None = None) -> None:
    """Refuses (`ConfigError`) a training run whose `training_memory` estimate is more than the memory this
    machine has left (`available_memory`); `KERAS_TRANSFORMER_MEMORY_CHECK=0` in the environment turns it off.

    Example:

    >>> check_training_memory({"parameters": 10**12, "weights": 4 * 10**12, "optimizer": 12 * 10**12,
    ...                        "activations": 0, "total": 16 * 10**12}, available=64 * 2**30)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: The model is too large to train here: 1000.0G parameters; ...
    """
    if os.environ.get(MEMORY_CHECK_VARIABLE, "1") in ("0", "false", "no"):
        return
    available = available_memory() if available is None else available
    if available is None or memory["total"] <= available:
        return
    raise ConfigError(
        f"The model is too large to train here: {describe_memory(memory)}, and this machine has "
        f"{format_size(available)} of memory available. Make the model smaller (model.d_model, model.d_ff, "
        f"model.num_layers, the vocabulary) or the batches (data.tokens_per_batch, data.batch_size); "
        f"{MEMORY_CHECK_VARIABLE}=0 skips this check.")



def search_memory(rows: int, beam: int, source_positions: int, target_positions: int, d_model: int,
                  decoder_layers: int, vocab_size: int, members: int = 1) -> int:
    """Bytes that a cached search over `rows` sentences with `beam` hypotheses each holds at its longest, roughly:
    the decoder's cached self-attention keys and values (`target_positions` of them), the cross-attention keys
    and values of the encoder's output (`source_positions`), and one step's logits, log-probabilities and the
    top-k scratch over `beam * vocab_size` candidates, all float32, per ensemble member.

    What a server must be able to hold for the largest request it allows (`keras-transformer serve` logs it).

    Example:

    >>> search_memory(rows=16, beam=16, source_positions=128, target_positions=128, d_model=128,
    ...               decoder_layers=4, vocab_size=8000) // 2**20
    279
    """
    hypotheses = rows * beam
    cache = decoder_layers * 2 * hypotheses * (target_positions + source_positions) * d_model * 4
    step = 3 * hypotheses * vocab_size * 4
    return members * (cache + step)
