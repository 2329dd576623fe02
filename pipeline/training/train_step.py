"""The compiled train step, the K-step block around it, the evaluation pass and the XLA choice.

The step is one `tf.function` with an explicit `input_signature` (`None` batch dimension on one device) and
`reduce_retracing=False`, so it is traced exactly once; the count comes from a Python side effect that only
runs while tracing. It runs under the training strategy (`strategy.run`), scales the loss for
`mixed_float16`, and returns the loss, the task's running figure (`hits`: correct predictions for
classification and binary, the sum of absolute errors for regression), the global norm of the (unscaled)
gradients, a per-variable non-finite flag and the step kind's metrics (`pipeline.training.step_kinds`: what
the step computes is the kind's; measuring and applying is the step's).

`run_steps(iterator, count)` is a second `tf.function` (never XLA: it holds the iterator's get-next) that
runs up to `count` steps in one call, as Keras' `steps_per_execution` does: the step counter, the epoch's
loss and figure sums, the last step's figures, the time spent waiting on the iterator (`tf.timestamp`
around each get-next, summed on the device) and the first non-finite step stay on the device, and the call
returns them packed in one float64 vector, so the host reads one tensor per block (`BLOCK_FIELDS`). A step
whose loss (or, outside `mixed_float16`, a gradient) is not finite ends the block there, and its step
number and per-variable flags are kept for the host to name.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np

XLA_ERRORS = ("InvalidArgumentError", "UnimplementedError", "InternalError", "NotFoundError")
# run_steps' packed result, in order (then one value per step-kind metric).
BLOCK_FIELDS = ("step", "steps_run", "bad_step", "input_wait_s", "loss", "hits", "norm", "sum_loss", "sum_hits",
                "sum_count")


class LoopState:
    """The loop's device-side counters (create under the strategy's scope).

    Attributes:
        step: int64, steps trained (checkpointed).
        sums: float64 [3]: this epoch's sum of loss x batch, sum of hits, records (checkpointed).
        bad_flags: float32 [V]: the first non-finite step's per-variable flags (not checkpointed).
    """

    def __init__(self, variables: int):
        import tensorflow as tf

        self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="step")
        self.sums = tf.Variable(tf.constant([0.0, 0.0, 0.0], tf.float64), trainable=False, name="epoch_sums")
        self.bad_flags = tf.Variable(tf.zeros([max(variables, 1)]), trainable=False, name="nonfinite_flags")


class StepFunctions:
    """The train step (XLA or not), the K-step block and the evaluation function for one model and optimizer.

    Args:
        model: the Keras model (variables created under the strategy's scope).
        optimizer: a built Keras optimizer (LossScaleOptimizer for float16).
        strategy: the tf.distribute strategy.
        jit_compile: compile the step with XLA.
        signature: `input_signature` of the step: [inputs spec (a TensorSpec, or a dict of them for named
            inputs), labels spec [B] (int64 class ids / 0-1, float32 regression targets)] (per-replica specs
            under a distribution strategy).
        eval_spec: spec of one inference batch (a TensorSpec or a dict of them), batch dimension None.
        global_batch: samples per step across replicas (the loss is averaged over it).
        kind: the step kind (`pipeline.training.step_kinds`); default `StandardStep()`.
        task: "classification" | "binary" | "regression" (`core.tasks`): the loss and the running figure.
        state: the `LoopState` `run_steps` updates; None: a private one (probes, benchmarks).
        check_gradients: a non-finite gradient ends the block (off under mixed_float16, whose loss scale
            skips such steps by design; a non-finite loss always ends it).
        time_inputs: time each get-next with `tf.timestamp` (op determinism refuses `tf.timestamp`: off
            under `train.deterministic`, and the input wait is then not measured).
    """

    def __init__(self, model, optimizer, strategy, *, jit_compile: bool, signature, eval_spec, global_batch: int,
                 kind=None, task: str = "classification", state: LoopState | None = None,
                 check_gradients: bool = True, time_inputs: bool = True):
        import tensorflow as tf

        from tfship.pipeline.training.step_kinds import StandardStep, StepContext, task_loss

        self.traces = 0
        self.block_traces = 0
        self.jit_compile = jit_compile
        self.model = model
        self.task = task
        self.kind = kind if kind is not None else StandardStep()
        variables = list(model.trainable_variables)
        self.variable_names = [v.path for v in variables]
        self.sparse_gradients: dict[str, str] = {}  # variable path -> gradient type, recorded while tracing
        scaled_loss = hasattr(optimizer, "dynamic_scale")
        context = StepContext(
            lambda per_example: tf.nn.compute_average_loss(per_example, global_batch_size=global_batch),
            optimizer.scale_loss, strategy.num_replicas_in_sync, task, task_loss(task))

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
            metrics = {name: tf.cast(out.metrics[name], tf.float32) for name in self.kind.metric_names}
            return tf.cast(out.loss, tf.float32), task_hits(task, out.logits, labels), norm, nonfinite, metrics

        @tf.function(input_signature=signature, jit_compile=jit_compile, reduce_retracing=False)
        def train_step(inputs, labels):
            self.traces += 1  # Python side effect: runs only while tracing.
            loss, hits, norm, nonfinite, metrics = strategy.run(replica_step, args=(inputs, labels))
            total, mean = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
            return (strategy.reduce(total, loss, axis=None), strategy.reduce(total, hits, axis=None),
                    strategy.reduce(mean, norm, axis=None), strategy.reduce(total, nonfinite, axis=None),
                    {name: strategy.reduce(mean, value, axis=None) for name, value in metrics.items()})

        @tf.function(input_signature=[eval_spec])
        def predict_logits(inputs):
            return tf.cast(model(inputs, training=False), tf.float32)

        @tf.function(input_signature=signature, reduce_retracing=False)
        def probe_step(inputs, labels):
            # The probes' way in (`choose_step`): called from a graph, as `run_steps` calls it, the XLA step
            # is compiled once for both (an eager call of a jit_compile function compiles a second program).
            return train_step(inputs, labels)

        self.train_step = train_step
        self.probe_step = probe_step
        self.predict_logits = predict_logits
        self.state = state if state is not None else LoopState(len(variables))
        self.run_steps = self._block_function(global_batch, check_gradients, time_inputs)

    def _block_function(self, global_batch: int, check_gradients: bool, time_inputs: bool):
        import tensorflow as tf

        state, names = self.state, tuple(self.kind.metric_names)
        batch = tf.constant(float(global_batch), tf.float64)

        @tf.function
        def run_steps(iterator, count):
            self.block_traces += 1  # Python side effect: runs only while tracing.
            zero = tf.constant(0.0, tf.float32)
            start = (tf.constant(0), tf.constant(0, tf.int64), tf.constant(0.0, tf.float64), zero, zero, zero,
                     tuple(zero for _ in names))

            def more(done, bad, *_):
                return tf.logical_and(done < count, tf.equal(bad, 0))

            def one(done, bad, wait, loss, hits, norm, metrics):
                began = tf.timestamp() if time_inputs else tf.constant(0.0, tf.float64)
                inputs, labels = iterator.get_next()
                fetched = tf.timestamp() if time_inputs else began
                loss, hits, norm, nonfinite, kind = self.train_step(inputs, labels)
                step = state.step.assign_add(1)
                state.sums.assign_add(tf.stack([tf.cast(loss, tf.float64) * batch, tf.cast(hits, tf.float64),
                                                batch]))
                broken = tf.logical_not(tf.math.is_finite(loss))
                if check_gradients:
                    broken = tf.logical_or(broken, tf.reduce_any(nonfinite > 0))
                bad = tf.where(broken, step, bad)
                with tf.control_dependencies([state.bad_flags.assign(tf.where(broken, nonfinite, state.bad_flags))]):
                    done = done + 1
                return (done, bad, wait + (fetched - began), loss, hits, norm, tuple(kind[n] for n in names))

            done, bad, wait, loss, hits, norm, metrics = tf.while_loop(more, one, start)
            sums = tf.unstack(state.sums.read_value())
            packed = [tf.cast(state.step.read_value(), tf.float64), tf.cast(done, tf.float64),
                      tf.cast(bad, tf.float64), wait, *(tf.cast(v, tf.float64) for v in (loss, hits, norm)), *sums,
                      *(tf.cast(m, tf.float64) for m in metrics)]
            return tf.stack(packed)

        return run_steps

    def sparse_update_ops(self) -> list[str]:
        """Scatter op types (`ResourceScatterSub`, ...) in the traced step: the optimizer updated some
        variable row by row. Empty when every update is dense (e.g. global-norm clipping densified it).
        """
        graph = self.train_step.get_concrete_function().graph.as_graph_def()
        nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
        return sorted({node.op for node in nodes if "Scatter" in node.op})

    def outputs(self, inputs) -> np.ndarray:
        """The model's inference outputs float64 [B, ...] for one batch (an array or a dict of arrays)."""
        return np.asarray(self.predict_logits(inputs), np.float64)

    def evaluate(self, inputs, labels: np.ndarray, batch_size: int = 512) -> tuple[float, float]:
        """(mean cross-entropy loss in nats, top-1 accuracy as a fraction) of a classifier in inference mode."""
        figures = self.figures(inputs, labels, batch_size)
        return figures["loss"], figures.get("accuracy", float("nan"))

    def figures(self, inputs, labels: np.ndarray, batch_size: int = 512) -> dict[str, float]:
        """`task_figures` of the model on in-memory rows (an array or a dict of arrays), in batches."""
        parts = []
        for start in range(0, len(labels), batch_size):
            rows = slice(start, start + batch_size)
            batch = {k: v[rows] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[rows]
            parts.append(self.outputs(batch))
        outputs = np.concatenate(parts) if parts else np.zeros((0, 1))
        return task_figures(self.task, outputs, np.asarray(labels))

    def accuracy(self, inputs, labels: np.ndarray, batch_size: int = 512) -> float:
        """Top-1 accuracy (fraction) of the model in inference mode."""
        return self.evaluate(inputs, labels, batch_size)[1]


def task_hits(task: str, outputs, labels):
    """The step's running figure (float32 scalar): correct predictions for classification (argmax of logits
    [B, C]) and binary (probability [B, 1] above 0.5), the sum of absolute errors for regression.
    """
    import tensorflow as tf

    outputs = tf.cast(outputs, tf.float32)
    if task == "classification":
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(outputs, axis=-1), tf.cast(labels, tf.int64)), tf.float32))
    column = tf.reshape(outputs, tf.shape(labels))
    if task == "binary":
        return tf.reduce_sum(tf.cast(tf.equal(tf.cast(column > 0.5, tf.int64), tf.cast(labels, tf.int64)),
                                     tf.float32))
    return tf.reduce_sum(tf.abs(column - tf.cast(labels, tf.float32)))


def task_figures(task: str, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every figure of `task` (`core.tasks.task_metrics`) plus `loss`, the step's own loss in inference mode:
    classification cross-entropy (nats), binary cross-entropy of the probability (nats), regression squared
    error (label units squared).

    Raises:
        ValueError: no rows, or outputs that do not fit the task (`core.tasks.task_metrics`).
    """
    from tfship.core.tasks import task_metrics

    if len(labels) == 0:
        raise ValueError("no rows to evaluate on")
    figures = task_metrics(task, outputs, labels)
    if task == "binary":
        p = np.clip(outputs.reshape(-1), 1e-7, 1 - 1e-7)
        y = labels.reshape(-1).astype(np.float64)
        figures["loss"] = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return figures


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
    outputs = steps.probe_step(*batch)  # first call: trace (+ XLA compile), not timed
    float(outputs[0])
    started = time.perf_counter()
    for _ in range(count):
        outputs = steps.probe_step(*batch)
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
        return candidates[bool(setting)], XlaChoice(
            bool(setting), f"XLA {'on' if setting else 'off'}: train.jit_compile = {str(bool(setting)).lower()}")
    faster = timings["xla"] >= timings["no_xla"]
    kept, other = ("xla", "no_xla") if faster else ("no_xla", "xla")
    ratio = timings[kept] / max(1e-9, timings[other])
    reason = (f"train.jit_compile = auto: {'with' if faster else 'without'} XLA, the faster of the two over "
              f"{probe_steps} timed steps ({timings[kept]:.0f} against {timings[other]:.0f} steps/s, {ratio:.2f}x)")
    return candidates[faster], XlaChoice(faster, reason, timings)
