"""A grouped convolution's export runs in TensorFlow with and without oneDNN (signatures.grouped_conv).

Keras computes `Conv2D(groups > 1)` inside a must-compile function; unmarked, Grappler fuses it with its bias
into `_FusedConv2D`, which refuses groups unless oneDNN is on (TensorFlow's default only on recent Intel CPUs:
ConvNeXtTiny's export failed so on an AMD EPYC host). Each SavedModel here is run in a fresh process with
`TF_ENABLE_ONEDNN_OPTS=0` and `=1`, against Keras' own answer. With the rewrite switched off, the same export
fails without oneDNN, and the export's behaviour check says so in one line naming the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np

from tfship.core import protocol
from tfship.core.saved_model import read_signatures
from tfship.signatures import forward_only
from tfship.signatures.export import build_savedmodel_module, export_saved_model
from tfship.signatures.keras_export import build_keras_module, contract_from_keras

IMAGES = np.random.default_rng(7).standard_normal((3, 12, 12, 4)).astype(np.float32)

RUN = """
import json, sys, numpy as np
from tfship.core.errors import AuditError
from tfship.pipeline.gate.behaviour import check_behaviour
import tensorflow as tf
images, answers = np.load(sys.argv[1]), {}
for folder in sys.argv[2:]:
    try:
        check_behaviour(folder, {"image": images})
    except AuditError as err:
        answers[folder] = {"error": str(err)}
        continue
    (out,) = tf.saved_model.load(folder).signatures["serving_default"](image=tf.constant(images)).values()
    answers[folder] = {"values": out.numpy().tolist()}
print(json.dumps(answers))
"""


def _model(kind: str):
    """depthwise: groups = input channels (ConvNeXt's block), then a strided one; split: 2 groups of 2 channels."""
    inputs = keras.Input((12, 12, 4), name="image")
    if kind == "depthwise":
        x = keras.layers.Conv2D(8, 3, padding="same", groups=4, name="depthwise")(inputs)
        x = keras.layers.Conv2D(8, 3, strides=2, padding="same", groups=8, name="depthwise_strided")(x)
    else:
        x = keras.layers.Conv2D(6, 3, padding="same", groups=2, name="two_groups")(inputs)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D(name="pool")(x))


def _run(folders: list[Path], onednn: str, tmp_path: Path) -> dict[str, dict]:
    """{folder: {"values": outputs} or {"error": the behaviour check's AuditError}} from one fresh process."""
    np.save(tmp_path / "images.npy", IMAGES)
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "images.npy"), *map(str, folders)], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {Path(folder).name: answer for folder, answer in answers.items()}


def _ops(folder: Path) -> set[str]:
    saved_model = protocol.SavedModel.FromString((folder / "saved_model.pb").read_bytes())
    return {node.op for f in saved_model.meta_graphs[0].graph_def.library.function for node in f.node_def}


def _export(model, folder: Path):
    contract = contract_from_keras(model)
    return export_saved_model(build_keras_module(model, contract), contract, folder)


def test_a_grouped_convolution_runs_with_and_without_onednn(tmp_path):
    expected, folders = {}, []
    for kind, op in (("depthwise", "DepthwiseConv2dNative"), ("split", "Split")):
        model = _model(kind)
        result = _export(model, tmp_path / f"{kind}-ours")
        assert result.cleanup.grouped_rewritten and op in _ops(tmp_path / f"{kind}-ours"), result.cleanup
        model.export(str(tmp_path / f"{kind}-keras"), verbose=False)  # Keras' own route, re-exported by us
        contract = read_signatures(tmp_path / f"{kind}-keras")["serving_default"]
        again = export_saved_model(build_savedmodel_module(tmp_path / f"{kind}-keras", contract), contract,
                                   tmp_path / f"{kind}-again")
        assert again.cleanup.grouped_rewritten, again.cleanup
        folders += [tmp_path / f"{kind}-ours", tmp_path / f"{kind}-again"]
        expected[kind] = model.predict(IMAGES, verbose=0)
    for onednn in ("0", "1"):
        for name, answer in _run(folders, onednn, tmp_path).items():
            assert "values" in answer, (name, onednn, answer)
            np.testing.assert_allclose(np.asarray(answer["values"]), expected[name.split("-")[0]], atol=1e-5,
                                       rtol=1e-5)


def test_without_the_rewrite_the_export_fails_without_onednn_and_says_where(tmp_path, monkeypatch):
    """The check above can fail: unmarked but not rewritten, TensorFlow without oneDNN refuses the fused kernel."""
    monkeypatch.setattr(forward_only, "rewrite_grouped_convolutions", lambda function: [])
    _export(_model("depthwise"), tmp_path / "plain")
    answer = _run([tmp_path / "plain"], "0", tmp_path)["plain"]
    assert "error" in answer, answer
    message = answer["error"]
    assert "does not run in this TensorFlow" in message and "grouped convolutions" in message, message
    assert "(node " in message and "depthwise" in message and "\n" not in message, message
    assert "values" in _run([tmp_path / "plain"], "1", tmp_path)["plain"]  # oneDNN runs it: the fused kernel's fault
