"""Each train step kind's gradients against finite differences or a hand-derived value (float64, tiny
linear model), and the invariants of each kind (teacher untouched, FGSM inputs, scalar user loss)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfship.core.errors import ConfigError
from tfship.pipeline.training.step_kind_build import build_step_kind
from tfship.pipeline.training.step_kinds import (
    AdversarialStep,
    CustomLossStep,
    DistillationStep,
    GradientPenaltyStep,
    MultiLossStep,
    StandardStep,
    StepContext,
)

CONTEXT = StepContext(average=tf.reduce_mean, scale=lambda loss: loss)


def _linear(seed: int, classes: int = 4, features: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((features,), dtype="float64"),
                              keras.layers.Dense(classes, dtype="float64", bias_initializer="random_normal")])
    return model


@pytest.fixture()
def batch():
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(size=(5, 3))), tf.constant([0, 1, 2, 3, 1], tf.int64)


def finite_difference(model: keras.Model, loss_fn, h: float = 1e-6) -> list[np.ndarray]:
    """Central differences of the scalar `loss_fn()` with respect to every trainable weight."""
    grads = []
    for variable in model.trainable_variables:
        base = variable.numpy().copy()
        grad = np.zeros_like(base)
        for index in np.ndindex(base.shape):
            for sign in (1.0, -1.0):
                shifted = base.copy()
                shifted[index] += sign * h
                variable.assign(shifted)
                grad[index] += sign * float(loss_fn()) / (2 * h)
        variable.assign(base)
        grads.append(grad)
    return grads


def _assert_close(got, want, tol=1e-6):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=tol, atol=tol)


def _ce(model, x, y):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))


def test_standard_step_gradient_matches_finite_differences(batch):
    model, (x, y) = _linear(1), batch
    out = StandardStep()(model, x, y, model.trainable_variables, CONTEXT)
    _assert_close(out.gradients, finite_difference(model, lambda: _ce(model, x, y)))


def test_multi_loss_total_and_per_loss_gradient_norms_match_finite_differences(batch):
    model, (x, y) = _linear(2), batch
    kind = MultiLossStep({"cross_entropy": 1.0, "label_smoothing": 0.5, "logit_l2": 0.01, "confidence_penalty": 0.2})
    out = kind(model, x, y, model.trainable_variables, CONTEXT)

    def terms():
        return kind.terms(y, model(x), tf.reduce_mean)

    total = finite_difference(model, lambda: sum(kind.weights[n] * t for n, t in terms().items()))
    _assert_close(out.gradients, total)
    for name in kind.weights:
        own = finite_difference(model, lambda name=name: terms()[name])
        want = np.sqrt(sum(float(np.sum(g ** 2)) for g in own))
        assert float(out.metrics[f"grad_norm/{name}"]) == pytest.approx(want, rel=1e-6)
    assert set(out.metrics) == set(kind.metric_names)


def test_gradient_penalty_matches_hand_derived_penalty_and_second_order_finite_differences(batch):
    model, (x, y) = _linear(3), batch
    kind = GradientPenaltyStep(weight=0.3)
    out = kind(model, x, y, model.trainable_variables, CONTEXT)
    # Linear model: d CE_i / d x_i = W (softmax(z_i) - onehot(y_i)).
    kernel = model.layers[0].kernel.numpy()
    residual = tf.nn.softmax(model(x)).numpy() - np.eye(4)[y.numpy()]
    hand = np.mean(np.sum((residual @ kernel.T) ** 2, axis=1))
    assert float(out.metrics["loss/gradient_penalty"]) == pytest.approx(hand, rel=1e-9)
    _assert_close(out.gradients, finite_difference(model, lambda: kind.penalized(model, x, y, tf.reduce_mean)[0]))


def test_distillation_gradient_matches_and_teacher_is_never_touched(batch):
    student, teacher, (x, y) = _linear(4), _linear(5), batch
    kind = DistillationStep(teacher, temperature=2.0, alpha=0.3)
    before = [w.numpy().copy() for w in teacher.weights]
    variables = [*student.trainable_variables, *teacher.weights]
    out = kind(student, x, y, variables, CONTEXT)
    assert all(g is None for g in out.gradients[len(student.trainable_variables):])  # not recorded by the tape
    assert teacher.trainable_variables == []
    teacher_logits = teacher(x)
    want = finite_difference(student, lambda: kind.distill(y, student(x), teacher_logits, tf.reduce_mean)[0])
    _assert_close(out.gradients[:len(student.trainable_variables)], want)
    optimizer = keras.optimizers.Adam(0.1)
    for _ in range(3):
        out = kind(student, x, y, student.trainable_variables, CONTEXT)
        optimizer.apply(out.gradients, student.trainable_variables)
    assert all(np.array_equal(b, w.numpy()) for b, w in zip(before, teacher.weights))


def test_adversarial_inputs_follow_the_input_gradient_sign_and_gradient_matches(batch):
    model, (x, y) = _linear(6), batch
    kind = AdversarialStep(epsilon=0.1, weight=0.4)
    residual = tf.nn.softmax(model(x)).numpy() - np.eye(4)[y.numpy()]
    hand = x.numpy() + 0.1 * np.sign(residual @ model.layers[0].kernel.numpy().T)
    attacked = kind.attack(model, x, y)
    np.testing.assert_allclose(attacked.numpy(), hand, rtol=0, atol=1e-12)
    out = kind(model, x, y, model.trainable_variables, CONTEXT)
    _assert_close(out.gradients, finite_difference(model, lambda: 0.6 * _ce(model, x, y) + 0.4 * _ce(model, attacked, y)))


def mean_square_logits(y_true, y_pred, model):
    """A user loss for the tests: mean of the squared logits."""
    return tf.reduce_mean(tf.square(y_pred))


def test_custom_loss_gradient_matches_the_hand_derived_value(batch):
    model, (x, y) = _linear(7), batch
    out = CustomLossStep(mean_square_logits, "tests:mean_square_logits")(model, x, y, model.trainable_variables, CONTEXT)
    logits = model(x).numpy()
    # L = mean(z^2) over N x C, z = x W + b: dL/db = 2/(N C) sum_n z_n, dL/dW = 2/(N C) x^T z.
    np.testing.assert_allclose(out.gradients[1].numpy(), 2 * logits.sum(0) / logits.size, rtol=1e-12)
    np.testing.assert_allclose(out.gradients[0].numpy(), 2 * x.numpy().T @ logits / logits.size, rtol=1e-12)
    with pytest.raises(ConfigError, match="expected a scalar"):
        CustomLossStep(lambda t, p, m: tf.square(p), "x:y")(model, x, y, model.trainable_variables, CONTEXT)


def test_step_settings_are_checked_by_name(tmp_path):
    from tfship.pipeline.config import StepSection

    with pytest.raises(ConfigError, match="teacher"):
        build_step_kind(StepSection(kind="distillation"), 10)
    with pytest.raises(ConfigError, match="needs train.step.loss"):
        build_step_kind(StepSection(kind="custom_loss"), 10)
    with pytest.raises(ConfigError, match="cannot import"):
        build_step_kind(StepSection(kind="custom_loss", loss="no_such_module:f"), 10)
    model = _linear(8, classes=3)
    model.save(tmp_path / "teacher.keras")
    with pytest.raises(ConfigError, match="outputs 3 classes, the data has 10"):
        build_step_kind(StepSection(kind="distillation", teacher=tmp_path / "teacher.keras"), 10)
    with pytest.raises(ConfigError, match="token ids"):
        GradientPenaltyStep(0.1)(model, tf.constant([[1, 2, 3]], tf.int64), tf.constant([0], tf.int64), [], CONTEXT)


class ClassWeightedStep:
    """A user step kind (the `factory` hook): cross-entropy with per-class weights, its own tape."""

    name = "class_weighted"
    metric_names = ("loss/weighted",)

    def __init__(self, weights):
        self.weights = tuple(weights)

    def loss(self, model, x, y, average):
        per_example = keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
        return average(per_example * tf.gather(tf.constant(self.weights, per_example.dtype), y))

    def __call__(self, model, inputs, labels, variables, ctx):
        from tfship.pipeline.training.step_kinds import StepOutput

        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = self.loss(model, inputs, labels, ctx.average)
        return StepOutput(loss, logits, tape.gradient(ctx.scale(loss), variables), {"loss/weighted": loss})


def not_a_step_factory(settings):
    """A broken `train.step.factory` hook: returns a plain function."""
    return mean_square_logits


def class_weighted_factory(settings):
    """`train.step.factory` hook used by the tests."""
    return ClassWeightedStep([1.0, 2.0, 0.5] + [1.0] * 7)


def test_factory_hook_builds_a_user_step_whose_gradient_matches(batch):
    from tfship.pipeline.config import StepSection

    model, (x, y) = _linear(9), batch
    kind = build_step_kind(StepSection(kind="factory",
                                       factory="tests.pipeline.test_step_kinds:class_weighted_factory"), 4)
    out = kind(model, x, y, model.trainable_variables, CONTEXT)
    _assert_close(out.gradients, finite_difference(model, lambda: kind.loss(model, x, y, tf.reduce_mean)))
    with pytest.raises(ConfigError, match="without \\['name', 'metric_names'\\]"):
        build_step_kind(StepSection(kind="factory", factory="tests.pipeline.test_step_kinds:not_a_step_factory"), 4)
    with pytest.raises(ConfigError, match="failed: TypeError"):
        build_step_kind(StepSection(kind="factory", factory="tests.pipeline.test_step_kinds:mean_square_logits"), 4)
