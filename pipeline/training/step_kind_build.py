"""Building the configured step kind (`[train.step]`): the built-ins of `pipeline.training.step_kinds`, a user's
`factory`, a distillation teacher, and the refusal of kinds that need class logits for another task.
"""

from __future__ import annotations

from pathlib import Path

from tfship.core.errors import ConfigError
from tfship.core.imports import import_function
from tfship.pipeline.training.step_kinds import (
    AdversarialStep,
    CustomLossStep,
    DistillationStep,
    GradientPenaltyStep,
    MultiLossStep,
    StandardStep,
)

CLASS_ONLY = {"multi_loss": "combines losses of class logits (label smoothing, logit L2, confidence penalty)",
              "distillation": "matches the teacher's class distribution (a softmax over class logits)"}


def build_step_kind(settings, num_classes: int, task: str = "classification"):
    """The configured step kind (`settings`: `pipeline.config.StepSection`); build under the strategy scope.

    Raises:
        ConfigError: a missing or unusable teacher or loss function, unknown multi-loss names, or a kind that
            needs class logits (`CLASS_ONLY`) with a binary or regression task.
    """
    kind = settings.kind
    if kind in CLASS_ONLY and task != "classification":
        raise ConfigError(f"train.step.kind = {kind!r} {CLASS_ONLY[kind]}; model.task = {task!r} has no class "
                          "logits (standard, gradient_penalty, adversarial, custom_loss and factory train any task)")
    if kind == "standard":
        return StandardStep()
    if kind == "multi_loss":
        return MultiLossStep(dict(settings.losses), settings.label_smoothing)
    if kind == "gradient_penalty":
        return GradientPenaltyStep(settings.penalty_weight)
    if kind == "adversarial":
        return AdversarialStep(settings.epsilon, settings.adversarial_weight)
    if kind == "factory":
        return _from_factory(settings)
    if kind == "custom_loss":
        if settings.loss is None:
            raise ConfigError("train.step.kind = 'custom_loss' needs train.step.loss = 'module:function'")
        return CustomLossStep(import_function(settings.loss, f"train.step.loss = {settings.loss!r}"), settings.loss)
    return DistillationStep(_load_teacher(settings.teacher, num_classes), settings.temperature, settings.alpha)


def _from_factory(settings):
    if settings.factory is None:
        raise ConfigError("train.step.kind = 'factory' needs train.step.factory = 'module:function'")
    try:
        step = import_function(settings.factory, f"train.step.factory = {settings.factory!r}")(settings)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"train.step.factory = {settings.factory!r} failed: {type(err).__name__}: {err}") from err
    missing = [attr for attr in ("name", "metric_names", "__call__") if not hasattr(step, attr)]
    if missing:
        raise ConfigError(f"train.step.factory = {settings.factory!r} returned {type(step).__name__} without "
                          f"{missing} (a step kind has name, metric_names and __call__(model, inputs, labels, "
                          "variables, ctx) -> StepOutput)")
    return step


def _load_teacher(path: Path | None, num_classes: int):
    import keras

    if path is None or not Path(path).is_file():
        raise ConfigError(f"train.step.teacher: distillation needs a .keras teacher file; got {path!r}")
    import tfship.pipeline.training.sparse_embedding  # noqa: F401  (a text teacher's layer)

    try:
        teacher = keras.models.load_model(path, compile=False)
    except Exception as err:
        raise ConfigError(f"train.step.teacher = {str(path)!r}: Keras cannot load it: {err}") from err
    classes = teacher.outputs[0].shape[-1] if getattr(teacher, "outputs", None) else None
    if classes != num_classes:
        raise ConfigError(f"train.step.teacher = {str(path)!r}: outputs {classes} classes, the data has {num_classes}")
    return teacher
