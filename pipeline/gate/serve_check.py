"""Serve-check stage: our own gRPC server must load every candidate artifact and answer correctly.

For each artifact that passed the parity gate (the SavedModel, ONNX and every TFLite file: float32,
float16, dynamic-range, int8), a real server process is started on a free loopback port over the private
candidate repository with the backend and flags that serve that file (`--backend tflite --tflite-file
model_int8.tflite`), made ready by `grpc.health.v1` (never by sleeping), sent real `PredictRequest`s with
held-out inputs at several batch sizes, and its answers (all requests together) are compared by output name,
by the one comparison (`pipeline.gate.compare.compare_outputs`) at the float32 tolerance, with what the gate
proved: the SavedModel's outputs for the SavedModel, and for every other artifact its own outputs computed in
process by the same runtime at the same request sizes (validate already bounded those against the
SavedModel's at the artifact's mode's tolerance). The SavedModel's other signatures (TF Serving serves every
one) are asked on the same server, each against its own in-process answers (`SignatureProbe`). Only then
is an artifact published (TFX's "blessed" model). An artifact whose check fails is left out with its
reason; the stage fails only when the SavedModel or a required artifact fails. The SavedModel's server
(slowest to start: it imports TensorFlow) runs beside the others, two servers at a time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.errors import StageError
from tfship.pipeline.conversion.artifacts import SAVED_MODEL
from tfship.pipeline.gate.compare import Tolerance, compare_outputs, failures

# Seconds one serve-check call may take. The check judges answers, not speed: a large model's first call on a
# busy machine (graph optimisation, a 224x224 batch of 64 through ConvNeXt under load) went past the client's
# 30 s default and failed a whole run with DEADLINE_EXCEEDED. Latency is `make bench-serve`'s business.
CALL_DEADLINE_S = 600.0


@dataclass(frozen=True)
class SignatureProbe:
    """Another signature of the served artifact to ask: its name, the inputs ({name: [N, ...]}), the answers
    expected on them (the artifact's own, in process, request by request at the check's batch sizes) and the
    SavedModel's own largest difference per float output on that signature (allowed on top, as on
    `serving_default`; the validate record's `ParityReport.signature_noise`).
    """

    name: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    noise: dict[str, float] | None = None


@dataclass(frozen=True)
class ServeTarget:
    """One artifact to serve: its name, the serving backend, its tolerance, extra `serve` flags, and the
    answers expected (the artifact's own, computed in process by the runtime the gate proved it with, at the
    same request sizes; None: the SavedModel's).
    """

    artifact: str
    backend: str
    tolerance: Tolerance
    serve_flags: tuple[str, ...] = ()
    expected: dict[str, np.ndarray] | None = None  # its own answers in process; None: the SavedModel's
    probes: tuple[SignatureProbe, ...] = ()
    noise: dict[str, float] | None = None  # the SavedModel's own largest difference per float output (parity.json)


@dataclass(frozen=True)
class SignatureAnswer:
    """One other signature asked on an artifact's server: its verdict, why not passed ("" when passed) and the
    Predict requests sent.
    """

    passed: bool
    reason: str = ""
    requests: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "requests": self.requests}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> SignatureAnswer:
        """Inverse of `to_json` (raises KeyError, TypeError on a row that is not one)."""
        return cls(bool(row["passed"]), str(row.get("reason", "")), int(row.get("requests", 0)))


@dataclass(frozen=True)
class ServeCheckRow:
    """One artifact served by our server: the backend and flags it ran with, its verdict and why not passed,
    the requests sent, the largest absolute difference from the expected answers (output units), the seconds
    taken, and each other signature asked on it (`SignatureAnswer` by name).
    """

    passed: bool
    reason: str = ""
    backend: str = ""
    flags: tuple[str, ...] = ()
    requests: int = 0
    max_abs_error: float = 0.0
    seconds: float = 0.0
    signatures: dict[str, SignatureAnswer] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "flags": list(self.flags), "passed": self.passed, "reason": self.reason,
                "requests": self.requests, "max_abs_error": self.max_abs_error, "seconds": self.seconds,
                "signatures": {name: answer.to_json() for name, answer in self.signatures.items()}}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> ServeCheckRow:
        """Inverse of `to_json`; fields a record did not write take their defaults (raises KeyError, TypeError
        on a row without `passed`).
        """
        return cls(bool(row["passed"]), str(row.get("reason", "")), str(row.get("backend", "")),
                   tuple(row.get("flags", ())), int(row.get("requests", 0)), float(row.get("max_abs_error", 0.0)),
                   float(row.get("seconds", 0.0)),
                   {name: SignatureAnswer.from_json(answer) for name, answer in row.get("signatures", {}).items()})


@dataclass(frozen=True)
class ServeCheckResult:
    """Per artifact, its `ServeCheckRow` (rows given as `to_json` dicts are read into one).

    required: artifacts whose failure fails the stage (`convert.required`; the SavedModel always);
    signatures_unchecked: {artifact: {signature: why it was not asked}}.

    `to_json` is the serve-check stage's record (`serve_check.json`); `from_json` reads it back.
    """

    artifacts: dict[str, ServeCheckRow]
    required: tuple[str, ...] = ()
    signatures_unchecked: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifacts", {name: row if isinstance(row, ServeCheckRow)
                                               else ServeCheckRow.from_json(row)
                                               for name, row in self.artifacts.items()})

    def verdict(self, artifact: str) -> tuple[bool, str] | None:
        """(passed, reason) of `artifact`'s check, or None when it was not served."""
        row = self.artifacts.get(artifact)
        return None if row is None else (row.passed, row.reason)

    def signature_verdict(self, artifact: str, signature: str) -> tuple[bool, str] | None:
        """(passed, reason) of `signature` asked on `artifact`'s server, or None when it was not asked."""
        row = self.artifacts.get(artifact)
        answer = row.signatures.get(signature) if row is not None else None
        return None if answer is None else (answer.passed, answer.reason)

    @property
    def passed(self) -> bool:
        """The SavedModel and every required artifact answered correctly."""
        return all(row.passed for name, row in self.artifacts.items()
                   if name == SAVED_MODEL or name in self.required)

    @property
    def left_out(self) -> dict[str, str]:
        """{artifact: reason} for every artifact whose check failed."""
        return {name: row.reason for name, row in self.artifacts.items() if not row.passed}

    @property
    def served(self) -> list[str]:
        """Artifacts that answered correctly."""
        return [name for name, row in self.artifacts.items() if row.passed]

    def with_unchecked(self, unchecked: dict[str, dict[str, str]]) -> ServeCheckResult:
        """This result with the signatures that were not asked, and why."""
        return replace(self, signatures_unchecked=unchecked)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "left_out": self.left_out, "required": list(self.required),
                "artifacts": {name: row.to_json() for name, row in self.artifacts.items()},
                "signatures_unchecked": self.signatures_unchecked}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> ServeCheckResult:
        """Inverse of `to_json` (`serve_check.json`). A record written before `required` was recorded keeps its
        verdict: its failed artifacts count as required when it did not pass.

        Raises:
            KeyError, TypeError: `payload` is not a serve-check record.
        """
        required = payload.get("required")
        if required is None:
            required = () if payload["passed"] else tuple(payload.get("left_out", {}))
        return cls({name: ServeCheckRow.from_json(row) for name, row in payload["artifacts"].items()},
                   tuple(required), dict(payload.get("signatures_unchecked", {})))


def _check_one(repository: Path, model_name: str, version: int, target: ServeTarget, inputs: dict[str, np.ndarray],
               expected: dict[str, np.ndarray], batch_sizes: tuple[int, ...]) -> ServeCheckRow:
    from tfship.serving.launcher import ServerProcess
    from tfship.serving.tfs.client import PredictClient

    started = time.perf_counter()
    worst, problems, answers, offset = 0.0, [], [], 0
    signatures: dict[str, SignatureAnswer] = {}
    try:
        with ServerProcess(repository, model_name, backend=target.backend, extra_args=target.serve_flags) as server:
            with PredictClient(server.grpc_target, timeout_s=CALL_DEADLINE_S) as client:
                for batch_size in batch_sizes:
                    batch = {k: v[offset:offset + batch_size] for k, v in inputs.items()}
                    offset += batch_size
                    answers.append(client.predict(model_name, batch, version=version))
                for probe in target.probes:
                    signatures[probe.name] = _probe(client, model_name, version, probe, target.tolerance,
                                                    batch_sizes)
        got = {name: np.concatenate([np.asarray(a[name]) for a in answers]) for name in answers[0]}
        want = target.expected if target.expected is not None else expected
        rows = compare_outputs(got, {k: np.asarray(v)[:offset] for k, v in want.items()}, target.tolerance,
                               noise=target.noise)
        problems += failures(rows)
        worst = max([worst, *(r.max_abs_error for r in rows if not r.exact)])
    except Exception as err:  # noqa: BLE001 - any server or RPC failure is this artifact's verdict, with its cause
        problems.append(f"{type(err).__name__}: {err}")
    problems += [f"signature '{name}': {row.reason}" for name, row in signatures.items() if not row.passed]
    requests = len(answers)
    served = " ".join((target.backend, *target.serve_flags))
    return ServeCheckRow(not problems, f"serve-check [{served}]: {'; '.join(problems)}" if problems else "",
                         target.backend, tuple(target.serve_flags), requests, worst,
                         round(time.perf_counter() - started, 2), signatures)


def _probe(client, model_name: str, version: int, probe: SignatureProbe, tolerance: Tolerance,
           batch_sizes: tuple[int, ...]) -> SignatureAnswer:
    """Ask signature `probe.name` at each batch size and compare with its in-process answers."""
    answers, offset = [], 0
    try:
        for batch_size in batch_sizes:
            batch = {k: v[offset:offset + batch_size] for k, v in probe.inputs.items()}
            offset += batch_size
            answers.append(client.predict(model_name, batch, signature_name=probe.name, version=version))
        got = {name: np.concatenate([np.asarray(a[name]) for a in answers]) for name in answers[0]}
        problems = failures(compare_outputs(got, {k: np.asarray(v)[:offset] for k, v in probe.expected.items()},
                                            tolerance, noise=probe.noise))
    except Exception as err:  # noqa: BLE001 - an RPC failure is this signature's verdict, with its cause
        problems = [f"{type(err).__name__}: {err}"]
    return SignatureAnswer(not problems, "; ".join(problems), len(answers))


def serve_check(repository: Path, model_name: str, version: int, inputs: dict[str, np.ndarray],
                expected: dict[str, np.ndarray], targets: list[ServeTarget], required: tuple[str, ...] = (),
                batch_sizes: tuple[int, ...] = (1, 7, 32)) -> ServeCheckResult:
    """Serve `repository/model_name/version` once per target and check real Predict answers.

    Args:
        inputs: {input name: [N, ...]} held-out inputs; expected: the SavedModel's outputs on them.
        targets: the artifacts to serve (the SavedModel first).
        required: artifacts whose failure fails the stage.

    Returns:
        Every artifact's verdict (call `raise_if_failed` to gate on it).
    """
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {t.artifact: pool.submit(_check_one, repository, model_name, version, t, inputs, expected,
                                           batch_sizes) for t in targets}
        return ServeCheckResult({name: future.result() for name, future in futures.items()}, tuple(required))


def raise_if_failed(result: ServeCheckResult) -> ServeCheckResult:
    """Return `result` when the SavedModel and every required artifact passed.

    Raises:
        StageError: naming each failing required artifact and why.
    """
    if not result.passed:
        failed = {name: reason for name, reason in result.left_out.items()
                  if name == SAVED_MODEL or name in result.required}
        raise StageError("serve-check failed: " + " | ".join(f"{name}: {reason}" for name, reason in failed.items()))
    return result
