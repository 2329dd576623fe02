"""Serve-check stage: our own gRPC server must load the candidate version and answer correctly.

A real server process is started on a free loopback port over a private candidate repository,
made ready by `grpc.health.v1` (never by sleeping), sent real `PredictRequest`s with held-out
inputs, and its answers are compared by output name with the SavedModel's. Only then is the
version published (TFX's "blessed" model).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import StageError

SERVE_CHECK_BACKENDS = ("saved_model", "onnx", "tflite")


@dataclass(frozen=True)
class ServeCheckResult:
    """Per backend: requests sent, max abs error against the SavedModel's outputs, seconds taken."""

    backends: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"passed": True, "backends": self.backends}


def _compare(backend: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray], atol: float) -> float:
    worst = 0.0
    for name, expected in want.items():
        if name not in got:
            raise StageError(f"serve-check [{backend}]: output '{name}' missing from the response; got {sorted(got)}")
        value = np.asarray(got[name])
        if value.shape != expected.shape:
            raise StageError(f"serve-check [{backend}]: output '{name}' shape {list(value.shape)}, "
                             f"expected {list(expected.shape)}")
        if np.issubdtype(expected.dtype, np.floating):
            error = float(np.max(np.abs(value.astype(np.float64) - expected))) if value.size else 0.0
            if not error <= atol:
                raise StageError(f"serve-check [{backend}]: output '{name}' differs from the SavedModel's by "
                                 f"{error:.3g} (tolerance {atol:g})")
            worst = max(worst, error)
        elif not np.array_equal(value, expected):
            raise StageError(f"serve-check [{backend}]: output '{name}' differs from the SavedModel's "
                             f"({int(np.sum(value != expected))} of {value.size} values)")
    return worst


def serve_check(repository: Path, model_name: str, version: int, inputs: dict[str, np.ndarray],
                expected: dict[str, np.ndarray], backends: tuple[str, ...] = SERVE_CHECK_BACKENDS,
                atol: float = 1e-5, batch_sizes: tuple[int, ...] = (1, 7, 32)) -> ServeCheckResult:
    """Serve `repository/model_name/version` with each backend and check real Predict answers.

    Args:
        inputs: {input name: [N, ...]} held-out inputs; expected: the SavedModel's outputs on them.
        atol: absolute tolerance for float outputs (float32 artifacts; integers must be equal).

    Raises:
        StageError: the server did not become SERVING, an RPC failed, metadata disagrees, or an answer
            differs from the SavedModel's.
    """
    from serving.client import PredictClient
    from serving.launcher import ServerProcess

    results: dict[str, dict[str, Any]] = {}
    for backend in backends:
        started = time.perf_counter()
        try:
            with ServerProcess(repository, model_name, backend=backend) as server:
                client = PredictClient(server.grpc_target)
                try:
                    worst, requests, offset = 0.0, 0, 0
                    for batch_size in batch_sizes:
                        batch = {k: v[offset:offset + batch_size] for k, v in inputs.items()}
                        want = {k: v[offset:offset + batch_size] for k, v in expected.items()}
                        offset += batch_size
                        got = client.predict(model_name, batch, version=version)
                        worst = max(worst, _compare(backend, got, want, atol))
                        requests += 1
                finally:
                    client.close()
        except StageError:
            raise
        except Exception as err:
            raise StageError(f"serve-check [{backend}]: {type(err).__name__}: {err}") from err
        results[backend] = {"requests": requests, "max_abs_error": worst,
                            "seconds": round(time.perf_counter() - started, 2)}
    return ServeCheckResult(results)
