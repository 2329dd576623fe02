"""Hand-written micro-batching ONNX Runtime server for TF Serving's `Predict` (a reference, no tfship code).

What a user would write to batch: `grpc.aio`, the `tensorflow-serving-api` messages, one
`onnxruntime.InferenceSession` (one intra-op thread, like tfship's `--intra-op-threads 1`); each request's
`tensor_content` (float32) is queued, and one batcher task takes the first queued request, waits up to
`--timeout-us` (1,000, tfship's benchmark setting) for up to `--max-batch` (32) rows, runs the merged batch
on a thread (the event loop keeps decoding meanwhile) and answers each request its rows with
`tensor_content`. No validation, no limits, no deadlines. Prints `READY <port>` on stdout once listening.

    python -m bench.serve.ort_batch_server --model model.onnx [--port 0] [--cpu 0]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import grpc
import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2  # protos only (tensorflow-serving-api's deps)
from tensorflow_serving.apis import predict_pb2

from bench.serve.ort_server import _session
from bench.serve.reference_cli import parse_reference_args, predict_service, serve_grpc

MAX_BATCH = 32
TIMEOUT_S = 1000e-6


def _handler(session, queue: asyncio.Queue) -> grpc.GenericRpcHandler:
    async def predict(request: predict_pb2.PredictRequest, context) -> predict_pb2.PredictResponse:
        (name, tensor), = request.inputs.items()
        shape = [d.size for d in tensor.tensor_shape.dim]
        rows = np.frombuffer(tensor.tensor_content, dtype=np.float32).reshape(shape)
        answer = asyncio.get_running_loop().create_future()
        queue.put_nowait((name, rows, answer))
        outputs = await answer
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for key, value in outputs.items():
            out: tensor_pb2.TensorProto = response.outputs[key]
            out.dtype = types_pb2.DT_FLOAT if value.dtype == np.float32 else types_pb2.DT_INT64
            out.tensor_shape.dim.extend(out.tensor_shape.Dim(size=s) for s in value.shape)
            out.tensor_content = value.tobytes()
        return response

    return predict_service(predict)


async def _batcher(session, queue: asyncio.Queue) -> None:
    """Forever: one batch of up to `MAX_BATCH` rows, gathered for at most `TIMEOUT_S` after its first request."""
    loop, pool = asyncio.get_running_loop(), concurrent.futures.ThreadPoolExecutor(1)
    names = [o.name for o in session.get_outputs()]
    while True:
        batch = [await queue.get()]
        deadline = loop.time() + TIMEOUT_S
        while sum(len(b[1]) for b in batch) < MAX_BATCH and (left := deadline - loop.time()) > 0:
            try:
                batch.append(queue.get_nowait() if not queue.empty() else await asyncio.wait_for(queue.get(), left))
            except TimeoutError:
                break
        merged = np.concatenate([rows for _, rows, _ in batch])
        try:
            results = await loop.run_in_executor(pool, session.run, names, {batch[0][0]: merged})
        except Exception as err:  # noqa: BLE001 - every request of the batch gets the error
            for _, _, answer in batch:
                answer.set_exception(err)
            continue
        offset = 0
        for _, rows, answer in batch:
            answer.set_result({n: r[offset:offset + len(rows)] for n, r in zip(names, results)})
            offset += len(rows)


async def serve(model: Path, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""
    session, queue = _session(model), asyncio.Queue()
    batcher = asyncio.get_running_loop().create_task(_batcher(session, queue))
    try:
        await serve_grpc(_handler(session, queue), port)
    finally:
        batcher.cancel()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    source, port = parse_reference_args("python -m bench.serve.ort_batch_server", "--model", "the .onnx file", argv)
    asyncio.run(serve(source, port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
