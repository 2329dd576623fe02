"""A Keras file's config is judged before Keras deserialises it (`pipeline.export_only.keras_config`): Lambda layers,
TFSMLayer and classes from modules that are not Keras's (unless registered) are refused naming them; a plain
model with Keras' own layers loads."""

from __future__ import annotations

import json
import zipfile

import keras
import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.pipeline.export_only.user_model import load_user_model


def _plain(path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(3, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)], name="plain")
    model.save(path)
    return path


def _rewrite(source, target, change):
    """Copy the .keras zip `source` to `target` with `change(config)` applied to its config.json."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "config.json":
                config = json.loads(data)
                change(config)
                data = json.dumps(config).encode()
            out.writestr(item, data)
    return target


def test_a_plain_keras_file_loads(tmp_path):
    model = load_user_model(str(_plain(tmp_path / "plain.keras")))
    assert model(np.ones((1, 4), np.float32)).shape == (1, 2)


def test_a_lambda_layer_is_refused_before_loading(tmp_path):
    model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Lambda(lambda t: t * 2, name="double")])
    model.save(tmp_path / "lambda.keras")
    with pytest.raises(ConfigError, match=r"refused before loading: 'Lambda' at config/\S*double: a Lambda layer runs "
                                          r"Python code"):
        load_user_model(str(tmp_path / "lambda.keras"))


def test_a_tfsm_layer_is_refused_before_it_loads_a_saved_model(tmp_path):
    def change(config):
        layers = config["config"]["layers"]
        layers[1] = {"module": "keras.layers", "class_name": "TFSMLayer", "registered_name": None,
                     "config": {"name": "outside", "filepath": "/etc/some_saved_model", "call_endpoint": "serve"}}

    path = _rewrite(_plain(tmp_path / "plain.keras"), tmp_path / "tfsm.keras", change)
    with pytest.raises(ConfigError, match=r"'TFSMLayer' at config/\S*outside: a TFSMLayer loads a SavedModel from a "
                                          r"path on the host"):
        load_user_model(str(path))


def test_a_class_from_another_module_is_refused_unless_registered(tmp_path):
    def change(config):
        config["config"]["layers"][1]["config"]["activation"] = {
            "module": "os", "class_name": "function", "config": "system", "registered_name": "system"}

    path = _rewrite(_plain(tmp_path / "plain.keras"), tmp_path / "os.keras", change)
    with pytest.raises(ConfigError, match=r"Could not locate class 'function' from module 'os' \(a custom class"):
        load_user_model(str(path))
