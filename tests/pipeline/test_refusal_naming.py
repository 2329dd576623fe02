"""Refusals name what the caller used: `--model` / `--data` / `--custom-objects` from the command line,
`tfship.ship(model=...)` / `data=` / `custom_objects=` from Python (one field, `ExportOnlyRequest.origin`); a
Lambda layer's refusal says what the user can do instead of Keras' `safe_mode=False`, which tfship cannot take."""

from __future__ import annotations

import numpy as np
import pytest

import tfship
from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import ConfigError, DatasetError, TfshipError
from tfship.pipeline.export_only.user_model import _keras_load_error, argument, load_user_data, load_user_model

KERAS_LAMBDA = ("Requested the deserialization of a `Lambda` layer with a Python `lambda` inside it. This carries "
                "a potential risk of arbitrary code execution and thus it is disallowed by default. If you trust "
                "the source of the saved model, you can pass `safe_mode=False` to the loading function in order "
                "to allow `Lambda` layer loading.")


def test_argument_names_the_flag_or_the_python_argument():
    assert argument("cli", "model", "m.keras") == "--model m.keras"
    assert argument("python", "model", "m.keras") == "tfship.ship(model='m.keras')"
    assert argument("cli", "custom_objects", ("a.b",)) == "--custom-objects a.b"
    assert argument("python", "custom_objects", ("a.b",)) == "tfship.ship(custom_objects=['a.b'])"


def test_python_caller_is_told_the_argument_not_the_flag(tmp_path):
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(TfshipError) as raised:
        tfship.ship(str(tmp_path / "missing.keras"), (x, np.zeros(4, np.int64)), runs_dir=tmp_path / "runs",
                    repository=tmp_path / "models")
    message = str(raised.value)
    assert "tfship.ship(model=" in message and "missing.keras" in message and "--model" not in message
    with pytest.raises(ConfigError, match=r"tfship\.ship\(custom_objects=\['no_such_module_xyz'\]\): cannot import"):
        load_user_model("m.keras", ("no_such_module_xyz",), origin="python")
    contract = Signature("serving_default", {"x": TensorSpec("float32", (None, 3))}, {})
    with pytest.raises(DatasetError, match=r"^tfship\.ship\(data='.*nothing\.npz'\): not found"):
        load_user_data(tmp_path / "nothing.npz", contract, 2, 0, origin="python")
    with pytest.raises(DatasetError, match=r"^--data .*nothing\.npz: not found"):
        load_user_data(tmp_path / "nothing.npz", contract, 2, 0)


def test_unknown_class_suggests_the_python_arguments():
    error = _keras_load_error("m.keras", None, (), "Scale", origin="python")
    assert "tfship.ship(custom_objects=['package.module'])" in str(error)
    assert "tfship.ship(model='package.module:function')" in str(error) and "--" not in str(error)


def test_keras_safe_mode_refusal_says_what_to_do_instead():
    for origin, custom in (("cli", "--custom-objects package.module"),
                           ("python", "tfship.ship(custom_objects=['package.module'])")):
        message = str(_keras_load_error("m.keras", ValueError(KERAS_LAMBDA), (), origin=origin))
        assert "Requested the deserialization of a `Lambda` layer" in message  # the cause is kept
        assert "safe_mode=False" not in message
        assert "rebuild the model without the Lambda layer" in message and custom in message


def test_lambda_file_is_refused_with_what_to_do(tmp_path):
    import keras

    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2.0, name="double")(inputs))
    model.save(tmp_path / "lam.keras")
    with pytest.raises(ConfigError) as raised:
        load_user_model(str(tmp_path / "lam.keras"), origin="python")
    message = str(raised.value)
    assert message.startswith("tfship.ship(model=") and "'Lambda' at" in message and "safe_mode=False" not in message
    assert "@keras.saving.register_keras_serializable" in message and "custom_objects=['package.module']" in message
