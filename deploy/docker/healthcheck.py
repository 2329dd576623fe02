"""Docker HEALTHCHECK: exit 0 when the server's grpc.health.v1 service answers SERVING.

Checks 127.0.0.1:$GRPC_PORT (default 8500) for service $HEALTH_SERVICE (default "": the whole
server). Any other status, an RPC error or no answer within $HEALTH_TIMEOUT_S (default 3 s)
exits 1 and prints why, which `docker inspect` shows under State.Health.Log.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    """Exit 0 when the server's `grpc.health.v1` answers SERVING, else 1 (Docker's HEALTHCHECK contract)."""
    target = f"127.0.0.1:{os.environ.get('GRPC_PORT', '8500')}"
    service = os.environ.get("HEALTH_SERVICE", "")
    timeout = float(os.environ.get("HEALTH_TIMEOUT_S", "3"))
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's HealthStub lacks Check
                health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            print(f"health {target} service={service!r}: {err.code().name} {err.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"health {target} service={service!r}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
