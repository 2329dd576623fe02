"""`tfship query` without `--run` sends the served model's own rows: the newest run that published that model
name, else the config's data when the config is that model's; another model's digits are never sent: the
command refuses in one line, before any request, naming `--run` and `--samples`."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.conftest import run_tfship
from tfship.core.errors import ConfigError
from tfship.pipeline.orchestration.held_out import held_out_rows, served_model_run


def _run(runs, name, model_name, published=True):
    folder = runs / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"run": {"model_name": model_name}}))
    if published:
        (folder / "summary.json").write_text("{}")
    return folder


def test_served_model_run_is_the_newest_run_that_published_that_name(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "20260101T000000Z", "breast_cancer")
    newest = _run(runs, "20260102T000000Z", "breast_cancer")
    _run(runs, "20260103T000000Z", "breast_cancer", published=False)  # failed before publishing
    _run(runs, "20260104T000000Z", "digits")
    (runs / ".inputs").mkdir()
    assert served_model_run(runs, "breast_cancer") == newest
    assert served_model_run(runs, "other") is None and served_model_run(tmp_path / "none", "x") is None


def _config(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(f'[run]\nruns_dir = "{tmp_path / "runs"}"\n')
    return path


def test_another_model_s_rows_are_refused_in_one_line(tmp_path):
    _run(tmp_path / "runs", "20260104T000000Z", "digits")
    with pytest.raises(ConfigError) as raised:
        held_out_rows(4, _config(tmp_path), None, "breast_cancer")
    message = str(raised.value)
    assert "no run under" in message and "'breast_cancer'" in message and "--run" in message
    assert "--samples" in message and "\n" not in message


def test_cli_refuses_before_sending(tmp_path):
    done = run_tfship("query", "--target", "127.0.0.1:9", "--model-name", "breast_cancer", "--config",
                      str(_config(tmp_path)), "--timeout-s", "2")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "no run under" in line]
    assert lines and "pass --run RUN" in lines[0] and "INVALID_ARGUMENT" not in done.stderr, done.stderr


@pytest.mark.slow
def test_query_without_run_sends_the_served_model_s_own_rows(tmp_path):
    """A real served model (not digits): `tfship query --model-name NAME` finds the run that published NAME and
    sends its rows, reporting its accuracy on all of them."""
    import re

    import keras
    import numpy as np

    import tfship

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    features = keras.Input((4,), name="features")
    model = keras.Model(features, keras.layers.Dense(2, name="logits")(features), name="tumours")
    result = tfship.ship(model, (x, y), runs_dir=tmp_path / "runs", repository=tmp_path / "models",
                         convert={"tflite_modes": ["float32"], "onnx": False})
    assert result.ok, result.errors
    with tfship.serve(tmp_path / "models") as served:
        done = run_tfship("query", "--target", served.grpc, "--model-name", "tumours", "--config",
                          str(_config(tmp_path)), "--count", "40", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"accuracy: \d\.\d{4} on 40 rows", done.stdout), done.stdout[-2000:]
