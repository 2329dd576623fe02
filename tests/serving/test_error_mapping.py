"""One test per error mapping: the `rpc` decorator turns each TfshipError kind into its gRPC status.

A real in-process `grpc.aio` server on a free port serves a tiny servicer whose one method raises the
error named in the request; unexpected exceptions become INTERNAL with a generic message.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tfship.core import errors
from tfship.serving.grpc_calls import rpc

KINDS = {
    "InvalidRequestError": "INVALID_ARGUMENT", "ModelNotFoundError": "NOT_FOUND",
    "UnavailableError": "UNAVAILABLE", "ResourceExhaustedError": "RESOURCE_EXHAUSTED",
    "DeadlineExceededError": "DEADLINE_EXCEEDED", "UnauthenticatedError": "UNAUTHENTICATED",
    "UnimplementedError": "UNIMPLEMENTED", "ConfigError": "INVALID_ARGUMENT", "TfshipError": "INTERNAL",
    "PermissionDeniedError": "PERMISSION_DENIED", "RequestTimeoutError": "DEADLINE_EXCEEDED",
    "FailedPreconditionError": "FAILED_PRECONDITION",
}


class Raiser:
    """Servicer whose method raises the exception class named by the request bytes."""

    @rpc
    async def Raise(self, request: bytes, context):
        name = request.decode()
        if name == "ValueError":
            raise ValueError("secret internal detail")
        raise getattr(errors, name)(f"{name} happened")


async def _call_all() -> dict[str, tuple[grpc.StatusCode, str]]:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(Raiser().Raise)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Raiser", {"Raise": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    out = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/test.Raiser/Raise")
            for name in [*KINDS, "ValueError"]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(name.encode(), timeout=10)
                out[name] = (err.value.code(), err.value.details())
    finally:
        await server.stop(0)
    return out


@pytest.fixture(scope="module")
def outcomes():
    return asyncio.run(_call_all())


@pytest.mark.parametrize("kind", list(KINDS))
def test_tfship_error_maps_to_its_status(outcomes, kind):
    code, details = outcomes[kind]
    assert code == grpc.StatusCode[KINDS[kind]] == grpc.StatusCode[getattr(errors, kind).grpc_code]
    assert details == f"{kind} happened"


def test_unexpected_error_is_internal_and_generic(outcomes):
    code, details = outcomes["ValueError"]
    assert code == grpc.StatusCode.INTERNAL
    assert "secret" not in details and details.startswith("internal server error (incident ")
