"""Debug switches of the training loop (`[train]`; costs in docs/training.md "Debugging").

* `assert_inputs`: `tf.debugging.assert_*` on every training batch inside the tf.data pipeline.
* `check_numerics`: `tf.debugging.enable_check_numerics()` while the train step is traced
  (`numerics_checked_tracing`): the traced graph keeps a CheckNumerics op after every float op, and the
  loop's own eager work (checkpoints hold NaN sentinels by design) stays unchecked; `numerics_guard`
  turns TensorFlow's report into a `StageError` naming the first op that produced NaN or Inf and where
  it was created.
* `run_eagerly`: `tf.config.run_functions_eagerly(True)` (also in `training_runtime`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from tfship.core.errors import StageError


def input_assertions(task: str, num_classes: int, element_spec):
    """A `dataset.map` function checking one (inputs, labels) batch of a training dataset.

    Args:
        task: "classification" | "binary" | "regression" (`core.tasks`).
        num_classes: classification: labels lie in [0, num_classes).
        element_spec: the dataset's (inputs spec, labels spec); inputs one TensorSpec or a dict of them.

    Asserts, per input: float values finite; rank and per-example shape as the spec's (a named input is named
    in the message). Labels: classification in [0, num_classes), binary 0 or 1, regression finite. A failing
    assertion raises `InvalidArgumentError` naming the check.
    """
    import tensorflow as tf

    input_spec = element_spec[0]

    def checked(name: str, value, spec) -> list:
        where = f" of input {name!r}" if name else ""
        shape = [int(d) if d is not None else -1 for d in spec.shape[1:]]
        checks = [tf.debugging.assert_rank(value, len(spec.shape), message=f"assert_inputs: input rank{where}")]
        if shape and -1 not in shape:
            checks.append(tf.debugging.assert_equal(tf.shape(value)[1:], tf.constant(shape, tf.int32),
                                                    message=f"assert_inputs: input example shape{where}"))
        if value.dtype.is_floating:
            # Assert, not assert_all_finite: its CheckNumerics op is stateful and would stop the data
            # iterator from being checkpointed.
            checks.append(tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(value)),
                                              [f"assert_inputs: NaN or Inf in the inputs{where}"]))
        return checks

    def label_checks(labels) -> list:
        if task == "regression":
            return [tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(labels)),
                                        ["assert_inputs: NaN or Inf in the regression labels"])]
        top = num_classes if task == "classification" else 2
        below = f"label not below {num_classes} classes" if task == "classification" else "binary label not 0 or 1"
        return [tf.debugging.assert_non_negative(labels, message="assert_inputs: label below 0"),
                tf.debugging.assert_less(labels, tf.constant(top, labels.dtype), message=f"assert_inputs: {below}")]

    def check(inputs, labels):
        if isinstance(inputs, dict):
            checks = [c for name in sorted(inputs) for c in checked(name, inputs[name], input_spec[name])]
        else:
            checks = checked("", inputs, input_spec)
        with tf.control_dependencies([*checks, *label_checks(labels)]):
            return tf.nest.map_structure(tf.identity, inputs), tf.identity(labels)

    return check


def _creation_site(text: str) -> str:
    """The op's creation frames from check-numerics' report: the inferred user frame first ("->"),
    then the last frames outside TensorFlow's own files.
    """
    match = re.search(r"Stack trace of op's creation.*?:\s*\n(.*?)(?:\n\s*:|\Z)", text, re.S)
    if not match:
        return ""
    lines = [line.strip() for line in match.group(1).splitlines() if line.strip()]
    frames = [line.lstrip("+ ").strip() for line in lines if line.startswith("+")]
    user = [lines[i - 1].lstrip("+ ").strip() for i, line in enumerate(lines) if line.startswith("->") and i > 0]
    ours = [f for f in frames if "site-packages/tensorflow" not in f and "site-packages/keras" not in f]
    return "; ".join(dict.fromkeys([*user, *ours[-4:]]))


def numerics_error(err: Exception, step: int) -> StageError:
    """A `StageError` from check-numerics' InvalidArgumentError: the op, its dtype and where it was created."""
    text = getattr(err, "message", str(err))
    op = re.search(r'Detected Infinity or NaN in output (\d+) of (?:graph|eagerly-executing) op "([^"]+)"', text)
    if op is None:
        return StageError(f"train: check_numerics stopped step {step}: {text.strip().splitlines()[0][:400]}")
    values = re.search(r"Tensor had ([^\n]+?) values", text)
    return StageError(f"train: check_numerics: op {op.group(2)!r} produced NaN or Inf "
                      f"({values.group(1) + ' values, ' if values else ''}output {op.group(1)}) at step {step}; "
                      f"created at: {_creation_site(text)}")


@contextlib.contextmanager
def numerics_guard(enabled: bool, step: int) -> Iterator[None]:
    """Turn check-numerics' InvalidArgumentError into `numerics_error` when `enabled`."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.InvalidArgumentError as err:
        if not enabled or "CheckNumerics" not in getattr(err, "message", str(err)):
            raise
        raise numerics_error(err, step) from err


@contextlib.contextmanager
def numerics_checked_tracing(enabled: bool) -> Iterator[None]:
    """`tf.debugging.enable_check_numerics()` for the duration (functions traced inside keep the checks),
    disabled again on exit.
    """
    import tensorflow as tf

    if enabled:
        tf.debugging.enable_check_numerics()
    try:
        yield
    finally:
        if enabled:
            tf.debugging.disable_check_numerics()
