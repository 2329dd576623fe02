"""`--model model.keras` with a registered custom layer: without its module Keras' "Could not locate class"
becomes a message naming `--custom-objects` and the `module:function` route; with `--custom-objects MODULE`
the module is imported first and the model loads and computes what it computed when saved."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship
from tfship.core.errors import ConfigError
from tfship.pipeline.export_only.user_model import load_user_model

MODULE = "tfship_test_custom_layers"
SOURCE = textwrap.dedent('''
    import keras

    @keras.saving.register_keras_serializable(package="tfship_test")
    class Scale(keras.layers.Layer):
        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x):
            return x * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((3,), name="features")
        hidden = Scale(3.0, name="scale")(keras.layers.Dense(4, name="hidden")(inputs))
        return keras.Model(inputs, keras.layers.Dense(2, name="scores")(hidden))
''')
X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(folder holding the module, model.keras, the outputs at save time), saved by another process."""
    folder = tmp_path_factory.mktemp("custom")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    (folder / "empty_module.py").write_text("VALUE = 1\n")
    np.save(folder / "x.npy", X)
    script = (f"import numpy as np, {MODULE} as m; model = m.build(); model.save('model.keras'); "
              "np.save('expected.npy', np.asarray(model(np.load('x.npy'))))")
    subprocess.run([sys.executable, "-c", script], cwd=folder, check=True, capture_output=True, timeout=300)
    return folder, folder / "model.keras", np.load(folder / "expected.npy")


def test_unknown_custom_class_names_the_custom_objects_flag(saved, monkeypatch):
    folder, model, _ = saved
    assert MODULE not in sys.modules
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ConfigError) as raised:
        load_user_model(str(model))
    message = str(raised.value)
    assert "Could not locate class 'Scale'" in message and "--custom-objects package.module" in message
    assert "module:function" in message
    with pytest.raises(ConfigError, match=r"Could not locate class 'Scale' .*imported \['empty_module'\], which did not register it"):
        load_user_model(str(model), ("empty_module",))
    with pytest.raises(ConfigError, match=r"--custom-objects no_such_module_here: cannot import it"):
        load_user_model(str(model), ("no_such_module_here",))


def test_custom_objects_module_is_imported_before_loading(saved, monkeypatch):
    folder, model, expected = saved
    monkeypatch.syspath_prepend(str(folder))
    loaded = load_user_model(str(model), (MODULE,))
    assert type(loaded.get_layer("scale")).__name__ == "Scale" and loaded.get_layer("scale").factor == 3.0
    np.testing.assert_allclose(np.asarray(loaded(X)), expected, rtol=1e-6)


def test_cli_points_to_custom_objects(saved, tmp_path):
    folder, model, _ = saved
    np.savez(tmp_path / "data.npz", features=X)
    completed = run_tfship("run", "--model", str(model), "--data", str(tmp_path / "data.npz"),
                           "--runs-dir", str(tmp_path / "runs"), "--repository", str(tmp_path / "models"),
                           cwd=folder)
    assert completed.returncode == 2
    assert "--custom-objects package.module" in completed.stderr and "Scale" in completed.stderr
    assert not (tmp_path / "models").exists()
