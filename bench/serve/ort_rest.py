"""Hand-written REST ONNX Runtime server for TF Serving's `:predict` JSON (a reference, no tfship code).

What a careful engineer writes in an afternoon: aiohttp, orjson, one `onnxruntime.InferenceSession` (one
intra-op thread, like tfship's `--intra-op-threads 1`). Each `POST /v1/models/<name>:predict` body is parsed
with orjson, row format (`{"instances": [...]}`: a list of rows, or of `{input: row}` objects) or columnar
(`{"inputs": ...}`), turned into float32 arrays, run at once on the event loop (no batching, no queue), and
answered in TF Serving's shape (`{"predictions": ...}` for row requests, `{"outputs": ...}` for columnar
ones) with orjson's numpy serializer. A malformed body is a 400; nothing else is validated (no signature
contract, limits, deadlines, metrics or drain gate: the work tfship does beyond this is what the ratio
measures). Prints `READY <port>` on stdout once listening.

    python -m bench.serve.ort_rest --model model.onnx [--port 0] [--cpu 0]
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
from aiohttp import web

from bench.serve.reference_cli import parse_reference_args, serve_rest


def _session(model: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _feeds(body: dict, input_names: list[str]) -> tuple[dict[str, np.ndarray], bool]:
    """(feeds, row format?) of a parsed `:predict` body; KeyError/TypeError/ValueError when malformed."""
    if "instances" in body:
        rows = body["instances"]
        if rows and isinstance(rows[0], dict):
            return {name: np.asarray([r[name] for r in rows], dtype=np.float32) for name in input_names}, True
        return {input_names[0]: np.asarray(rows, dtype=np.float32)}, True
    inputs = body["inputs"]
    if isinstance(inputs, dict):
        return {name: np.asarray(inputs[name], dtype=np.float32) for name in input_names}, False
    return {input_names[0]: np.asarray(inputs, dtype=np.float32)}, False


def build_app(session: ort.InferenceSession) -> web.Application:
    """The aiohttp application answering `:predict` with `session`."""
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]

    async def predict(request: web.Request) -> web.Response:
        try:
            feeds, row_format = _feeds(orjson.loads(await request.read()), input_names)
        except (KeyError, TypeError, ValueError, IndexError, orjson.JSONDecodeError) as err:
            return web.Response(status=400, body=orjson.dumps({"error": f"bad request: {type(err).__name__}"}),
                                content_type="application/json")
        outputs = dict(zip(output_names, session.run(output_names, feeds)))
        if row_format:
            rows = len(next(iter(outputs.values())))
            body = {"predictions": [{name: value[i] for name, value in outputs.items()} for i in range(rows)]}
        else:
            body = {"outputs": outputs}
        return web.Response(body=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
                            content_type="application/json")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/models/{name}:predict", predict)
    return app


async def serve(model: Path, port: int) -> None:
    """Listen on 127.0.0.1:`port` (0 = any free port) until cancelled or SIGTERM."""
    await serve_rest(build_app(_session(model)), port)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    model, port = parse_reference_args("python -m bench.serve.ort_rest", "--model", "model.onnx to serve", argv)
    asyncio.run(serve(model, port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
