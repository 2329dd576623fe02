"""tfship's REST handlers alone: CPU per call with no socket, on an idle core (the REST `handler_cost`).

Builds the REST app the server builds (`serving.rest_port.build_app`: middleware, routes, data plane) over
a small repository it writes itself (no TensorFlow): `head_mlp` (784 float32 in, the first 10 out: the mlp's
shapes with a model that costs nothing, run on the event loop), `identity_mlp` (the `identity` backend, 784
in and out) and, with onnx installed, `mlp_onnx` (784 -> 10 MatMul + Softmax, ONNX Runtime, one thread).
Each call hands aiohttp's router and middleware a mocked request holding the body, awaits the answer, and
takes its body bytes, as the transport would. What it measures is the Python work tfship adds to a REST
request beside aiohttp's own parsing and writing (which a socket server adds to both tfship and a bare one);
the `bare` case is an aiohttp app whose handler reads the body and answers prebuilt bytes, run the same way.

    python -m bench.serve.rest_cost [--case tfs_row_identity] [--calls 2000] [--profile out.prof] [--cpu 0]

Prints one JSON line per case: `us_per_call` (CPU microseconds, median of `--repeats`), `calls`, `status`,
`body_sha256` (of the answer, to compare two commits' answers), `bytes`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROW = np.random.default_rng(0).random(784, dtype=np.float32).tolist()


class HeadRuntime:
    """`head` backend (benchmark only): `{"probabilities": x[:, :10]}` for a `head.json` folder declaring `x`."""

    @staticmethod
    def make():
        from bench.serve.identity import IdentityRuntime
        from tfship.core.contract import Signature, TensorSpec

        class Head(IdentityRuntime):
            name, FILE = "head", "head.json"

            def load(self) -> None:
                super().load()
                spec = TensorSpec(dtype="float32", tensor_name="probabilities:0", shape=(None, 10))
                self._signature = Signature(name="serving_default", inputs=self._signature.inputs,
                                            outputs={"probabilities": spec})

            def predict(self, inputs, signature_name: str = "serving_default"):
                return {"probabilities": inputs["x"][:, :10]}

        return Head


def _bodies() -> dict[str, tuple[str, str, bytes, dict]]:
    """case -> (model, path suffix, body, headers)."""
    v2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784], "data": ROW}]}
    raw = np.asarray([ROW], np.float32).tobytes()
    v2_bin_header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784],
                                            "parameters": {"binary_data_size": len(raw)}}],
                                "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    cases = {"bare": ("", ":predict", json.dumps({"instances": [ROW]}).encode(), {}),
             "tfs_row_tiny": ("tiny", ":predict", b'{"instances": [0.5]}', {}),  # the fixed cost: one value in, one out
             "v2_json_tiny": ("tiny", "/infer", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
                                                b'"data": [0.5]}]}', {})}
    for model in ("head_mlp", "identity_mlp", "mlp_onnx"):
        tag = model.split("_")[0] if model != "mlp_onnx" else "onnx"
        cases[f"tfs_row_{tag}"] = (model, ":predict", json.dumps({"instances": [ROW]}).encode(), {})
        cases[f"tfs_columnar_{tag}"] = (model, ":predict", json.dumps({"inputs": {"x": [ROW]}}).encode(), {})
        cases[f"v2_json_{tag}"] = (model, "/infer", json.dumps(v2).encode(), {})
    for tag, model in (("head", "head_mlp"), ("onnx", "mlp_onnx")):
        cases[f"v2_binary_{tag}"] = (model, "/infer", v2_bin_header + raw,
                                     {"Inference-Header-Content-Length": str(len(v2_bin_header))})
    return cases


def write_repo(root: Path) -> bool:
    """The repository under `root`; returns whether the ONNX model was written (onnx installed)."""
    folder = root / "identity_mlp" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    declared = json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None, 784]}}})
    (folder / "identity.json").write_text(declared)
    (root / "tiny" / "1").mkdir(parents=True, exist_ok=True)
    (root / "tiny" / "1" / "identity.json").write_text(json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [None]}}}))
    (root / "head_mlp" / "1").mkdir(parents=True, exist_ok=True)
    (root / "head_mlp" / "1" / "head.json").write_text(declared)
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return False
    weights = np.random.default_rng(1).standard_normal((784, 10)).astype(np.float32) * 0.05
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probabilities"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 784])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 10])],
        [numpy_helper.from_array(weights, "w")])
    folder = root / "mlp_onnx" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    return True


async def _app(repo: Path, onnx: bool):
    from bench.serve.identity import register
    from tfship.serving.dataplane.manager import ModelManager
    from tfship.serving.dataplane.model_config import ModelConfig
    from tfship.serving.dataplane.service import DataPlane
    from tfship.serving.dataplane.types import ServerLimits
    from tfship.serving.operations.metrics import Metrics
    from tfship.serving.rest_port import build_app
    from tfship.serving.runtimes.base import RuntimeOptions

    register()
    from tfship.serving.runtimes import REGISTRY

    if "head" not in REGISTRY.names():
        REGISTRY.register("head", HeadRuntime.make())
    metrics, executor = Metrics(), ThreadPoolExecutor(2)
    manager = ModelManager("auto", RuntimeOptions(intra_op_threads=1, inter_op_threads=1), executor, metrics=metrics)
    dataplane = DataPlane(manager, executor, ServerLimits(), metrics)
    configs = [ModelConfig(name=name, base_path=repo / name) for name in ("head_mlp", "identity_mlp", "tiny")]
    if onnx:
        configs.append(ModelConfig(name="mlp_onnx", base_path=repo / "mlp_onnx"))
    await manager.apply_config(configs)
    app = build_app(dataplane, metrics=metrics)
    app.freeze()
    return app, executor


def _request(app, method: str, path: str, body: bytes, headers: dict):
    from aiohttp import streams
    from aiohttp.test_utils import make_mocked_request

    class _Protocol:
        _reading_paused = False

        def pause_reading(self, *args, **kwargs) -> None: ...

        def resume_reading(self, *args, **kwargs) -> None: ...

    payload = streams.StreamReader(_Protocol(), 1 << 16, loop=asyncio.get_running_loop())
    payload.feed_data(body)
    payload.feed_eof()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}
    return make_mocked_request(method, path, headers=headers, payload=payload, app=app)


def bare_app(reply: bytes):
    """The reference: an aiohttp app whose `:predict` reads the body and answers `reply` (no tfship code)."""
    from aiohttp import web

    async def predict(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/models/{name}:predict", predict)
    app.freeze()
    return app


async def _call(app, request) -> tuple[int, bytes]:
    response = await app._handle(request)
    return response.status, bytes(response.body or b"")


async def measure(cases: list[str], calls: int, repeats: int, profile: Path | None) -> list[dict]:
    """CPU microseconds per call of each case (median of `repeats` loops of `calls`); see the module docstring."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        onnx = write_repo(repo)
        app, executor = await _app(repo, onnx)
        results, bodies = [], _bodies()
        profiler = cProfile.Profile() if profile else None
        for case in cases:
            model, suffix, body, headers = bodies[case]
            if model == "mlp_onnx" and not onnx:
                continue
            path = (f"/v1/models/{model or 'head_mlp'}{suffix}" if suffix == ":predict"
                    else f"/v2/models/{model}{suffix}")
            target = app
            if case == "bare":  # tfship's own answer to the same body, prebuilt
                target = bare_app((await _call(app, _request(app, "POST", path, body, headers)))[1])
            for _ in range(300):  # warm-up: the first calls go to a thread until the backend's cost is measured
                status, answer = await _call(target, _request(target, "POST", path, body, headers))
            per_call, clock = [], time.thread_time
            for _ in range(repeats):
                requests = [_request(target, "POST", path, body, headers) for _ in range(calls)]  # not timed
                started = clock()
                if profiler:
                    profiler.enable()
                for request in requests:
                    await _call(target, request)
                if profiler:
                    profiler.disable()
                per_call.append((clock() - started) / calls * 1e6)
            results.append({"case": case, "us_per_call": round(statistics.median(per_call), 1), "calls": calls * repeats,
                            "status": status, "bytes": len(answer), "body_sha256": hashlib.sha256(answer).hexdigest()})
        if profiler:
            profiler.dump_stats(str(profile))
        executor.shutdown(wait=False)
        return results


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.serve.rest_cost", description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="case(s) to run (default: all)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", type=Path, default=None, help="write cProfile stats of the timed calls here")
    p.add_argument("--cpu", type=int, default=None, help="core to pin this process to")
    a = p.parse_args(argv)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    for row in asyncio.run(measure(a.case or list(_bodies()), a.calls, a.repeats, a.profile)):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
