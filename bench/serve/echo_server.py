"""Hand-written grpc.aio echo server: the least work a Python handler that reads a `Predict` can do.

A reference, no tfship code: the `tensorflow-serving-api` messages, `grpc.aio`; each request is parsed, each input's
`tensor_content` viewed as an array (`np.frombuffer`, no copy) and sent back under the same name with its dtype and
shape. No validation, no limits, no deadlines, no metrics. It measures what any Python handler pays beyond the bare
transport (`bare_server`, which does not parse at all): the floor under tfship's `identity` backend.
Prints `READY <port>` on stdout once listening.

    python -m bench.serve.echo_server --response-file IGNORED [--port 0] [--cpu 0]
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
from tensorflow_serving.apis import predict_pb2

from bench.serve.reference_cli import parse_reference_args, predict_service, serve_grpc

_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64}  # TensorFlow DataType -> NumPy


def _handler() -> grpc.GenericRpcHandler:
    async def predict(request: predict_pb2.PredictRequest, context) -> predict_pb2.PredictResponse:
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for name, tensor in request.inputs.items():
            values = np.frombuffer(tensor.tensor_content, dtype=_DTYPES[tensor.dtype])
            out = response.outputs[name]
            out.dtype = tensor.dtype
            out.tensor_shape.CopyFrom(tensor.tensor_shape)
            out.tensor_content = values.tobytes()
        return response

    return predict_service(predict)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring); `--response-file` is read by nothing (the CLI shape of `bare_server`)."""
    _unused, port = parse_reference_args("python -m bench.serve.echo_server", "--response-file",
                                         "unused (the same command line as bare_server)", argv)
    asyncio.run(serve_grpc(_handler(), port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
