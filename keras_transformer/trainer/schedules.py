"""The paper's learning-rate schedule (section 5.3), as a serializable Keras schedule."""

from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

    Rises linearly for `warmup_steps` steps, then decays with the inverse square
    root of the step. Keras passes the optimizer's iteration count, which starts
    at 0; steps below 1 are treated as step 1.

    Args:
        d_model: model width.
        warmup_steps: length of the linear warmup (4000 in the paper).
        scale: a constant factor on the whole schedule.

    Example:

    >>> schedule = NoamSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(4000)), 6)  # the peak: 512^-0.5 * 4000^-0.5
    0.000699
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> None:
        super().__init__()
        if d_model <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(f"NoamSchedule: d_model, warmup_steps and scale must be positive, "
                             f"got {d_model}, {warmup_steps}, {scale}.")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step: Any) -> Any:
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        decay = ops.rsqrt(step)
        warmup = step * (self.warmup_steps ** -1.5)
        return self.scale * (self.d_model ** -0.5) * ops.minimum(decay, warmup)

    def get_config(self) -> dict[str, Any]:
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_transformer")
class LinearCooldown(keras.optimizers.schedules.LearningRateSchedule):
    """Another schedule, multiplied from update `start` by a factor falling linearly to 0 over `steps` updates.

    lr(step) = schedule(step) * clip((start + steps - step) / steps, 0, 1):
    unchanged before `start`, zero from `start + steps` on. Ending a run at a
    learning rate of zero settles the weights without checkpoint averaging
    (a "cooldown"); `keras-transformer train-packed --cooldown-epochs K`
    puts it on the last K epochs of a run.

    Args:
        schedule: the schedule to cool down (e.g. `NoamSchedule`).
        start: the update at which the decay begins.
        steps: the number of updates it lasts (positive).

    Example:

    >>> cooled = LinearCooldown(NoamSchedule(d_model=512, warmup_steps=4000), start=8000, steps=2000)
    >>> base = NoamSchedule(d_model=512, warmup_steps=4000)
    >>> [round(float(cooled(s) / base(s)), 3) for s in (7000, 8000, 8500, 10000, 12000)]
    [1.0, 1.0, 0.75, 0.0, 0.0]
    """

    def __init__(self, schedule: Any, start: int, steps: int) -> None:
        super().__init__()
        if isinstance(schedule, dict):
            schedule = keras.saving.deserialize_keras_object(schedule)
        if int(start) < 0 or int(steps) <= 0:
            raise ValueError(f"LinearCooldown: start must be >= 0 and steps positive, got {start}, {steps}.")
        self.schedule = schedule
        self.start = int(start)
        self.steps = int(steps)

    def __call__(self, step: Any) -> Any:
        remaining = (float(self.start + self.steps) - ops.cast(step, "float32")) / float(self.steps)
        return self.schedule(step) * ops.clip(remaining, 0.0, 1.0)

    def get_config(self) -> dict[str, Any]:
        return {"schedule": keras.saving.serialize_keras_object(self.schedule), "start": self.start,
                "steps": self.steps}
