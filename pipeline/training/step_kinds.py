"""What one train step computes, chosen by `[train.step]`: the loss, the tape work and the gradients.

Every kind is called inside the one traced `tf.function` train step (`pipeline.train_step`), per
replica, and returns a `StepOutput`; the step itself unscales, measures, checks and applies the
gradients. Kinds (docs/training.md has one section each):

* `standard` — the task's loss (`task_loss`: sparse categorical cross-entropy, binary cross-entropy or squared
  error; + the model's regularization losses);
* `multi_loss` — several weighted losses from one forward pass; a persistent tape gives each loss's
  own gradient, whose global norm is logged (`grad_norm/<loss>`);
* `gradient_penalty` — cross-entropy + `penalty_weight` x mean over examples of ||d CE_i / d x_i||^2:
  the input gradient comes from an inner tape that watches the inputs, the outer tape differentiates it
  again (second order);
* `distillation` — `alpha` x CE + (1 - alpha) x T^2 x KL(softmax(teacher / T) || softmax(student / T));
  the teacher (a `.keras` file, frozen) runs under `tape.stop_recording()`;
* `adversarial` — FGSM: x_adv = x + epsilon x sign(d CE / d x) from an input tape (no gradient flows
  through the attack); loss = (1 - adversarial_weight) x CE(x) + adversarial_weight x CE(x_adv);
* `custom_loss` — `loss = "module:function"` called as `function(y_true, y_pred, model) -> scalar`
  (y_true int64 [B], y_pred logits float32 [B, C]); the mean over the replica's batch;
* `factory` — `factory = "module:function"` called once as `function(settings)` (the `[train.step]`
  table); it returns a step kind of your own: an object with `name`, `metric_names` and
  `__call__(model, inputs, labels, variables, ctx: StepContext) -> StepOutput` (the built-ins are
  examples; `StepContext` and `StepOutput` are the interface).

`gradient_penalty`, `adversarial`, `custom_loss` and `factory` train every task (their cross-entropy is the
task's loss; with named inputs the input gradients are those of the float inputs); `multi_loss` and
`distillation` work on class logits and are refused for binary and regression (`CLASS_ONLY`).

Losses are means over the global batch (`tf.nn.compute_average_loss`); logits of 16-bit layers are cast
to float32 first. Only the serving export reads the model afterwards: every kind exports the same
forward-only `serving_default` (the audit checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfship.core.errors import ConfigError

MULTI_LOSSES = ("cross_entropy", "label_smoothing", "logit_l2", "confidence_penalty")


@dataclass(frozen=True)
class StepContext:
    """What a kind needs from the step: `average(per_example [B]) -> scalar` over the global batch,
    `scale(loss) -> loss` (the LossScaleOptimizer's scaling, identity otherwise), the replica count, the
    task and its per-example loss (`per_example(labels, outputs) -> [B]`).
    """

    average: Callable[[Any], Any]
    scale: Callable[[Any], Any]
    replicas: int = 1
    task: str = "classification"
    loss: Callable[[Any, Any], Any] | None = None  # per-example loss [B] of (labels, outputs): `task_loss`

    def per_example(self, labels, outputs):
        """The task's per-example loss [B] (`task_loss`; sparse cross-entropy when none was given)."""
        return (self.loss or _cross_entropy)(labels, outputs)


@dataclass
class StepOutput:
    """One replica's step: `loss` scalar float32 (unscaled), `logits` the model's outputs (classification
    logits [B, C], binary probability [B, 1], regression prediction [B, 1]), `gradients` (one per variable,
    IndexedSlices kept sparse) and `metrics` {name: scalar}, the names of `StepKind.metric_names`.
    """

    loss: Any
    logits: Any
    gradients: list
    metrics: dict[str, Any] = field(default_factory=dict)


def _logits(model, inputs):
    import tensorflow as tf

    logits = model(inputs, training=True)
    return tf.cast(logits, tf.float32) if logits.dtype in (tf.float16, tf.bfloat16) else logits


def _cross_entropy(labels, logits):
    import keras

    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def task_loss(task: str):
    """The per-example training loss [B] of `task` (`core.tasks`) as `f(labels, outputs)`: classification
    sparse cross-entropy of logits [B, C] (nats), binary cross-entropy of a probability [B, 1] (nats),
    regression squared error of a prediction [B, 1] (label units squared).

    Raises:
        ValueError: an unknown task.
    """
    from tfship.core.tasks import primary

    primary(task)
    if task == "classification":
        return _cross_entropy

    def binary(labels, outputs):
        import tensorflow as tf

        # Keras' binary_crossentropy builds a NaN constant (which check_numerics stops on): the same clipped form
        epsilon = 1e-7
        p = tf.clip_by_value(tf.reshape(outputs, [-1]), epsilon, 1.0 - epsilon)
        y = tf.cast(labels, p.dtype)
        return -(y * tf.math.log(p) + (1.0 - y) * tf.math.log(1.0 - p))

    def regression(labels, outputs):
        import tensorflow as tf

        return tf.square(tf.reshape(outputs, [-1]) - tf.cast(labels, outputs.dtype))

    return binary if task == "binary" else regression


def _float_inputs(inputs):
    """The float tensors among `inputs` (one tensor or a dict of named inputs), in a stable order."""
    import tensorflow as tf

    return [t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]


def _regularization(model, dtype):
    import tensorflow as tf

    if not model.losses:
        return tf.zeros([], dtype)
    return tf.nn.scale_regularization_loss(tf.add_n([tf.cast(x, dtype) for x in model.losses]))


def _require_float_inputs(inputs, kind: str) -> None:
    import tensorflow as tf

    if not _float_inputs(inputs):
        dtypes = sorted({t.dtype.name for t in tf.nest.flatten(inputs)})
        raise ConfigError(f"train.step.kind = {kind!r} differentiates with respect to the inputs; the model's "
                          f"inputs are {dtypes} (use it with float inputs, not token ids)")


class StandardStep:
    """The task's loss (cross-entropy, binary cross-entropy or squared error) plus regularization, one tape
    (the default).
    """

    name = "standard"
    metric_names: tuple[str, ...] = ()

    def __call__(self, model, inputs, labels, variables, ctx: StepContext) -> StepOutput:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = _logits(model, inputs)
            loss = ctx.average(ctx.per_example(labels, logits)) + _regularization(model, logits.dtype)
            scaled = ctx.scale(loss)
        return StepOutput(loss, logits, tape.gradient(scaled, variables))


class MultiLossStep:
    """Weighted losses of one forward pass; per-loss gradients from one persistent tape.

    Args:
        weights: {loss name: weight}, names from `MULTI_LOSSES`: `cross_entropy`, `label_smoothing`
            (cross-entropy against labels smoothed by `smoothing`), `logit_l2` (mean of squared logits),
            `confidence_penalty` (minus the entropy of the softmax, nats).
    """

    name = "multi_loss"

    def __init__(self, weights: dict[str, float], smoothing: float = 0.1):
        unknown = sorted(set(weights) - set(MULTI_LOSSES))
        if unknown or not weights:
            raise ConfigError(f"train.step.losses: unknown or no losses {unknown}; allowed: {list(MULTI_LOSSES)}")
        self.weights, self.smoothing = dict(weights), smoothing
        self.metric_names = tuple(f"{prefix}/{name}" for name in self.weights for prefix in ("loss", "grad_norm"))

    def terms(self, labels, logits, average) -> dict[str, Any]:
        """{loss name: scalar} for `logits` [B, C] float and `labels` int64 [B]."""
        import tensorflow as tf

        classes = tf.shape(logits)[-1]
        log_probs = tf.nn.log_softmax(logits)
        smooth = tf.one_hot(labels, classes, dtype=logits.dtype) * (1.0 - self.smoothing) + \
            self.smoothing / tf.cast(classes, logits.dtype)
        every = {
            "cross_entropy": lambda: average(_cross_entropy(labels, logits)),
            "label_smoothing": lambda: average(-tf.reduce_sum(smooth * log_probs, axis=-1)),
            "logit_l2": lambda: average(tf.reduce_mean(tf.square(logits), axis=-1)),
            "confidence_penalty": lambda: average(tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1)),
        }
        return {name: every[name]() for name in self.weights}

    def __call__(self, model, inputs, labels, variables, ctx: StepContext) -> StepOutput:
        import tensorflow as tf

        with tf.GradientTape(persistent=True) as tape:
            logits = _logits(model, inputs)
            terms = self.terms(labels, logits, ctx.average)
            loss = tf.add_n([self.weights[n] * t for n, t in terms.items()]) + _regularization(model, logits.dtype)
            scaled = ctx.scale(loss)
        metrics = {}
        for name, term in terms.items():
            own = [g for g in tape.gradient(term, variables) if g is not None]
            metrics[f"loss/{name}"] = term
            metrics[f"grad_norm/{name}"] = tf.linalg.global_norm(
                [g.values if isinstance(g, tf.IndexedSlices) else g for g in own]) if own else tf.zeros([])
        gradients = tape.gradient(scaled, variables)
        del tape
        return StepOutput(loss, logits, gradients, metrics)


class GradientPenaltyStep:
    """Cross-entropy + `weight` x mean_i ||d CE_i / d x_i||^2 (input gradients: nested tapes)."""

    name = "gradient_penalty"
    metric_names = ("loss/cross_entropy", "loss/gradient_penalty")

    def __init__(self, weight: float):
        self.weight = weight

    def penalized(self, model, inputs, labels, average, per_example_loss=None):
        """(total loss, task loss, penalty, outputs); call under an outer tape for the second order. Named
        inputs: the penalty sums over every float input (ids have no gradient).
        """
        import tensorflow as tf

        _require_float_inputs(inputs, self.name)
        watched = _float_inputs(inputs)
        with tf.GradientTape() as input_tape:
            input_tape.watch(watched)
            logits = _logits(model, inputs)
            per_example = (per_example_loss or _cross_entropy)(labels, logits)
        # row i: d loss_i / d x_i, for every float input (dense: IndexedSlices would be densified by tf.square)
        gradients = [tf.convert_to_tensor(g) for g in input_tape.gradient(per_example, watched)]
        squared = tf.add_n([tf.reduce_sum(tf.reshape(tf.square(tf.cast(g, logits.dtype)), [tf.shape(g)[0], -1]),
                                          axis=1) for g in gradients])
        cross_entropy, penalty = average(per_example), average(squared)
        total = cross_entropy + self.weight * penalty + _regularization(model, logits.dtype)
        return total, cross_entropy, penalty, logits

    def __call__(self, model, inputs, labels, variables, ctx: StepContext) -> StepOutput:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss, cross_entropy, penalty, logits = self.penalized(model, inputs, labels, ctx.average,
                                                                  ctx.per_example)
            scaled = ctx.scale(loss)
        return StepOutput(loss, logits, tape.gradient(scaled, variables),
                          {"loss/cross_entropy": cross_entropy, "loss/gradient_penalty": penalty})


class DistillationStep:
    """Knowledge distillation from a frozen teacher run under `stop_recording`.

    Args:
        teacher: a Keras model with the student's input and number of classes (its weights are never
            trained: `trainable = False`, and the tape does not see its forward pass).
        temperature: softmax temperature T (> 0); alpha: weight of the hard-label cross-entropy.
    """

    name = "distillation"
    metric_names = ("loss/cross_entropy", "loss/distillation")

    def __init__(self, teacher, temperature: float, alpha: float):
        self.teacher, self.temperature, self.alpha = teacher, temperature, alpha
        teacher.trainable = False

    def distill(self, labels, logits, teacher_logits, average):
        """(total, cross-entropy, T^2-scaled KL) for student and teacher logits [B, C]."""
        import tensorflow as tf

        t = self.temperature
        soft_targets = tf.nn.softmax(tf.cast(teacher_logits, logits.dtype) / t)
        kl = tf.reduce_sum(soft_targets * (tf.math.log(soft_targets + 1e-12) - tf.nn.log_softmax(logits / t)), -1)
        cross_entropy, distillation = average(_cross_entropy(labels, logits)), average(kl) * t * t
        return self.alpha * cross_entropy + (1.0 - self.alpha) * distillation, cross_entropy, distillation

    def __call__(self, model, inputs, labels, variables, ctx: StepContext) -> StepOutput:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = _logits(model, inputs)
            with tape.stop_recording():
                teacher_logits = tf.stop_gradient(self.teacher(inputs, training=False))
            loss, cross_entropy, distillation = self.distill(labels, logits, teacher_logits, ctx.average)
            loss += _regularization(model, logits.dtype)
            scaled = ctx.scale(loss)
        return StepOutput(loss, logits, tape.gradient(scaled, variables),
                          {"loss/cross_entropy": cross_entropy, "loss/distillation": distillation})


class AdversarialStep:
    """FGSM adversarial training: x_adv = x + epsilon x sign(d CE / d x), no gradient through the attack."""

    name = "adversarial"
    metric_names = ("loss/clean", "loss/adversarial")

    def __init__(self, epsilon: float, weight: float):
        self.epsilon, self.weight = epsilon, weight

    def attack(self, model, inputs, labels, per_example_loss=None):
        """The FGSM inputs (same structure, shapes and dtypes as `inputs`; named inputs: every float input
        moved, ids kept), constant for the tape.
        """
        import tensorflow as tf

        _require_float_inputs(inputs, self.name)
        flat = tf.nest.flatten(inputs)
        watched = [t for t in flat if t.dtype.is_floating]
        with tf.GradientTape() as input_tape:
            input_tape.watch(watched)
            loss = tf.reduce_sum((per_example_loss or _cross_entropy)(labels, _logits(model, inputs)))
        moved = iter(tf.stop_gradient(t + self.epsilon * tf.sign(tf.convert_to_tensor(g)))
                     for t, g in zip(watched, input_tape.gradient(loss, watched)))
        return tf.nest.pack_sequence_as(inputs, [next(moved) if t.dtype.is_floating else t for t in flat])

    def __call__(self, model, inputs, labels, variables, ctx: StepContext) -> StepOutput:
        import tensorflow as tf

        adversarial_inputs = self.attack(model, inputs, labels, ctx.per_example)
        with tf.GradientTape() as tape:
            logits = _logits(model, inputs)
            clean = ctx.average(ctx.per_example(labels, logits))
            adversarial = ctx.average(ctx.per_example(labels, _logits(model, adversarial_inputs)))
            loss = (1.0 - self.weight) * clean + self.weight * adversarial + _regularization(model, logits.dtype)
            scaled = ctx.scale(loss)
        return StepOutput(loss, logits, tape.gradient(scaled, variables),
                          {"loss/clean": clean, "loss/adversarial": adversarial})


class CustomLossStep:
    """A user loss `function(y_true [B], y_pred [B, ...], model) -> scalar` (mean over the batch): y_true int64
    class ids (classification, binary) or float32 targets (regression), y_pred the model's outputs (logits
    [B, C], probability [B, 1] or prediction [B, 1]).
    """

    name = "custom_loss"
    metric_names: tuple[str, ...] = ()

    def __init__(self, function: Callable, spec: str):
        self.function, self.spec = function, spec

    def __call__(self, model, inputs, labels, variables, ctx: StepContext) -> StepOutput:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = _logits(model, inputs)
            value = tf.convert_to_tensor(self.function(labels, logits, model))
            if value.shape.rank != 0:
                raise ConfigError(f"train.step.loss {self.spec}: returned shape {value.shape}, expected a scalar")
            loss = tf.cast(value, logits.dtype) / ctx.replicas + _regularization(model, logits.dtype)
            scaled = ctx.scale(loss)
        return StepOutput(loss, logits, tape.gradient(scaled, variables))
