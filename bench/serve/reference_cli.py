"""What the reference servers of `make bench-serve` share: their command line and the gRPC listen loop.

Each reference (`bare_server`, `bare_rest`, `ort_server`) takes one source file, `--port` (0 = any free port)
and `--cpu` (pin to these cores, repeatable), and prints `READY <port>` on stdout once listening. Nothing here
is tfship code: the references stay the floor tfship is compared with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import grpc


def parse_reference_args(prog: str, source_flag: str, source_help: str,
                         argv: list[str] | None = None) -> tuple[Path, int]:
    """`(source file, port)` from the command line; pins this process to the `--cpu` cores first."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument(source_flag, dest="source", type=Path, required=True, help=source_help)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cpu", type=int, action="append", default=[], help="pin to these cores")
    args = parser.parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, set(args.cpu))
    return args.source, args.port


def announce_ready(port: int) -> None:
    """Print `READY <port>` (what the benchmark waits for)."""
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()


async def serve_rest(app, port: int) -> None:
    """Serve the aiohttp `app` on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    announce_ready(runner.addresses[0][1])
    await asyncio.Event().wait()


def predict_service(predict) -> grpc.GenericRpcHandler:
    """TF Serving's `PredictionService` with `predict` (`async def predict(request, context)`) as its `Predict`,
    messages parsed and serialised by the `tensorflow-serving-api` classes (imported here: `bare_server` never is).
    """
    from tensorflow_serving.apis import predict_pb2

    method = grpc.unary_unary_rpc_method_handler(
        predict,
        request_deserializer=predict_pb2.PredictRequest.FromString,
        response_serializer=predict_pb2.PredictResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {"Predict": method})


async def serve_grpc(handler: grpc.GenericRpcHandler, port: int) -> None:
    """Listen with `handler` on 127.0.0.1:`port` (64 MiB messages) until cancelled or SIGTERM."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    announce_ready(bound)
    await server.wait_for_termination()
