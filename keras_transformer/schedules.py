"""The paper's learning-rate schedule (section 5.3), as a serializable Keras schedule."""

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

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        super().__init__()
        if d_model <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(f"NoamSchedule: d_model, warmup_steps and scale must be positive, "
                             f"got {d_model}, {warmup_steps}, {scale}.")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        decay = ops.rsqrt(step)
        warmup = step * (self.warmup_steps ** -1.5)
        return self.scale * (self.d_model ** -0.5) * ops.minimum(decay, warmup)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
