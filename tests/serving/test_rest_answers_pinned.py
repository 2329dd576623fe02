"""REST answers pinned byte for byte: TF Serving's `:predict` and the Open Inference Protocol's `infer`.

The REST request path is tuned for speed (issue 43: the float writer, the JSON readers, the body read); what
it answers must not move by a byte. Each case below is sent through the REST app the server builds
(`serving.rest_port.build_app`, a real aiohttp test server) over `identity` models (the benchmark backend:
outputs echo inputs, so every dtype's writer is exercised), and its status, content type and the SHA-256 of
its body are compared with the figures the code before the tuning answered (commit 5f58e46). A few small
answers are also compared as JSON, so a failure shows what changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.serve.identity import IdentityRuntime
from tfship.core.contract import Signature, TensorSpec
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import ModelConfig
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ServerLimits
from tfship.serving.operations.metrics import Metrics
from tfship.serving.rest_port import build_app
from tfship.serving.runtimes import REGISTRY, RuntimeOptions

_ROW = np.random.default_rng(0).random(784, dtype=np.float32)
_MIXED = {"f": {"dtype": "float32", "shape": [None, 3]}, "d": {"dtype": "float64", "shape": [None]},
          "h": {"dtype": "float16", "shape": [None]}, "i": {"dtype": "int32", "shape": [None, 2]},
          "b": {"dtype": "bool", "shape": [None]}, "s": {"dtype": "string", "shape": [None]},
          "s_bytes": {"dtype": "string", "shape": [None]}}
_SPECIAL = [1435774300.0, 0.2, 9000000.0, 4.0, -0.0, 0.0003, 3e-05, 555557.5, 123456789.0, 1e-45, 3.4028235e38]


def _row(f, d, h, i, b, s, s_bytes):
    return {"f": f, "d": d, "h": h, "i": i, "b": b, "s": s, "s_bytes": s_bytes}


_ROWS = [_row([1.5, 1435774300.0, 0.2], 1 / 3, 0.1, [1, -2], True, "héllo", {"b64": "AAEC/w=="}),
         _row([9000000, 4, -0.0], 0.1 + 0.2, 65504, [2147483647, 0], False, "", {"b64": "aGk"})]
_V2_MIXED = [{"name": "f", "datatype": "FP32", "shape": [2, 3], "data": [[1.5, 1435774300.0, 0.2], [9e6, 4, -0.0]]},
             {"name": "d", "datatype": "FP64", "shape": [2], "data": [1 / 3, 0.1 + 0.2]},
             {"name": "h", "datatype": "FP16", "shape": [2], "data": [0.1, 65504]},
             {"name": "i", "datatype": "INT32", "shape": [2, 2], "data": [1, -2, 2147483647, 0]},
             {"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]},
             {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""]},
             {"name": "s_bytes", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]


def _json(value) -> bytes:
    return json.dumps(value).encode()


def _cases() -> dict[str, tuple[str, bytes, dict]]:
    """case -> (path, body, headers)."""
    row = _ROW.tolist()
    raw = np.asarray([row], np.float32).tobytes()
    header = _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784],
                                "parameters": {"binary_data_size": len(raw)}}],
                    "outputs": [{"name": "x", "parameters": {"binary_data": True}}]})
    special = np.asarray(_SPECIAL, np.float32).tolist()
    return {
        "tfs_row_784": ("/v1/models/echo:predict", _json({"instances": [row]}), {}),
        "tfs_row_3x784": ("/v1/models/echo:predict", _json({"instances": [row, row[::-1], special * 71 + row[:3]]}),
                          {}),
        "tfs_columnar_784": ("/v1/models/echo:predict", _json({"inputs": {"x": [row]}}), {}),
        "tfs_columnar_bare_list": ("/v1/models/echo:predict", _json({"inputs": [row]}), {}),
        "tfs_row_mixed": ("/v1/models/mixed:predict", _json({"instances": _ROWS}), {}),
        "tfs_columnar_mixed": ("/v1/models/mixed:predict",
                               _json({"inputs": {k: [r[k] for r in _ROWS] for k in _MIXED}}), {}),
        "tfs_filtered": ("/v1/models/mixed:predict", _json({"instances": _ROWS, "output_filter": ["f", "i"]}), {}),
        "tfs_nonfinite": ("/v1/models/floats:predict", b'{"instances": [NaN, Infinity, -Infinity, 1e-40, 7]}', {}),
        "tfs_float64_many": ("/v1/models/doubles:predict",
                             _json({"inputs": (np.arange(130) / 7.0 - 3).tolist() + [1e16, 1e17, 2.0 ** 53]}), {}),
        "tfs_bad_type": ("/v1/models/mixed:predict", _json({"instances": [{**_ROWS[0], "i": [1.5, 2]}]}), {}),
        "tfs_bad_signature": ("/v1/models/echo:predict", _json({"signature_name": "nope", "instances": [row]}), {}),
        "tfs_ragged": ("/v1/models/echo:predict", _json({"instances": [row, row[:5]]}), {}),
        "tfs_out_of_range": ("/v1/models/floats:predict", b'{"instances": [1, 1e39]}', {}),
        "tfs_big_int": ("/v1/models/mixed:predict",
                        b'{"inputs": {"f": [[1,2,3]], "d": [1], "h": [1], "i": [[1, 18446744073709551616]],'
                        b' "b": [true], "s": ["a"], "s_bytes": ["b"]}}', {}),
        "tfs_not_json": ("/v1/models/echo:predict", b'{"instances": [1,', {}),
        "v2_json_784": ("/v2/models/echo/infer",
                        _json({"id": "r1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784],
                                                       "data": row}]}), {}),
        "v2_json_nested": ("/v2/models/echo/infer",
                           _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784], "data": [row]}]}),
                           {}),
        "v2_json_mixed": ("/v2/models/mixed/infer", _json({"inputs": _V2_MIXED}), {}),
        "v2_binary": ("/v2/models/echo/infer", header + raw, {"Inference-Header-Content-Length": str(len(header))}),
        "v2_nonfinite": ("/v2/models/floats/infer",
                         b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [NaN, Infinity, 2]}]}',
                         {}),
        "v2_out_of_range": ("/v2/models/floats/infer",
                            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 1e39]}]}', {}),
        "v2_big_int": ("/v2/models/mixed/infer",
                       b'{"inputs": [{"name": "i", "datatype": "INT32", "shape": [1, 2],'
                       b' "data": [1, 18446744073709551616]}]}', {}),
        "v2_big_int_id": ("/v2/models/echo/infer", b'{"id": 123456789012345678901234, "inputs": []}', {}),
        "v2_bad_type": ("/v2/models/mixed/infer",
                        _json({"inputs": [{**_V2_MIXED[3], "data": [1, 2, "3", 4]}, *_V2_MIXED[4:]]}), {}),
        "v2_wrong_count": ("/v2/models/echo/infer",
                           _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784], "data": row[:5]}]}),
                           {}),
    }


class _Echo(IdentityRuntime):
    """The `identity` backend with its dtypes named as tfship names them (`string` included): `echo.json`."""

    name, FILE = "pinned_echo", "echo.json"

    def load(self) -> None:
        declared = json.loads((self.version_dir / self.FILE).read_text())["inputs"]
        specs = {alias: TensorSpec(dtype=spec["dtype"], tensor_name=f"{alias}:0", shape=tuple(spec["shape"]))
                 for alias, spec in declared.items()}
        self._signature = Signature(name="serving_default", inputs=specs, outputs=specs)
        self.ready = True


_TFS = _ERROR = "application/json; charset=utf-8"
_V2, _BINARY = "application/json", "application/octet-stream"
# case -> (HTTP status, Content-Type, SHA-256 of the body), as commit 5f58e46 answered.
PINNED = {
    "tfs_bad_signature": (400, _ERROR, "93227ffbb999142e0c3de4424277fd88e7b689d91dd51b38b69f4333612aa6a2"),
    "tfs_bad_type": (400, _ERROR, "09ca44b7bf177fe628c8816c759e341aef81cf6f0e0a436c7330675828d77b72"),
    "tfs_big_int": (400, _ERROR, "2681a51569d210bae4dd1aa77c69c59a874fd7572b0ea0f0113ae717ce1ebd2e"),
    "tfs_columnar_784": (200, _TFS, "4abf595ca5acbaf069aa1f169fbe0ec649afd66b7df4c8d3b29658265a2e98d8"),
    "tfs_columnar_bare_list": (200, _TFS, "4abf595ca5acbaf069aa1f169fbe0ec649afd66b7df4c8d3b29658265a2e98d8"),
    "tfs_columnar_mixed": (200, _TFS, "9906fff14f7b63ad8bbe82a444916b3e8d4f5a852d71889efe57315b06bc3e8d"),
    "tfs_filtered": (200, _TFS, "1532caa467db6ef81efadf242a1325d7a8f6492ba078683e5d78630612d702f0"),
    "tfs_float64_many": (200, _TFS, "5ef481d7b495221bca67372ec416db326ae60bfca62740d05963065028754aa3"),
    "tfs_nonfinite": (200, _TFS, "d2ca9433845551a3eff06bc1c97386ac33aaef6b935ec508d7b79e8bf0daf815"),
    "tfs_not_json": (400, _ERROR, "28efc32abe1f0f966a10057d95e3fce7959e2d050667db1b0a75e29cd7567474"),
    "tfs_out_of_range": (400, _ERROR, "fe8afafb8fa30bd275c1ac6e00aed60de7e6263ba6dc338d0c87e5e070e7eb28"),
    "tfs_ragged": (400, _ERROR, "b26aec92708e59e8e565595d29e38f5c9af56b946e4e2da239858eb03360354e"),
    "tfs_row_3x784": (200, _TFS, "d093ff542778eda2ee9687e87fe5108817209310cb185755250ecec5a7c5f3af"),
    "tfs_row_784": (200, _TFS, "1369923de7d2e9ba0e575ee410bf5bbbc792f349ddad082c3c018192fe7ca2d4"),
    "tfs_row_mixed": (200, _TFS, "972456db5198f0e50912fdae046e4247c32db3810d2f9d506acc2534da677614"),
    "v2_bad_type": (400, _ERROR, "35a20e99af9229967a6975711b463a2bdea449353904f99a08e44e15e332672f"),
    "v2_big_int": (400, _ERROR, "7c6842191663e2764841dba4cc6b277de2426368a265549f4c58a4de56f3489c"),
    "v2_big_int_id": (400, _ERROR, "9ea807a941d1e7fae2918f5f27ce0d0f1ab55b0daa3b7c6f7a2bdfbabffd5fb2"),
    "v2_binary": (200, _BINARY, "b4ff801f3308571e672a514ed71c9a2bdb311526661a747a8a4ea26e7df44b42"),
    "v2_json_784": (200, _V2, "6cda11e674d3eff6abe844e6015a6dcf7a2b4b5a435740abd9fab370cde7343d"),
    "v2_json_mixed": (200, _V2, "1003c415034566880b8e795a78435370673aa8988963619bcc45e31d4aeab186"),
    "v2_json_nested": (200, _V2, "9cea4b6beed1bb3a1edb1767fa61548efb5c6ba0e522cd7aebbc27b4d03757c5"),
    "v2_nonfinite": (200, _V2, "1d324e65ef7765f41e43097092bff095320254512e5dbc3b7d27d1597aa9a7cf"),
    "v2_out_of_range": (400, _ERROR, "6d7d8fb5e7228140f50be4592114e7e35d594dd5dd81eb0574ac26548d157793"),
    "v2_wrong_count": (400, _ERROR, "cc4ed8a1692e0802b2b7ece163ad2c3cbebf4494b02fd0b3058b5bf4a2867e47"),
}


def _repository(root) -> None:
    models = {"echo": {"x": {"dtype": "float32", "shape": [None, 784]}}, "mixed": _MIXED,
              "floats": {"x": {"dtype": "float32", "shape": [None]}},
              "doubles": {"x": {"dtype": "float64", "shape": [None]}}}
    for name, inputs in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / _Echo.FILE).write_text(json.dumps({"inputs": inputs}))


async def _answers(root) -> dict[str, tuple[int, str, bytes]]:
    if _Echo.name not in REGISTRY.names():
        REGISTRY.register(_Echo.name, _Echo)
    metrics, executor = Metrics(), ThreadPoolExecutor(2)
    manager = ModelManager(_Echo.name, RuntimeOptions(intra_op_threads=1, inter_op_threads=1), executor,
                           metrics=metrics)
    dataplane = DataPlane(manager, executor, ServerLimits(), metrics)
    await manager.apply_config([ModelConfig(name=p.name, base_path=p) for p in sorted(root.iterdir())])
    answers = {}
    async with TestClient(TestServer(build_app(dataplane))) as client:
        for case, (path, body, headers) in _cases().items():
            async with client.post(path, data=body, headers={"Content-Type": "application/json", **headers}) as got:
                answers[case] = (got.status, got.headers.get("Content-Type", ""), await got.read())
    executor.shutdown(wait=False)
    return answers


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, tuple[int, str, bytes]]:
    root = tmp_path_factory.mktemp("pinned")
    _repository(root)
    return asyncio.run(_answers(root))


@pytest.mark.parametrize("case", sorted(_cases()))
def test_answer_is_pinned(answers, case):
    status, content_type, body = answers[case]
    assert (status, content_type, hashlib.sha256(body).hexdigest()) == PINNED[case], body[:600]


def test_small_answers_read_as_before(answers):
    """The pins of a few small answers, as JSON (what the hashes stand for)."""
    assert answers["tfs_nonfinite"][2] == b'{"predictions":[NaN,Infinity,-Infinity,9.99995e-41,7.0]}'
    assert json.loads(answers["tfs_bad_signature"][2])["error"].startswith('Serving signature name: "nope" not found')
    assert answers["v2_nonfinite"][0] == 200
    mixed = json.loads(answers["tfs_row_mixed"][2])["predictions"]
    assert mixed[0]["s"] == "héllo" and mixed[0]["s_bytes"] == {"b64": "AAEC/w=="}
    assert mixed[1]["f"] == [9000000.0, 4.0, -0.0] and answers["tfs_row_mixed"][2].count(b"9e+06") == 1
