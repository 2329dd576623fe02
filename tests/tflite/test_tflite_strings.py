"""String inputs through TFLite: a `city` (string [-1, 1]) -> StringLookup -> Embedding -> Dense model
converts, runs in LiteRT with text given as `str`, `bytes` or object arrays, and matches the SavedModel;
a lookup table initialised from a vocabulary file, which LiteRT cannot initialise, is refused with
LiteRT's own reason and the file named."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

from tests.tflite.conftest import CONVERT_TIMEOUT_S
from tfship.core.errors import InvalidRequestError
from tfship.pipeline.conversion.artifacts import saved_model_runner
from tfship.serving.runtimes.litert import LiteRtModel
from tfship.signatures.export import export_saved_model
from tfship.signatures.keras_export import build_keras_module, contract_from_keras
from tfship.tflite.convert import convert_tflite
from tfship.tflite.modes import TfliteMode, TfliteOptions

CITIES = ["paris", "rome", "oslo", "lima", "são paulo"]
TEXT = np.array([["paris"], ["rome"], ["nowhere"], ["são paulo"], ["oslo"]])


def _city_model(vocabulary, inputs=("city",)) -> keras.Model:
    keras.utils.set_random_seed(3)
    texts = [keras.Input((1,), dtype="string", name=name) for name in inputs]
    lookup = keras.layers.StringLookup(vocabulary=vocabulary, name="lookup")
    embedded = [keras.layers.Flatten()(keras.layers.Embedding(len(CITIES) + 1, 4)(lookup(t))) for t in texts]
    joined = embedded[0] if len(embedded) == 1 else keras.layers.Concatenate()(embedded)
    return keras.Model(texts[0] if len(texts) == 1 else texts, keras.layers.Dense(3, name="scores")(joined))


def _export(model: keras.Model, folder: Path) -> Path:
    contract = contract_from_keras(model)
    export_saved_model(build_keras_module(model, contract), contract, folder)
    return folder


@pytest.fixture(scope="module")
def city_tflite(tmp_path_factory) -> tuple[Path, Path]:
    folder = _export(_city_model(CITIES), tmp_path_factory.mktemp("city") / "saved_model")
    result = convert_tflite(folder, folder.parent / "model.tflite", TfliteOptions(TfliteMode.FLOAT32),
                            {"city": TEXT}, CONVERT_TIMEOUT_S)
    assert result.status == "produced", result.reason
    return folder, result.path


def test_string_input_runs_in_litert_as_str_bytes_or_objects(city_tflite):
    saved_model, tflite = city_tflite
    expected = saved_model_runner(saved_model)({"city": TEXT})["scores"]
    for rows in (1, 7, 2):  # a fresh interpreter's first call at batch 1 failed in LiteRT before priming
        got = LiteRtModel(tflite).run({"city": np.resize(TEXT, (rows, 1))})["scores"]
        np.testing.assert_allclose(got, saved_model_runner(saved_model)({"city": np.resize(TEXT, (rows, 1))})["scores"],
                                   rtol=1e-5, atol=1e-6)
    runner = LiteRtModel(tflite)
    encoded = np.char.encode(TEXT, "utf-8")
    for text in (TEXT, encoded, encoded.astype(object), TEXT.astype(object)):
        got = runner.run({"city": text})["scores"]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=str(text.dtype))
    # "nowhere" is out of vocabulary: the OOV row differs from a known city's row
    assert not np.allclose(expected[2], expected[0])
    with pytest.raises(InvalidRequestError, match=r"input 'city' is a string tensor; got an element of type int"):
        runner.run({"city": np.array([[1], [2]], dtype=object)})


def test_two_string_inputs_match_the_saved_model(tmp_path):
    folder = _export(_city_model(CITIES, ("origin", "destination")), tmp_path / "saved_model")
    feed = {"origin": TEXT, "destination": TEXT[::-1].copy()}
    result = convert_tflite(folder, tmp_path / "model.tflite", TfliteOptions(TfliteMode.FLOAT32), feed,
                            CONVERT_TIMEOUT_S)
    assert result.status == "produced", result.reason
    got = LiteRtModel(result.path).run({k: np.char.encode(v, "utf-8") for k, v in feed.items()})["scores"]
    np.testing.assert_allclose(got, saved_model_runner(folder)(feed)["scores"], rtol=1e-5, atol=1e-6)


def test_file_initialised_lookup_is_refused_with_litert_reason(tmp_path):
    vocabulary = tmp_path / "cities.txt"
    vocabulary.write_text("\n".join(CITIES) + "\n", encoding="utf-8")
    folder = _export(_city_model(str(vocabulary)), tmp_path / "saved_model")
    result = convert_tflite(folder, tmp_path / "model.tflite", TfliteOptions(TfliteMode.FLOAT32),
                            {"city": TEXT}, CONVERT_TIMEOUT_S)
    assert result.status == "refused" and result.path is None
    assert "hashtable need to be initialized" in result.reason, result.reason  # LiteRT's own words
    assert "cities.txt" in result.reason and "vocabulary=[...]" in result.reason, result.reason
    assert not (tmp_path / "model.tflite").exists()


def test_serving_tflite_runtime_takes_text_as_str_or_bytes(city_tflite, tmp_path):
    from tfship.serving.runtimes.tflite import TfliteRuntime

    saved_model, tflite = city_tflite
    version = tmp_path / "1"
    version.mkdir()
    (version / "model.tflite").write_bytes(tflite.read_bytes())
    runtime = TfliteRuntime(version)
    runtime.load()
    one = runtime.predict({"city": TEXT[:1].astype(object)})["scores"]  # first request at batch 1
    np.testing.assert_allclose(one, saved_model_runner(saved_model)({"city": TEXT[:1]})["scores"], rtol=1e-5, atol=1e-6)
    expected = saved_model_runner(saved_model)({"city": TEXT})["scores"]
    for text in (np.char.encode(TEXT, "utf-8").astype(object), TEXT):  # gRPC string_val / REST JSON strings
        np.testing.assert_allclose(runtime.predict({"city": text})["scores"], expected, rtol=1e-5, atol=1e-6)
    assert runtime.metadata()["serving_default"].inputs["city"].dtype == "string"


def test_serving_onnx_runtime_reads_text_sent_as_bytes_or_str(tmp_path):
    """ONNX Runtime turns `bytes` objects into their repr and misreads `|S` arrays; the runtime decodes first."""
    import onnx
    from onnx import TensorProto, helper

    from tfship.serving.runtimes.base import ModelInputError
    from tfship.serving.runtimes.onnx import OnnxRuntime

    graph = helper.make_graph([helper.make_node("Identity", ["city"], ["echo"])], "echo",
                              [helper.make_tensor_value_info("city", TensorProto.STRING, [None, 1])],
                              [helper.make_tensor_value_info("echo", TensorProto.STRING, [None, 1])])
    version = tmp_path / "1"
    version.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), version / "model.onnx")
    runtime = OnnxRuntime(version)
    runtime.load()
    encoded = np.char.encode(TEXT, "utf-8")
    for text in (encoded.astype(object), encoded, TEXT, TEXT.astype(object)):
        assert runtime.predict({"city": text})["echo"].tolist() == TEXT.tolist(), text.dtype
    with pytest.raises(ModelInputError, match="not UTF-8 text"):
        runtime.predict({"city": np.array([[b"\xff\xfe"]], dtype=object)})
