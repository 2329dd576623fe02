"""Hand-written per-request ONNX Runtime server for TF Serving's `Predict` (a reference, no tfship code).

What a user would write in an afternoon: `grpc.aio`, the `tensorflow-serving-api` messages, one
`onnxruntime.InferenceSession` (one intra-op thread, like tfship's `--intra-op-threads 1`), each
request decoded from `tensor_content` (float32), run at once on the event loop (no batching, no
queue) and answered with `tensor_content`. No validation beyond what numpy's reshape enforces.
Prints `READY <port>` on stdout once listening.

    python -m bench.serve.ort_server --model model.onnx [--port 0] [--cpu 0]
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
from tensorflow.core.framework import tensor_pb2, types_pb2  # protos only (tensorflow-serving-api's deps)
from tensorflow_serving.apis import predict_pb2

from bench.serve.reference_cli import parse_reference_args, predict_service, serve_grpc


def _session(model: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _handler(session: ort.InferenceSession) -> grpc.GenericRpcHandler:
    output_names = [o.name for o in session.get_outputs()]

    async def predict(request: predict_pb2.PredictRequest, context) -> predict_pb2.PredictResponse:
        feeds = {}
        for name, tensor in request.inputs.items():
            shape = [d.size for d in tensor.tensor_shape.dim]
            feeds[name] = np.frombuffer(tensor.tensor_content, dtype=np.float32).reshape(shape)
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for name, value in zip(output_names, session.run(output_names, feeds)):
            out: tensor_pb2.TensorProto = response.outputs[name]
            out.dtype = types_pb2.DT_FLOAT if value.dtype == np.float32 else types_pb2.DT_INT64
            out.tensor_shape.dim.extend(out.tensor_shape.Dim(size=s) for s in value.shape)
            out.tensor_content = value.tobytes()
        return response

    return predict_service(predict)


async def serve(model: Path, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""
    await serve_grpc(_handler(_session(model)), port)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    source, port = parse_reference_args("python -m bench.serve.ort_server", "--model", "the .onnx file", argv)
    asyncio.run(serve(source, port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
