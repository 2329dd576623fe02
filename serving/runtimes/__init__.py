"""Backends behind one interface, registered by name in `REGISTRY` (order = `auto`'s preference)."""

from tfship.serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, RuntimeRegistry
from tfship.serving.runtimes.onnx import OnnxRuntime
from tfship.serving.runtimes.saved_model import SavedModelRuntime
from tfship.serving.runtimes.tflite import TfliteRuntime

REGISTRY = RuntimeRegistry()
REGISTRY.register(SavedModelRuntime.name, SavedModelRuntime)
REGISTRY.register(OnnxRuntime.name, OnnxRuntime)
REGISTRY.register(TfliteRuntime.name, TfliteRuntime)


def backend_names() -> tuple[str, ...]:
    """`auto` and every registered backend, in registration order.

    Read when asked: tests and the benchmark register more (e.g. `bench.serve.identity`).
    """
    return ("auto", *REGISTRY.names())


__all__ = ["REGISTRY", "Runtime", "RuntimeLoadError", "RuntimeOptions", "RuntimeRegistry", "backend_names"]
