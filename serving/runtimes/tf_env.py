"""TensorFlow settings the model server makes before TensorFlow is imported.

oneDNN kernels (on by default in TensorFlow's x86 CPU builds) abort the whole process on malformed inputs that
TensorFlow's own kernels refuse with InvalidArgument: a rank-2 tensor fed to a Conv2D ends the process with
`Check failed: index >= 0 && index < num_total_dims` (MklDnnConvUtil::GetInputSizeInMklOrder), where the
standard kernel answers "convolution input must be 4-dimensional". The SavedModel backend follows TF Serving
and lets the model judge a request's shape (TF Serving's suite sends a [3] tensor into half_plus_two's [-1, 1]
input and expects an answer), so without this one client's malformed request would take the server, and every
other client's requests, down. The server therefore runs TensorFlow without oneDNN (`TF_ENABLE_ONEDNN_OPTS=0`)
unless the environment sets the variable; an explicit `TF_ENABLE_ONEDNN_OPTS=1` is honoured with a warning.
The cost is speed on some CPU kernels (`make bench-serve` measures the served latency); answers are the same
within float rounding.
"""

from __future__ import annotations

import logging
import os
import sys

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"


def apply_tensorflow_env_defaults(log: logging.Logger) -> None:
    """Set `TF_ENABLE_ONEDNN_OPTS=0` unless the environment names it (module docstring); warn when it turns
    oneDNN on, or when TensorFlow was imported before this call (then the setting cannot act). Raises nothing.
    """
    value = os.environ.setdefault(ONEDNN, "0")
    if "tensorflow" in sys.modules:
        log.warning("TensorFlow was imported before the server set %s=%s: the setting has no effect", ONEDNN, value)
    elif value.strip().lower() not in ("0", "false", "off"):
        log.warning("%s=%s: oneDNN kernels abort the server on some malformed inputs (a rank-2 tensor into a "
                    "convolution) instead of answering INVALID_ARGUMENT; unset it to have them refused", ONEDNN, value)
