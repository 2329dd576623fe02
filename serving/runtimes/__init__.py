"""Backends behind one interface, registered by name in `REGISTRY` (order = `auto`'s preference)."""

from serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, RuntimeRegistry
from serving.runtimes.identity import IdentityRuntime
from serving.runtimes.onnx import OnnxRuntime
from serving.runtimes.saved_model import SavedModelRuntime
from serving.runtimes.tflite import TfliteRuntime

REGISTRY = RuntimeRegistry()
REGISTRY.register(SavedModelRuntime.name, SavedModelRuntime)
REGISTRY.register(OnnxRuntime.name, OnnxRuntime)
REGISTRY.register(TfliteRuntime.name, TfliteRuntime)
REGISTRY.register(IdentityRuntime.name, IdentityRuntime)  # last: `auto` picks it only without a real artifact

BACKENDS = ("auto", *REGISTRY.names())

__all__ = ["BACKENDS", "REGISTRY", "Runtime", "RuntimeLoadError", "RuntimeOptions", "RuntimeRegistry"]
