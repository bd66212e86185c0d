"""`TrainingSection`, the experiment's `training:` section: the optimizer, schedule and loss, length, hardware,
precision, checkpoints."""

import dataclasses
import typing

from keras_transformer.errors import ConfigError
from keras_transformer.experiment.validation import (
    BATCH_SCALINGS,
    COMMUNICATIONS,
    DISTRIBUTION_STRATEGIES,
    LORA_TARGETS,
    NONFINITE,
    PRECISIONS,
    VALIDATION_METRICS,
    VERBOSITIES,
    is_integer,
)


@dataclasses.dataclass(frozen=True)
class TrainingSection:
    """How to train: optimizer, schedule, loss, length, hardware, precision, checkpoints.

    Example:

    >>> TrainingSection(epochs=3, strategy="mirrored").batch_scaling
    'per_replica'
    """

    label_smoothing: float = 0.1  # epsilon_ls of the label-smoothed cross-entropy
    warmup_steps: typing.Optional[int] = None  # Noam warm-up, in updates
    learning_rate_scale: float = 1.0  # multiplies the Noam schedule
    beta_1: float = 0.9  # Adam beta1
    beta_2: float = 0.98  # Adam beta2
    epsilon: float = 1e-9  # Adam epsilon
    clipnorm: typing.Optional[float] = None  # clip each gradient to this norm
    cooldown_epochs: typing.Optional[int] = None  # over the last K epochs the learning rate falls linearly to zero
    gradient_accumulation_steps: int = 1  # update with the mean gradient of this many batches (docs/training.md)
    epochs: int = 10  # epochs in total (a resumed run counts the ones already done)
    steps_per_epoch: typing.Optional[int] = None  # batches an epoch (updates, without accumulation),
                                                  # from the training data repeated without end
                                                  # (each pass shuffled anew); None: an epoch is one pass
    strategy: str = "auto"  # see keras_transformer.experiment.DISTRIBUTION_STRATEGIES
    devices: typing.Optional[list] = None  # devices for "mirrored" / "one_device", e.g. ["/gpu:0", "/gpu:1"]
    communication: str = "auto"  # multi_worker all-reduce: "auto", "ring" or "nccl"
    batch_scaling: str = "per_replica"  # data batch sizes are "per_replica" or "global" (docs/distributed.md)
    mixed_precision: typing.Any = "float32"  # "float32", "auto", "mixed_float16", "mixed_bfloat16" (or bool)
    jit_compile: typing.Any = "auto"  # XLA: true, false or "auto" (Keras decides)
    steps_per_execution: int = 1  # batches per tf.function call (fewer Python round trips)
    rdrop_alpha: typing.Optional[float] = None  # R-Drop (null or 0: off): every pair runs twice a batch, with
                                                # two dropout masks, and alpha / 4 times their symmetric KL joins
                                                # the loss (losses.RDropLoss); a batch computes twice the positions
    chunked_loss: typing.Any = "auto"  # compute the training loss from the decoder's output 8,192 vocabulary
                                       # entries at a time, never holding the (tokens, V) logits (less memory, one
                                       # more product of the output projection); "auto": LoRA runs with 32,768
                                       # or more target ids (TensorFlow; not with R-Drop or distillation)
    ema_decay: typing.Optional[float] = None  # a moving average of the weights with this decay, e.g. 0.999 (null:
                                              # off), which checkpoints, validation and exports take
    seed: int = 1234  # keras.utils.set_random_seed: initial weights, dropout, shuffling
    checkpoint_every_steps: typing.Optional[int] = None  # also write checkpoints/step-XXXXXXXX.weights.h5
    keep_step_checkpoints: int = 3  # how many step checkpoints to keep
    keep_checkpoints: typing.Optional[int] = None  # epoch checkpoints to keep; None keeps all (for averaging)
    backup_every_steps: typing.Optional[int] = None  # also back up every N batches (resume inside an epoch)
    on_nonfinite: str = "stop"  # a non-finite loss or weight stops the run before anything of its epoch is saved;
                                # the only choice: no "skip" (docs/training.md, "When the loss is not finite")
    init_checkpoint: typing.Optional[str] = None  # start from these weights (fine-tuning), and from the
                                                  # vocabulary of the run or export that wrote them
    lora: typing.Optional[dict] = None  # LoRA fine-tuning of init_checkpoint: {rank, alpha (default: rank),
                                        # targets (default: [attention, feed_forward])}; only the adapters train
                                        # and checkpoints hold only them (docs/training.md, "LoRA fine-tuning")
    initial_updates: int = 0  # a new run's optimizer starts at this update count, so the learning-rate
                              # schedule goes on from there instead of warming up again (ignored on resume)
    validation: bool = True  # evaluate loss and accuracy on the validation data after each epoch
    bleu_every_epochs: typing.Optional[int] = None  # text data: decode the validation set every N epochs (val_bleu)
    bleu_beam_size: int = 1  # beam for that validation BLEU (1: greedy, fast)
    bleu_max_sentences: typing.Optional[int] = None  # decode only the first N validation sentences
    validation_metric: str = "bleu"  # what bleu_every_epochs scores (val_bleu or val_chrf) and best.weights.h5
                                     # keeps the best of: sacreBLEU's BLEU, or its chrF
    tensorboard: bool = True  # write TensorBoard logs to workdir/logs
    verbose: typing.Any = "auto"  # progress: 0 (silent), 1 (bar), 2 (one line per epoch), "auto" (a bar on a
                                  # terminal, one line per epoch into a log file or pipe)

    def validate(self) -> None:
        """Raises `ConfigError` naming the first bad field."""
        if not _is_number(self.label_smoothing) or not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"training.label_smoothing must be in [0, 1), got {self.label_smoothing!r}.")
        if self.warmup_steps is not None and (not is_integer(self.warmup_steps) or self.warmup_steps <= 0):
            raise ConfigError(f"training.warmup_steps must be a positive integer or null, got {self.warmup_steps!r}.")
        for name in ("learning_rate_scale", "epsilon"):
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                raise ConfigError(f"training.{name} must be a number > 0, got {value!r}.")
        for name in ("beta_1", "beta_2"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ConfigError(f"training.{name} must be a number in [0, 1), got {value!r}.")
        if not is_integer(self.epochs) or self.epochs <= 0:
            raise ConfigError(f"training.epochs must be a positive integer, got {self.epochs!r}.")
        if self.strategy not in DISTRIBUTION_STRATEGIES:
            raise ConfigError(f"training.strategy must be one of {DISTRIBUTION_STRATEGIES}, got {self.strategy!r}.")
        if self.communication not in COMMUNICATIONS:
            raise ConfigError(f"training.communication must be one of {COMMUNICATIONS}, got {self.communication!r}.")
        if self.batch_scaling not in BATCH_SCALINGS:
            raise ConfigError(f"training.batch_scaling must be one of {BATCH_SCALINGS}, "
                              f"got {self.batch_scaling!r}.")
        if not (isinstance(self.mixed_precision, bool) or self.mixed_precision is None
                or self.mixed_precision in PRECISIONS):
            raise ConfigError(f"training.mixed_precision must be one of {PRECISIONS} or a bool, "
                              f"got {self.mixed_precision!r}.")
        if not (isinstance(self.chunked_loss, bool) or self.chunked_loss == "auto"):
            raise ConfigError(f"training.chunked_loss must be true, false or 'auto', got {self.chunked_loss!r}.")
        if not (isinstance(self.jit_compile, bool) or self.jit_compile == "auto"):  # not `in JIT_COMPILE`: 1 == True
            raise ConfigError(f"training.jit_compile must be true, false or 'auto', got {self.jit_compile!r}.")
        if self.on_nonfinite == "skip":
            raise ConfigError("training.on_nonfinite: 'skip' is not offered: dropping an update needs a check inside "
                              "the compiled training step, which Keras' fit does not expose, and a run that keeps "
                              "skipping is better stopped and resumed with a lower learning rate (mixed_float16's "
                              "loss scaling already skips its overflowing updates). Use 'stop', the default.")
        if self.on_nonfinite not in NONFINITE:
            raise ConfigError(f"training.on_nonfinite must be 'stop', got {self.on_nonfinite!r}.")
        if self.validation_metric not in VALIDATION_METRICS:
            raise ConfigError(f"training.validation_metric must be 'bleu' or 'chrf', got {self.validation_metric!r}.")
        if isinstance(self.verbose, bool) or self.verbose not in VERBOSITIES:
            raise ConfigError(f"training.verbose must be 'auto', 0, 1 or 2, got {self.verbose!r}.")
        for name in ("steps_per_epoch", "checkpoint_every_steps", "keep_checkpoints", "backup_every_steps",
                     "bleu_every_epochs", "bleu_max_sentences", "cooldown_epochs"):
            value = getattr(self, name)
            if value is not None and (not is_integer(value) or value <= 0):
                raise ConfigError(f"training.{name} must be a positive integer or null, got {value!r}.")
        for name in ("steps_per_execution", "gradient_accumulation_steps", "keep_step_checkpoints",
                     "bleu_beam_size"):
            value = getattr(self, name)
            if not is_integer(value) or value <= 0:
                raise ConfigError(f"training.{name} must be a positive integer, got {value!r}.")
        if not is_integer(self.initial_updates) or self.initial_updates < 0:
            raise ConfigError(f"training.initial_updates must be a non-negative integer, got "
                              f"{self.initial_updates!r}.")
        if not is_integer(self.seed) or self.seed < 0:
            raise ConfigError(f"training.seed must be a non-negative integer, got {self.seed!r}.")
        if self.rdrop_alpha is not None and (isinstance(self.rdrop_alpha, bool)
                                             or not isinstance(self.rdrop_alpha, (int, float))
                                             or not self.rdrop_alpha >= 0):
            raise ConfigError(f"training.rdrop_alpha must be a number >= 0 or null, got {self.rdrop_alpha!r}.")
        if self.ema_decay is not None and (isinstance(self.ema_decay, bool)
                                           or not isinstance(self.ema_decay, (int, float))
                                           or not 0 < self.ema_decay < 1):
            raise ConfigError(f"training.ema_decay must be a number between 0 and 1 (exclusive; e.g. 0.999) or null, "
                              f"got {self.ema_decay!r}.")
        if self.steps_per_epoch is not None and self.steps_per_epoch % self.steps_per_execution:
            raise ConfigError(f"training.steps_per_epoch={self.steps_per_epoch} is not a multiple of "
                              f"training.steps_per_execution={self.steps_per_execution}: Keras runs whole executions, "
                              f"so an epoch would train "
                              f"{-(-self.steps_per_epoch // self.steps_per_execution) * self.steps_per_execution} "
                              f"updates.")
        self._validate_lora()
        if self.cooldown_epochs is not None and self.cooldown_epochs > self.epochs:
            raise ConfigError(f"training.cooldown_epochs ({self.cooldown_epochs}) is more than training.epochs "
                              f"({self.epochs}).")

    def _validate_lora(self) -> None:
        if self.lora is None:
            return
        if not isinstance(self.lora, dict):
            raise ConfigError(f"training.lora must be a mapping {{rank, alpha, targets}} or null, got {self.lora!r}.")
        unknown = sorted(set(self.lora) - {"rank", "alpha", "targets"})
        if unknown:
            raise ConfigError(f"training.lora.{unknown[0]} is not a LoRA setting; they are rank, alpha and targets.")
        rank = self.lora.get("rank")
        if not is_integer(rank) or rank <= 0:
            raise ConfigError(f"training.lora.rank must be a positive integer, got {rank!r}.")
        alpha = self.lora.get("alpha", rank)
        if not _is_number(alpha) or not alpha > 0:
            raise ConfigError(f"training.lora.alpha must be a number > 0, got {alpha!r}.")
        targets = self.lora.get("targets", ["attention", "feed_forward"])
        if not isinstance(targets, list) or not targets:
            raise ConfigError(f"training.lora.targets must be a non-empty list of {', '.join(LORA_TARGETS)}, "
                              f"got {targets!r}.")
        for target in targets:
            if target not in LORA_TARGETS:
                raise ConfigError(f"training.lora.targets: unknown target {target!r}; the targets are "
                                  f"{', '.join(LORA_TARGETS)}.")
        if not self.init_checkpoint:
            raise ConfigError("training.lora adapts the weights of training.init_checkpoint, which is not set.")

    @property
    def lora_settings(self) -> tuple[int, float, list[str]] | None:
        """`(rank, alpha, targets)` of `lora` with its defaults, or None without LoRA.

        Example:

        >>> TrainingSection(lora={"rank": 8}, init_checkpoint="base.weights.h5").lora_settings
        (8, 8.0, ['attention', 'feed_forward'])
        """
        if self.lora is None:
            return None
        rank = int(self.lora["rank"])
        return rank, float(self.lora.get("alpha", rank)), list(self.lora.get("targets", ["attention", "feed_forward"]))

    @property
    def policy(self) -> typing.Any:
        """The requested dtype policy name, before "auto" is resolved for the device."""
        if self.mixed_precision in (False, None):
            return "float32"
        if self.mixed_precision is True:
            return "auto"
        return self.mixed_precision


def _is_number(value: typing.Any) -> bool:
    """An int or a float, not a bool (YAML's `true`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
