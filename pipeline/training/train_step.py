"""The compiled train step, the evaluation pass and the XLA choice.

The step is one `tf.function` with an explicit `input_signature` (`None` batch dimension on one
device) and `reduce_retracing=False`, so it is traced exactly once; the count comes from a Python
side effect that only runs while tracing. It runs under the training strategy (`strategy.run`),
scales the loss for `mixed_float16`, and returns the loss, the correct-prediction count, the
global norm of the (unscaled) gradients, a per-variable non-finite flag and the step kind's metrics
(`pipeline.step_kinds`: what the step computes is the kind's; measuring and applying is the step's).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

XLA_ERRORS = ("InvalidArgumentError", "UnimplementedError", "InternalError", "NotFoundError")


class StepFunctions:
    """The train step (XLA or not) and the evaluation function for one model and optimizer.

    Args:
        model: the Keras model (variables created under the strategy's scope).
        optimizer: a built Keras optimizer (LossScaleOptimizer for float16).
        strategy: the tf.distribute strategy.
        jit_compile: compile the step with XLA.
        signature: `input_signature` of the step: [inputs spec, labels int64 [B] spec] (per-replica
            specs under a distribution strategy).
        eval_spec: `tf.TensorSpec` of one inference batch, batch dimension None.
        global_batch: samples per step across replicas (the loss is averaged over it).
        kind: the step kind (`pipeline.step_kinds`); default `StandardStep()`.
    """

    def __init__(self, model, optimizer, strategy, *, jit_compile: bool, signature, eval_spec, global_batch: int,
                 kind=None):
        import tensorflow as tf

        from tfship.pipeline.training.step_kinds import StandardStep, StepContext

        self.traces = 0
        self.jit_compile = jit_compile
        self.model = model
        self.kind = kind if kind is not None else StandardStep()
        variables = list(model.trainable_variables)
        self.variable_names = [v.path for v in variables]
        self.sparse_gradients: dict[str, str] = {}  # variable path -> gradient type, recorded while tracing
        scaled_loss = hasattr(optimizer, "dynamic_scale")
        context = StepContext(
            lambda per_example: tf.nn.compute_average_loss(per_example, global_batch_size=global_batch),
            optimizer.scale_loss, strategy.num_replicas_in_sync)

        def replica_step(inputs, labels):
            out = self.kind(model, inputs, labels, variables, context)
            gradients = [g if g is not None else tf.zeros_like(v) for g, v in zip(out.gradients, variables)]
            self.sparse_gradients = {v.path: type(g).__name__ for g, v in zip(gradients, variables)
                                     if isinstance(g, tf.IndexedSlices)}
            unscale = 1.0 / tf.cast(optimizer.dynamic_scale, tf.float32) if scaled_loss else 1.0
            # Embedding gradients are IndexedSlices: their `values` carry the norm and the non-finite check.
            true_gradients = [tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32) * unscale
                              for g in gradients]
            norm = tf.linalg.global_norm(true_gradients)
            nonfinite = tf.stack([1.0 - tf.cast(tf.reduce_all(tf.math.is_finite(g)), tf.float32)
                                  for g in true_gradients])
            optimizer.apply(gradients, variables)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(out.logits, axis=-1), labels), tf.float32))
            metrics = {name: tf.cast(out.metrics[name], tf.float32) for name in self.kind.metric_names}
            return tf.cast(out.loss, tf.float32), correct, norm, nonfinite, metrics

        @tf.function(input_signature=signature, jit_compile=jit_compile, reduce_retracing=False)
        def train_step(inputs, labels):
            self.traces += 1  # Python side effect: runs only while tracing.
            loss, correct, norm, nonfinite, metrics = strategy.run(replica_step, args=(inputs, labels))
            total, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
            return (strategy.reduce(total, loss, axis=None), strategy.reduce(total, correct, axis=None),
                    strategy.reduce(mean, norm, axis=None), strategy.reduce(total, nonfinite, axis=None),
                    {name: strategy.reduce(mean, value, axis=None) for name, value in metrics.items()})

        @tf.function(input_signature=[eval_spec])
        def predict_logits(inputs):
            return tf.cast(model(inputs, training=False), tf.float32)

        self.train_step = train_step
        self.predict_logits = predict_logits

    def sparse_update_ops(self) -> list[str]:
        """Scatter op types (`ResourceScatterSub`, ...) in the traced step: the optimizer updated some
        variable row by row. Empty when every update is dense (e.g. global-norm clipping densified it).
        """
        graph = self.train_step.get_concrete_function().graph.as_graph_def()
        nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
        return sorted({node.op for node in nodes if "Scatter" in node.op})

    def evaluate(self, inputs: np.ndarray, labels: np.ndarray, batch_size: int = 512) -> tuple[float, float]:
        """(mean cross-entropy loss in nats, top-1 accuracy as a fraction) of the model in inference mode."""
        correct, loss_sum = 0, 0.0
        for start in range(0, len(labels), batch_size):
            logits = self.predict_logits(inputs[start:start + batch_size]).numpy().astype(np.float64)
            batch = labels[start:start + batch_size]
            shifted = logits - logits.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            loss_sum -= float(log_probs[np.arange(len(batch)), batch].sum())
            correct += int(np.sum(np.argmax(logits, axis=-1) == batch))
        return loss_sum / max(1, len(labels)), correct / max(1, len(labels))

    def accuracy(self, inputs: np.ndarray, labels: np.ndarray, batch_size: int = 512) -> float:
        """Top-1 accuracy (fraction) of the model in inference mode."""
        return self.evaluate(inputs, labels, batch_size)[1]


@dataclass(frozen=True)
class XlaChoice:
    """Which step variant the run keeps and why.

    Attributes:
        jit_compile: the kept variant uses XLA.
        reason: one sentence for logs and `train.json`.
        steps_per_second: measured steps/s per variant ("xla", "no_xla"), when timed.
        failed_op: the op XLA could not compile, when it failed.
    """

    jit_compile: bool
    reason: str
    steps_per_second: dict[str, float] = field(default_factory=dict)
    failed_op: str | None = None


def describe_xla_failure(error: Exception) -> str:
    """The op (and node) named in an XLA compilation error, else its first line."""
    text = getattr(error, "message", str(error))
    op = re.search(r"on XLA_\w+: (\w+)", text) or re.search(r"No registered '(\w+)' OpKernel", text)
    node = re.search(r"\{\{node ([^}]+)\}\}", text)
    if op:
        return op.group(1) + (f" (node {node.group(1)})" if node else "")
    return text.strip().splitlines()[0][:300]


def _time_steps(steps: StepFunctions, batch, count: int) -> float:
    outputs = steps.train_step(*batch)  # first call: trace (+ XLA compile), not timed
    float(outputs[0])
    started = time.perf_counter()
    for _ in range(count):
        outputs = steps.train_step(*batch)
    float(outputs[0])
    return count / max(1e-9, time.perf_counter() - started)


def choose_step(build, batch, setting, probe_steps: int, state_variables) -> tuple[StepFunctions, XlaChoice]:
    """Build the step the run keeps.

    Args:
        build: `build(jit_compile: bool) -> StepFunctions`.
        batch: one (inputs, labels) batch used for the first call and for timing.
        setting: `True`, `False` or `"auto"` (time `probe_steps` steps each way, keep the faster).
        probe_steps: timed steps per variant.
        state_variables: model and optimizer variables, restored after every probe call so
            probing leaves no trace in training.

    If XLA cannot compile the step, the failure (with the op) is reported once in `reason` and the
    step runs without XLA.
    """
    import tensorflow as tf

    snapshot = [np.array(v.numpy()) for v in state_variables]

    def restore():
        for variable, value in zip(state_variables, snapshot):
            variable.assign(value)

    timings: dict[str, float] = {}
    candidates = {}
    for jit in ((True, False) if setting == "auto" else (bool(setting),)):
        steps = build(jit)
        try:
            timings["xla" if jit else "no_xla"] = _time_steps(steps, batch, probe_steps if setting == "auto" else 0)
            candidates[jit] = steps
        except tf.errors.OpError as err:
            if not jit or type(err).__name__ not in XLA_ERRORS:
                raise
            op = describe_xla_failure(err)
            restore()
            fallback = build(False)
            _time_steps(fallback, batch, 0)
            restore()
            return fallback, XlaChoice(False, f"XLA cannot compile the train step ({op}); running without XLA",
                                       timings, op)
        restore()
    if setting != "auto":
        return candidates[bool(setting)], XlaChoice(bool(setting), f"jit_compile forced to {bool(setting)}")
    faster = timings["xla"] >= timings["no_xla"]
    ratio = max(timings.values()) / max(1e-9, min(timings.values()))
    reason = (f"jit_compile=auto kept {'XLA' if faster else 'no XLA'}: {ratio:.2f}x faster "
              f"(XLA {timings['xla']:.0f} vs no-XLA {timings['no_xla']:.0f} steps/s over {probe_steps} steps)")
    return candidates[faster], XlaChoice(faster, reason, timings)
