"""TF Serving's `--grpc_socket_path`: a gRPC listener on a Unix socket beside the TCP port."""

from __future__ import annotations

import grpc

from tfship.core.errors import ConfigError


def bind_unix_socket(server: grpc.aio.Server, path: str, credentials: grpc.ServerCredentials | None) -> None:
    """Add a listener on the Unix socket `path` to `server` (before `start()`): the same services, credentials and
    interceptors as its TCP port. gRPC replaces a stale socket file.

    Raises:
        ConfigError: the socket cannot be created (missing folder, no permission), naming the path.
    """
    address = f"unix:{path}"
    try:
        bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as err:
        bound, detail = 0, f" ({err})"
    else:
        detail = ""
    if bound == 0:
        raise ConfigError(f"cannot listen on the Unix socket {path} (--grpc_socket_path): its folder must exist and "
                          f"be writable{detail}")
