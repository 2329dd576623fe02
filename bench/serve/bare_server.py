"""Bare `grpc.aio` reference server: answers TF Serving's `Predict` with prebuilt bytes, nothing else.

No tfship code and no protobuf work: the request bytes are not parsed, the reply is a serialised
`PredictResponse` read once from `--response-file`. This is the transport's floor that `make
bench-serve` compares tfship's `identity` backend with (issue 14). Prints `READY <port>` on stdout
once listening.

    python -m bench.serve.bare_server --response-file RESP.bin [--port 0] [--cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import grpc

SERVICE = "tensorflow.serving.PredictionService"


def _handler(reply: bytes) -> grpc.GenericRpcHandler:
    async def predict(request: bytes, context) -> bytes:
        return reply

    # No (de)serialiser: grpc hands over and takes raw bytes.
    return grpc.method_handlers_generic_handler(SERVICE, {"Predict": grpc.unary_unary_rpc_method_handler(predict)})


async def serve(reply: bytes, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((_handler(reply),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    sys.stdout.write(f"READY {bound}\n")
    sys.stdout.flush()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.bare_server")
    p.add_argument("--response-file", type=Path, required=True, help="serialised PredictResponse to send")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cpu", type=int, action="append", default=[], help="pin to these cores")
    args = p.parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    asyncio.run(serve(args.response_file.read_bytes(), args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
