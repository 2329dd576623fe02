"""Debug switches of the training loop (`[train]`; costs in docs/training.md "Debugging").

* `assert_inputs`: `tf.debugging.assert_*` on every training batch inside the tf.data pipeline.
* `check_numerics`: `tf.debugging.enable_check_numerics()` (switched on and off by
  `pipeline.distribute.training_runtime`); `numerics_error` turns TensorFlow's report into a
  `StageError` naming the first op that produced NaN or Inf and where it was created.
* `run_eagerly`: `tf.config.run_functions_eagerly(True)` (also in `training_runtime`).
"""

from __future__ import annotations

import re

from pipeline.errors import StageError


def input_assertions(num_classes: int, example_shape: tuple[int, ...]):
    """A `dataset.map` function checking one (inputs [B, ...], labels int64 [B]) batch.

    Asserts: float inputs finite; inputs of rank 1 + len(example_shape) with that example shape;
    labels in [0, num_classes). A failing assertion raises `InvalidArgumentError` naming the check.
    """
    import tensorflow as tf

    def check(inputs, labels):
        checks = [
            tf.debugging.assert_rank(inputs, 1 + len(example_shape), message="assert_inputs: input rank"),
            tf.debugging.assert_equal(tf.shape(inputs)[1:], tf.constant(example_shape, tf.int32),
                                      message="assert_inputs: input example shape"),
            tf.debugging.assert_non_negative(labels, message="assert_inputs: label below 0"),
            tf.debugging.assert_less(labels, tf.constant(num_classes, labels.dtype),
                                     message=f"assert_inputs: label not below {num_classes} classes"),
        ]
        if inputs.dtype.is_floating:
            checks.append(tf.debugging.assert_all_finite(inputs, "assert_inputs: NaN or Inf in the inputs"))
        with tf.control_dependencies(checks):
            return tf.identity(inputs), tf.identity(labels)

    return check


def numerics_error(err: Exception, step: int) -> StageError:
    """A `StageError` from check-numerics' InvalidArgumentError: the op, its type and creation stack."""
    text = getattr(err, "message", str(err))
    op = re.search(r'Detected Infinity or NaN in output (\d+) of (?:graph|eagerly-executing) op "([^"]+)"', text)
    kind = re.search(r"\(# of outputs: \d+\) !!!\s*\n\s*dtype: (\w+)", text)
    stack = re.search(r"Stack trace of op's creation:\s*\n(.*?)(?:\n\s*\n|$)", text, re.S)
    where = " | ".join(line.strip() for line in stack.group(1).strip().splitlines()[-6:]) if stack else ""
    if op is None:
        return StageError(f"train: check_numerics stopped step {step}: {text.strip().splitlines()[0][:400]}")
    return StageError(f"train: check_numerics: op {op.group(2)!r} produced NaN or Inf (output {op.group(1)}"
                      f"{', ' + kind.group(1) if kind else ''}) at step {step}; created at: {where}")
