"""REST bodies the server cannot represent are 400 naming why, never a 500 or a silent ±Infinity.

In-process (aiohttp test server over a real tflite model): nesting past numpy's 64 dims, a bare array nested
1,000 deep, JSON literals beyond a float dtype's finite range (both REST APIs agree), explicit NaN/Infinity
tokens still accepted as TF Serving does, and a V2 input giving both `data` and `binary_data_size`.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from aiohttp.test_utils import TestClient, TestServer
from conftest import MODEL

from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import from_repository
from tfship.serving.dataplane.service import DataPlane
from tfship.serving.dataplane.types import ServerLimits
from tfship.serving.operations.metrics import Metrics
from tfship.serving.rest_port import build_app
from tfship.serving.runtimes import RuntimeOptions

PREDICT = f"/v1/models/{MODEL}:predict"
INFER = f"/v2/models/{MODEL}/infer"


def _image_text(first: str) -> str:
    """One [8, 8, 1] image as JSON text whose first value is the literal `first`."""
    values = [first] + ["0.0"] * 63
    rows = ",".join("[" + ",".join(f"[{v}]" for v in values[r * 8:(r + 1) * 8]) + "]" for r in range(8))
    return f"[{rows}]"


def _v2_text(first: str, extra: str = "") -> str:
    data = ",".join([first] + ["0.0"] * 63)
    return (f'{{"inputs":[{{"name":"image","datatype":"FP32","shape":[1,8,8,1],"data":[{data}]{extra}}}]}}')


def _nested(depth: int, leaf: str = "0.0") -> str:
    return "[" * depth + leaf + "]" * depth


CASES = [  # (route, body text, status, words the error must hold)
    (PREDICT, '{"instances": ' + _nested(65) + "}", 400, "65 lists deep"),
    (PREDICT, '{"inputs": ' + _nested(70) + "}", 400, "at most 64 dims"),
    (PREDICT, _nested(1000), 400, "Is not object"),
    (PREDICT, _nested(100_000), 400, "JSON Parse error"),
    (PREDICT, '{"instances": [' + _image_text("1e309") + "]}", 400, "1e309"),
    (PREDICT, '{"instances": [' + _image_text("-1e309") + "]}", 400, "-1e309"),
    (PREDICT, '{"instances": [' + _image_text("1e39") + "]}", 400, "outside the finite range of float"),
    (PREDICT, '{"instances": [' + _image_text("NaN") + "]}", 200, "predictions"),
    (PREDICT, '{"instances": [' + _image_text("Infinity") + "]}", 200, "predictions"),
    (PREDICT, '{"instances": [' + _image_text("-Infinity") + "]}", 200, "predictions"),
    (PREDICT, '{"instances": [' + _image_text("3.4e38") + "]}", 200, "predictions"),
    (INFER, _v2_text("1e309"), 400, "1e309"),
    (INFER, _v2_text("-1e309"), 400, "-1e309"),
    (INFER, _v2_text("1e39"), 400, "out of range for FP32: outside its finite range"),
    (INFER, _v2_text("Infinity"), 200, "outputs"),
    (INFER, _v2_text("NaN"), 200, "outputs"),
    (INFER, _v2_text("0.5", ',"parameters":{"binary_data_size":0}'), 400, "both 'data' and"),
]


@pytest.fixture(scope="module")
def answers(repository):
    async def run():
        with ThreadPoolExecutor(2) as pool:
            manager = ModelManager("tflite", RuntimeOptions(), pool)
            await manager.apply_config(from_repository(repository, MODEL))
            dataplane = DataPlane(manager, pool, ServerLimits(), Metrics())
            results = []
            async with TestClient(TestServer(build_app(dataplane))) as http:
                for route, body, _, _ in CASES:
                    response = await http.post(route, data=body.encode(),
                                               headers={"Content-Type": "application/json"})
                    results.append((response.status, await response.text()))
            await manager.unload_all()
            dataplane.offloader.close()
            return results

    return asyncio.run(run())


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[0].rsplit('/', 1)[-1]}-{c[3]}-{i}"
                                                          for i, c in enumerate(CASES)])
def test_unrepresentable_bodies_are_refused_and_tokens_accepted(answers, index):
    _, _, status, words = CASES[index]
    got, text = answers[index]
    assert got == status, text[:400]
    assert words in text, text[:400]
    if status == 400:
        assert "input 'image'" in json.loads(text)["error"] or "JSON" in text or "lists deep" in text
