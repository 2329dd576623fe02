"""docs/training.md's "several inputs" and "recommender" recipes, run as written (in a temporary folder; the
query runs against a server on free ports instead of the page's 8500)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tfship

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"}
pytestmark = pytest.mark.slow


def recipe_blocks() -> dict[str, str]:
    """{name: text} of the fenced blocks marked `<!-- inputs-recipe: name -->` in docs/training.md."""
    text = (REPO_ROOT / "docs" / "training.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- inputs-recipe: (\S+) -->\n```\w*\n(.*?)```", text,
                                                         re.S)}


def _python(tmp_path: Path, name: str, code: str) -> str:
    (tmp_path / name).write_text(code)
    done = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _tfship(tmp_path: Path, line: str) -> str:
    words = line.split("#")[0].split()
    assert words[0] == "tfship"
    done = subprocess.run([str(Path(sys.executable).with_name("tfship")), *words[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=ENV | {"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_several_inputs_recipe_ships_and_query_reports_the_regression_metric(tmp_path):
    blocks = recipe_blocks()
    assert set(blocks) == {"several_inputs.py", "query", "write_prices.py", "prices.toml", "prices-run",
                           "make-data", "recommender.py", "recommender.toml", "recommender-run"}
    out = _python(tmp_path, "several_inputs.py", blocks["several_inputs.py"])
    assert "published ['saved_model', 'onnx', 'tflite_float32']" in out, out
    serve_line, query_line = blocks["query"].strip().splitlines()
    assert serve_line.startswith("tfship serve --repository models --model-name prices")
    with tfship.serve(tmp_path / "models", "prices") as served:
        query = query_line.replace("127.0.0.1:8500", served.grpc)
        printed = re.search(r"mae: (\d+\.\d{4}) on 500 rows", _tfship(tmp_path, query))
        rows = {name: value[:500] for name, value in np.load(next((tmp_path / "runs").rglob("data.npz"))).items()}
        labels = rows.pop("y")
        predicted = served.client("grpc").predict(rows)["prediction"][:, 0]
    assert printed, "no mae line"
    assert float(printed.group(1)) == pytest.approx(np.mean(np.abs(predicted - labels)), abs=1e-4)


def test_recommender_recipe_learns_the_signal_and_ships(tmp_path):
    blocks = recipe_blocks()
    _tfship(tmp_path, blocks["make-data"].strip())
    out = _python(tmp_path, "recommender.py", blocks["recommender.py"])
    found = re.search(r"held-out AUC (\d\.\d+), planted (\d\.\d+)", out)
    assert found, out
    auc, planted = float(found.group(1)), float(found.group(2))
    # 15,000 held-out rows: AUC's standard error is about 0.005, so 0.6 is far beyond chance (0.5); no model
    # can beat the planted logit the labels were drawn from by more than that noise.
    assert 0.6 < auc <= planted + 0.02, (auc, planted)
    assert "published ['saved_model', 'onnx', 'tflite_float32']" in out, out
    (tmp_path / "recommender.toml").write_text(blocks["recommender.toml"])
    _tfship(tmp_path, blocks["recommender-run"].strip())
    _, train = _train_json(tmp_path, "recommender_run")
    assert (train["task"], train["metric"]) == ("binary", "auc")
    assert 0.6 < train["test_auc"] <= planted + 0.02, (train["test_auc"], planted)


def _train_json(tmp_path: Path, model_name: str) -> tuple[Path, dict]:
    (run,) = [p for p in (tmp_path / "runs").iterdir() if f"-{model_name}-" in p.name]
    return run, json.loads((run / "train.json").read_text())


def test_several_inputs_recipe_through_tfship_run(tmp_path):
    blocks = recipe_blocks()
    _python(tmp_path, "write_prices.py", blocks["write_prices.py"])
    (tmp_path / "prices.toml").write_text(blocks["prices.toml"])
    python_line, run_line = blocks["prices-run"].strip().splitlines()
    assert python_line == "python write_prices.py"
    _tfship(tmp_path, run_line)
    run, train = _train_json(tmp_path, "prices_run")
    assert (train["task"], train["metric"]) == ("regression", "mae")
    with np.load(run / "held_out.npz") as archive:
        rows = {name: archive[name] for name in archive.files}
    labels = rows.pop("y")
    assert sorted(rows) == ["amenities", "district", "size"]
    # Predicting the mean gives MAE = mean |y - mean y| (about 0.75 here): the model must do far better.
    assert train["test_mae"] < 0.3 * float(np.mean(np.abs(labels - labels.mean())))
    with tfship.serve(tmp_path / "models", "prices_run") as served:
        printed = re.search(r"mae: (\d+\.\d{4}) on (\d+) rows", _tfship(
            tmp_path, f"tfship query --target {served.grpc} --model-name prices_run --run latest --config "
            "prices.toml --count 500"))
        predicted = served.client("grpc").predict(rows)["prediction"][:, 0]
    assert printed, "no mae line"
    assert int(printed.group(2)) == len(labels)  # the hash split's test rows (about 20 % of 2,000), all sent
    assert float(printed.group(1)) == pytest.approx(np.mean(np.abs(predicted - labels)), abs=1e-4)
