"""Bare `grpc.aio` reference server: answers TF Serving's `Predict` with prebuilt bytes, nothing else.

No tfship code and no protobuf work: the request bytes are not parsed, the reply is a serialised
`PredictResponse` read once from `--response-file`. This is the transport's floor that `make
bench-serve` compares tfship's `identity` backend with (issue 14). Prints `READY <port>` on stdout
once listening.

    python -m bench.serve.bare_server --response-file RESP.bin [--port 0] [--cpu 0]
"""

from __future__ import annotations

import asyncio

import grpc

from bench.serve.reference_cli import parse_reference_args, serve_grpc

SERVICE = "tensorflow.serving.PredictionService"


def _handler(reply: bytes) -> grpc.GenericRpcHandler:
    async def predict(request: bytes, context) -> bytes:
        return reply

    # No (de)serialiser: grpc hands over and takes raw bytes.
    return grpc.method_handlers_generic_handler(SERVICE, {"Predict": grpc.unary_unary_rpc_method_handler(predict)})


async def serve(reply: bytes, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""
    await serve_grpc(_handler(reply), port)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    source, port = parse_reference_args("python -m bench.serve.bare_server", "--response-file", "serialised PredictResponse to send", argv)
    asyncio.run(serve(source.read_bytes(), port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
