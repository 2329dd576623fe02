"""TensorFlow's GPU memory share for the SavedModel backend (TF Serving's --per_process_gpu_memory_fraction).

TF Serving puts the fraction in the session's `GPUOptions.per_process_gpu_memory_fraction`. TensorFlow 2
runs one eager context per process whose GPU options are fixed when it first touches a GPU, so the fraction
goes into that context's config before then: each GPU's allocator may then take at most that share of the
GPU's memory, and a model needing more fails to load or answers RESOURCE_EXHAUSTED, as in TF Serving.
Without a GPU the option is inert (nothing is allocated on a GPU); it is logged once.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)
_lock = threading.Lock()
_applied: list[float] = []  # the fraction set in this process (at most one)


def apply_gpu_memory_fraction(fraction: float) -> bool:
    """Give TensorFlow at most `fraction` (0 < fraction <= 1) of each GPU's memory; 0 leaves TensorFlow's default.

    Returns True when the option is in force for this process (set now or earlier with the same value),
    False when inert: no GPU, or TensorFlow had already set up its GPUs (a warning names why).

    Raises:
        ValueError: `fraction` outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"per_process_gpu_memory_fraction must be in (0, 1] (0 = TensorFlow's default), got "
                         f"{fraction}")
    if fraction == 0.0:
        return False
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    with _lock:
        if _applied:
            return _applied[0] == fraction
        if not tf.config.list_physical_devices("GPU"):  # discovers devices without initialising the context
            log.info("--per_process_gpu_memory_fraction %s: no GPU visible to TensorFlow; the option is inert",
                     fraction)
            return False
        ctx = context.context()
        if ctx._context_handle is not None:  # TensorFlow's only hook before GPU set-up
            log.warning("--per_process_gpu_memory_fraction %s not applied: TensorFlow already set up its GPUs",
                        fraction)
            return False
        config = config_pb2.ConfigProto()
        if ctx._config is not None:
            config.CopyFrom(ctx._config)
        config.gpu_options.per_process_gpu_memory_fraction = fraction
        ctx._config = config
        _applied.append(fraction)
        log.info("TensorFlow may take %.0f%% of each GPU's memory (--per_process_gpu_memory_fraction)",
                 fraction * 100)
        return True
