"""Optimizers and learning-rate schedules for the training loop.

Adam, AdamW and SGD with momentum; constant or cosine schedules with an optional linear warm-up;
clipping by global norm and gradient accumulation are the Keras optimizer's own
(`global_clipnorm`, `gradient_accumulation_steps`: clipping applies to the averaged, unscaled
gradients). `mixed_float16` wraps the optimizer in a dynamic `LossScaleOptimizer`.
"""

from __future__ import annotations

import math

from tfship.pipeline.config import TrainSection


def _warmup_schedule_class():
    import keras

    class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """Linear warm-up 0 -> `peak` over `warmup_steps`, then `after(step - warmup_steps)` or `peak`."""

        def __init__(self, peak: float, warmup_steps: int, after=None):
            self.peak = peak
            self.warmup_steps = warmup_steps
            self.after = after

        def __call__(self, step):
            step = keras.ops.cast(step, "float32")
            warm = self.peak * (step + 1.0) / float(max(1, self.warmup_steps))
            rest = self.after(step - self.warmup_steps) if self.after is not None else self.peak
            return keras.ops.where(step < self.warmup_steps, warm, rest)

        def get_config(self):
            return {"peak": self.peak, "warmup_steps": self.warmup_steps}

    return WarmupSchedule


def learning_rate_schedule(config: TrainSection, total_updates: int):
    """The learning rate (a float, or a `LearningRateSchedule` of the optimizer's update count).

    Args:
        config: the [train] table (learning_rate, schedule, warmup_steps).
        total_updates: optimizer updates in the whole run (steps / accumulation_steps).
    """
    import keras

    decay = None
    if config.schedule == "cosine":
        decay = keras.optimizers.schedules.CosineDecay(
            config.learning_rate, decay_steps=max(1, total_updates - config.warmup_steps), alpha=0.0)
    if config.warmup_steps == 0:
        return decay if decay is not None else config.learning_rate
    return _warmup_schedule_class()(config.learning_rate, config.warmup_steps, decay)


def build_optimizer(config: TrainSection, total_updates: int):
    """A Keras optimizer configured from [train].

    Returns the optimizer; for `mixed_float16` a `keras.optimizers.LossScaleOptimizer` around it
    (dynamic loss scale, starting at 2**15).
    """
    import keras

    common = {"learning_rate": learning_rate_schedule(config, total_updates),
              "global_clipnorm": config.clip_global_norm,
              "gradient_accumulation_steps": config.accumulation_steps if config.accumulation_steps > 1 else None}
    if config.optimizer == "adam":
        optimizer = keras.optimizers.Adam(**common)
    elif config.optimizer == "adamw":
        optimizer = keras.optimizers.AdamW(weight_decay=config.weight_decay, **common)
    else:
        optimizer = keras.optimizers.SGD(momentum=config.momentum, **common)
    if config.mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def current_learning_rate(optimizer) -> float:
    """The learning rate the next update uses (float), read through the strategy (`distribute.read_float`)."""
    from tfship.pipeline.training.distribute import read_float

    return read_float(optimizer.learning_rate)


def loss_scale(optimizer) -> float:
    """The dynamic loss scale of a `LossScaleOptimizer`; 1.0 for any other optimizer."""
    from tfship.pipeline.training.distribute import read_float

    scale = getattr(optimizer, "dynamic_scale", None)
    return read_float(scale) if scale is not None else 1.0


def total_optimizer_updates(steps: int, accumulation_steps: int) -> int:
    """Optimizer updates for `steps` training steps with gradient accumulation."""
    return max(1, math.floor(steps / accumulation_steps))
