"""What every section's validation shares: the values the closed-set keys accept, the integer test, and unknown
keys refused with the closest known one named.

`config_reference` lists the same constants as the values each key accepts (docs/config.md).
"""

import difflib
import typing

from keras_transformer.errors import ConfigError

DATA_KINDS = ("synthetic", "text", "tfds")
PRECISIONS = ("float32", "auto", "mixed_float16", "mixed_bfloat16")
SECTIONS = ("model", "data", "training", "decoding")
# training.strategy: the tf.distribute strategies (decoding strategies are `keras_transformer.decoding.STRATEGIES`)
DISTRIBUTION_STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")
COMMUNICATIONS = ("auto", "ring", "nccl")  # training.communication: multi_worker's all-reduce
JIT_COMPILE = (True, False, "auto")  # training.jit_compile
VERBOSITIES = ("auto", 0, 1, 2)  # training.verbose
NONFINITE = ("stop",)  # training.on_nonfinite
VALIDATION_METRICS = ("bleu", "chrf")  # training.validation_metric: sacreBLEU's BLEU or chrF
BATCH_SCALINGS = ("per_replica", "global")  # how a batch size is read under a strategy (distribute.global_batch_size)
MODEL_TYPES = ("bpe", "unigram", "wordpiece")  # data.model_type: the SentencePiece / WordPiece vocabulary kinds
SUBWORD_DROPOUT_SIDES = ("both", "source", "target")  # data.subword_dropout_sides
LORA_TARGETS = ("attention", "self_attention", "cross_attention", "feed_forward")  # training.lora.targets (the
                                                                                  # names of layers.lora.TARGETS)


def is_integer(value: typing.Any) -> typing.TypeGuard[int]:
    """An int that is not a bool: YAML's `true` is an int to Python, but never a count.

    Example:

    >>> is_integer(3), is_integer(True), is_integer(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def reject_unknown(values: typing.Any, known: typing.Sequence[str], prefix: str) -> None:
    """Raises `ConfigError` for the first key of `values` not in `known`, with the closest known key suggested;
    `prefix` is the section's (`"training."`, or `""` at the top).

    Example:

    >>> reject_unknown({"epochs": 3}, ["epochs", "seed"], "training.")
    >>> reject_unknown({"epoch": 3}, ["epochs", "seed"], "training.")
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: Unknown config key 'training.epoch'. Did you mean 'training.epochs'? ...
    """
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'The experiment config'} must be a mapping, got {values!r}.")
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(f"Unknown config key '{prefix}{key}'.{hint} "
                              f"Known keys{' in ' + prefix.rstrip('.') if prefix else ''}: {', '.join(known)}.")
