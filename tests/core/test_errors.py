"""The one error table: every kind's gRPC code, HTTP status (TF Serving's REST mapping) and CLI exit code."""

from __future__ import annotations

import pytest

from tfship.core import errors

# kind -> (gRPC code, HTTP status); TF Serving's http_server.cc maps FAILED_PRECONDITION to 400.
EXPECTED = {
    "TfshipError": ("INTERNAL", 500), "ConfigError": ("INVALID_ARGUMENT", 400),
    "DatasetError": ("INVALID_ARGUMENT", 400), "StageError": ("INTERNAL", 500), "AuditError": ("INTERNAL", 500),
    "ContractError": ("INTERNAL", 500), "ParityError": ("INTERNAL", 500), "ConversionError": ("INTERNAL", 500),
    "InvalidRequestError": ("INVALID_ARGUMENT", 400), "ModelNotFoundError": ("NOT_FOUND", 404),
    "FailedPreconditionError": ("FAILED_PRECONDITION", 400), "UnavailableError": ("UNAVAILABLE", 503),
    "ResourceExhaustedError": ("RESOURCE_EXHAUSTED", 429), "DeadlineExceededError": ("DEADLINE_EXCEEDED", 504),
    "UnauthenticatedError": ("UNAUTHENTICATED", 401),
    "PermissionDeniedError": ("PERMISSION_DENIED", 403), "UnimplementedError": ("UNIMPLEMENTED", 501),
    "RequestTimeoutError": ("DEADLINE_EXCEEDED", 408),  # a slow client: its own HTTP status
    "OpPolicyError": ("INTERNAL", 500),  # an AuditError: the export refused; the server wraps it in a load error
    "ModelError": ("UNKNOWN", 500),  # without the model's own code (each instance carries one)
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_kind_has_one_status_on_every_surface(kind):
    error = getattr(errors, kind)("boom")
    assert (error.grpc_code, error.http_status) == EXPECTED[kind]
    assert error.exit_code == errors.CLI_EXIT_CODE == 2


def test_every_error_class_in_core_is_in_the_expectations():
    kinds = {name for name, value in vars(errors).items()
             if isinstance(value, type) and issubclass(value, errors.TfshipError)}
    assert kinds == set(EXPECTED)


def test_errors_defined_above_core_follow_their_base():
    from tfship.deploy.engine import DeployError
    from tfship.serving.launcher import ServerStartError
    from tfship.serving.runtimes.base import RuntimeLoadError

    # RuntimeLoadError was FAILED_PRECONDITION over gRPC but 500 over REST before the table.
    assert (RuntimeLoadError("x").grpc_code, RuntimeLoadError("x").http_status) == ("FAILED_PRECONDITION", 400)
    assert (DeployError("x").grpc_code, DeployError("x").http_status) == ("FAILED_PRECONDITION", 400)
    assert (ServerStartError("x").grpc_code, ServerStartError("x").http_status) == ("UNAVAILABLE", 503)


def test_a_remote_status_is_carried_as_received():
    import grpc

    from tfship.serving.tfs.client import RemoteError

    error = RemoteError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    assert (error.grpc_code, error.http_status, error.details) == ("RESOURCE_EXHAUSTED", 429, "queue full")


def test_http_status_follows_tf_serving_for_every_grpc_code():
    import grpc

    assert set(errors.HTTP_STATUS_OF_GRPC_CODE) == {code.name for code in grpc.StatusCode}


def test_every_cli_reports_an_error_the_same_way(tmp_path):
    import subprocess
    import sys

    from tfship.pipeline.cli import main as tfship

    assert errors.cli_error("tfship run", errors.ConfigError("bad key")) == ("tfship run: ConfigError: bad key", 2)
    assert tfship(["inspect", str(tmp_path / "missing")]) == 2
    done = subprocess.run([sys.executable, "-m", "tfship.serving", "query", "--target", "127.0.0.1:1"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2 and done.stderr.startswith("python -m tfship.serving query: ConfigError: query: give --samples")


@pytest.mark.parametrize(("code", "http"), [("NOT_FOUND", 404), ("FAILED_PRECONDITION", 400), ("OUT_OF_RANGE", 400),
                                            ("RESOURCE_EXHAUSTED", 429), ("UNIMPLEMENTED", 501),
                                            ("PERMISSION_DENIED", 403), ("ABORTED", 409), ("DATA_LOSS", 500),
                                            ("OK", 500), ("NO_SUCH_CODE", 500)])
def test_an_error_inside_the_model_answers_its_own_code(code, http):
    error = errors.ModelError("the model failed", code)
    assert (error.grpc_code, error.http_status) == (code if http != 500 or code == "DATA_LOSS" else "UNKNOWN", http)


def test_tensorflow_error_numbers_are_grpc_code_numbers():
    import grpc

    assert errors.GRPC_CODE_NAMES == tuple(c.name for c in sorted(grpc.StatusCode, key=lambda c: c.value[0]))
