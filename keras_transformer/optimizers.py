"""The paper's optimizer: Adam(beta1=0.9, beta2=0.98, eps=1e-9) on the Noam schedule."""

from typing import Any

import keras

from keras_transformer.config import TransformerConfig
from keras_transformer.keras_internals import schedule_on_updates
from keras_transformer.schedules import LinearCooldown, NoamSchedule


def make_optimizer(config: TransformerConfig, gradient_accumulation_steps: int | None = None,
                   cooldown: tuple[int, int] | None = None, ema_decay: float | None = None,
                   **kwargs: Any) -> keras.optimizers.Adam:
    """Returns `keras.optimizers.Adam` configured as in section 5.3 of the paper.

    Args:
        config: a `TransformerConfig` (uses d_model, warmup_steps, learning_rate_scale,
            beta_1, beta_2, epsilon).
        gradient_accumulation_steps: accumulate gradients over this many batches
            before each update (a larger effective batch on small hardware); the
            update applies their mean. The schedule counts updates, not batches.
        cooldown: `(start, steps)`: from update `start` the learning rate falls
            linearly to zero over `steps` updates (`LinearCooldown`).
        ema_decay: keep an exponential moving average of the weights with this
            decay (Keras' `use_ema` / `ema_momentum`): after each batch,
            `average = ema_decay * average + (1 - ema_decay) * weight`.
        **kwargs: passed on to `keras.optimizers.Adam` (e.g. `clipnorm`).

    Example:

    >>> from keras_transformer.config import TransformerConfig
    >>> optimizer = make_optimizer(TransformerConfig.preset("tiny", vocab_size=100))
    >>> optimizer.beta_2, optimizer.epsilon
    (0.98, 1e-09)
    """
    schedule = NoamSchedule(config.d_model, config.warmup_steps, config.learning_rate_scale)
    if cooldown is not None:
        schedule = LinearCooldown(schedule, *cooldown)
    if gradient_accumulation_steps is not None and gradient_accumulation_steps > 1:
        kwargs["gradient_accumulation_steps"] = int(gradient_accumulation_steps)
    if ema_decay:
        kwargs.update(use_ema=True, ema_momentum=float(ema_decay))
    optimizer = keras.optimizers.Adam(learning_rate=schedule, beta_1=config.beta_1, beta_2=config.beta_2,
                                      epsilon=config.epsilon, **kwargs)
    # Keras would read the schedule at its count of batches, k per update with accumulation.
    return schedule_on_updates(optimizer) if optimizer.gradient_accumulation_steps else optimizer
