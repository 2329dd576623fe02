"""A shape check before the graph (issue 41): on a version tfship published (its folder holds `manifest.json`), an
input sent at another rank than its signature declares (scalars where `[?,1]` is declared) is refused with 400 /
INVALID_ARGUMENT naming the input and its declared shape, before TensorFlow runs; no graph internals
(`In[0] is not a matrix [[{{node ...}}]]`) reach the client. A folder without a manifest (TF Serving's own models)
keeps TF Serving's leniency: the graph judges, as before (`serving.dataplane.contract.validate_inputs(ranks=)`).
The model is TF2's half-plus-two (`x` float32 [?,1] into a MatMul), built here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
from half_plus_two import build_tf2

from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.contract import validate_inputs
from tfship.serving.launcher import ServerProcess


def test_a_rank_below_the_declared_one_is_refused_when_ranks_are_a_contract():
    signature = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, 1)),),
                             (TensorSpec(name="y", dtype="float32", shape=(None, 1)),))
    scalars = {"x": np.array([1.0, 2.0], np.float32)}
    validate_inputs(signature, scalars, shapes=False)  # TF Serving's leniency: the graph judges
    with pytest.raises(InvalidRequestError, match=r"input 'x' .*expected rank 2 \(declared shape float32\[\?,1\]\), "
                                                  r"received rank 1 \(float32\[2\]\); refused before the model runs"):
        validate_inputs(signature, scalars, shapes=False, ranks=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    build_tf2(root / "published" / "1")
    (root / "published" / "1" / "manifest.json").write_text(json.dumps({"model": "published", "version": 1}))
    build_tf2(root / "foreign" / "1")
    (root / "models.config").write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}\n'
        for name in ("published", "foreign")) + "}\n")
    with ServerProcess(root, "published", backend="saved_model",
                       extra_args=("--model_config_file", str(root / "models.config"))) as proc:
        yield proc


def test_scalars_into_a_published_matrix_input_are_refused_before_the_graph(server):
    answer = requests.post(f"{server.rest_url}/v1/models/published:predict", json={"instances": [1.0, 2.0]},
                           timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "input 'x'" in error and "declared shape float32[?,1]" in error and "before the model runs" in error, error
    assert "node" not in error and "matrix" not in error, error
    right = requests.post(f"{server.rest_url}/v1/models/published:predict", json={"instances": [[1.0], [2.0]]},
                          timeout=60)
    assert right.status_code == 200 and right.json()["predictions"] == [[2.5], [3.0]], right.text


def test_a_folder_without_a_manifest_keeps_tf_servings_leniency(server):
    """The graph judges (TF Serving's behaviour); its refusal is still the client's 400, naming the declared shape."""
    answer = requests.post(f"{server.rest_url}/v1/models/foreign:predict", json={"instances": [1.0, 2.0]}, timeout=60)
    assert answer.status_code == 400 and "before the model runs" not in answer.json()["error"], answer.text
