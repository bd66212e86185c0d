"""The paper's optimizer: Adam(beta1=0.9, beta2=0.98, eps=1e-9) on the Noam schedule."""

from typing import Any, Optional, Protocol

import keras
from keras import ops

from keras_transformer.config import PAPER_WARMUP_STEPS, TransformerConfig
from keras_transformer.runtime.keras_internals import schedule_on_updates
from keras_transformer.trainer.schedules import LinearCooldown, NoamSchedule


class _StepSizes:
    """The step size of the update being applied, per variable dtype (a plain holder: Keras' attribute tracking
    would wrap a bare dict)."""

    def __init__(self) -> None:
        self.by_dtype: dict[str, Any] = {}


@keras.saving.register_keras_serializable(package="keras_transformer")
class Adam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, the same update bit for bit, with the step size computed once per update.

    Keras' Adam computes the bias-corrected step size `lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)` again for each
    variable: a dozen scalar ops per weight, about half the ops of the update. Here each update computes it once
    per variable dtype and every weight reads it, so the traced training step holds far fewer ops: it is traced,
    optimized and run sooner (most visible at the start of a run of a small model), with the same weights after
    every update. `amsgrad` takes Keras' own path.

    Example:

    >>> import numpy as np
    >>> weight = keras.Variable(np.ones(3, "float32"))
    >>> optimizer = Adam(learning_rate=0.1)
    >>> optimizer.apply([keras.ops.ones(3)], [weight])
    >>> [round(float(w), 4) for w in keras.ops.convert_to_numpy(weight)]  # Adam's first step: lr * sign(gradient)
    [0.9, 0.9, 0.9]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_sizes = _StepSizes()

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """`keras.optimizers.Optimizer.apply`: the step sizes are computed afresh for each update (and each trace)."""
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._step_sizes.by_dtype.clear()

    def _step_size(self, learning_rate: Any, dtype: Any) -> Any:
        key = keras.backend.standardize_dtype(dtype)
        if key not in self._step_sizes.by_dtype:  # Keras' expression, in its order
            lr = ops.cast(learning_rate, dtype)
            local_step = ops.cast(self.iterations + 1, dtype)
            beta_1_power = ops.power(ops.cast(self.beta_1, dtype), local_step)
            beta_2_power = ops.power(ops.cast(self.beta_2, dtype), local_step)
            self._step_sizes.by_dtype[key] = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        return self._step_sizes.by_dtype[key]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Keras' Adam update of one variable, reading the update's shared step size."""
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        gradient = ops.cast(gradient, variable.dtype)
        alpha = self._step_size(learning_rate, variable.dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        self.assign_sub(variable, ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), self.epsilon)))


class OptimizerSettings(Protocol):
    """The training settings `make_optimizer` reads: the fields of that name of the experiment's training section
    (`keras_transformer.experiment.TrainingSection`, which is one)."""

    @property
    def warmup_steps(self) -> Optional[int]: ...  # None: the paper's 4000
    @property
    def learning_rate_scale(self) -> float: ...
    @property
    def beta_1(self) -> float: ...
    @property
    def beta_2(self) -> float: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def clipnorm(self) -> Optional[float]: ...
    @property
    def gradient_accumulation_steps(self) -> int: ...
    @property
    def ema_decay(self) -> Optional[float]: ...


def make_optimizer(config: TransformerConfig, training: OptimizerSettings, *,
                   cooldown: tuple[int, int] | None = None, **kwargs: Any) -> keras.optimizers.Adam:
    """Returns Adam (this module's `Adam`: Keras' update) on the Noam schedule, as in section 5.3 of the paper.

    The model gives the schedule its width; everything else is a training setting.

    Args:
        config: the model's `TransformerConfig` (the schedule's d_model).
        training: the run's training settings, an `experiment.TrainingSection`: warmup_steps (None: the paper's
            4000), learning_rate_scale, Adam's beta_1, beta_2 and epsilon, clipnorm (None: no clipping),
            gradient_accumulation_steps (accumulate gradients over this many batches before each update, which
            applies their mean; the schedule counts updates, not batches) and ema_decay (None: off; else keep an
            exponential moving average of the weights with this decay, Keras' `use_ema` / `ema_momentum`:
            after each batch, `average = ema_decay * average + (1 - ema_decay) * weight`).
        cooldown: `(start, steps)`: from update `start` the learning rate falls
            linearly to zero over `steps` updates (`LinearCooldown`).
        **kwargs: passed on to `keras.optimizers.Adam`.

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> from keras_transformer.experiment import TrainingSection
    >>> optimizer = make_optimizer(TransformerConfig.preset("tiny", vocab_size=100), TrainingSection(warmup_steps=400))
    >>> optimizer.beta_2, optimizer.epsilon
    (0.98, 1e-09)
    """
    warmup_steps = training.warmup_steps if training.warmup_steps is not None else PAPER_WARMUP_STEPS
    schedule = NoamSchedule(config.d_model, warmup_steps, training.learning_rate_scale)
    if cooldown is not None:
        schedule = LinearCooldown(schedule, *cooldown)
    if training.gradient_accumulation_steps is not None and training.gradient_accumulation_steps > 1:
        kwargs["gradient_accumulation_steps"] = int(training.gradient_accumulation_steps)
    if training.ema_decay:
        kwargs.update(use_ema=True, ema_momentum=float(training.ema_decay))
    if training.clipnorm:
        kwargs["clipnorm"] = training.clipnorm
    optimizer = Adam(learning_rate=schedule, beta_1=training.beta_1, beta_2=training.beta_2,
                     epsilon=training.epsilon, **kwargs)
    # Keras would read the schedule at its count of batches, k per update with accumulation.
    return schedule_on_updates(optimizer) if optimizer.gradient_accumulation_steps else optimizer
