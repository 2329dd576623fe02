"""The Python API (`tfship.ship`, the stages, `inspect`, `serve`, `Client`), run for real: the README's example
(a bring-your-own Keras model), the digits pipeline, and a server queried over gRPC and REST."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tfship
from tfship.core.errors import ConfigError, UnavailableError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}


def readme_example() -> str:
    """The README's first Python block: the API example the front page shows first."""
    match = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert match, "README.md shows no ```python example"
    return match.group(1)


def test_import_tfship_loads_no_tensorflow_and_names_the_api():
    code = ("import sys, tfship; api = [tfship.Client, tfship.serve, tfship.ship, tfship.inspect, tfship.train, "
            "tfship.ShipResult]; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'tf2onnx', 'onnx', 'jax')); print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True)
    assert done.stdout == "[]\n", done.stdout
    assert set(tfship.__all__) >= {"ship", "serve", "Client", "inspect", "export", "convert", "validate", "publish"}
    with pytest.raises(AttributeError, match="no attribute 'shipp'"):
        tfship.shipp  # noqa: B018


def test_ship_refuses_bad_arguments_by_name(tmp_path):
    with pytest.raises(ConfigError, match="model and data go together"):
        tfship.ship("model.keras")
    with pytest.raises(ConfigError, match="unknown setting 'trian'"):
        tfship.ship(runs_dir=tmp_path, trian={"epochs": 1})
    with pytest.raises(ConfigError, match="unknown key 'train.epoch'"):
        tfship.ship(runs_dir=tmp_path, train={"epoch": 1})
    with pytest.raises(ConfigError, match="expected a dict"):
        tfship.ship(runs_dir=tmp_path, train=3)


def test_client_names_an_unreachable_target():
    with pytest.raises(UnavailableError, match="127.0.0.1:9"):
        tfship.Client("http://127.0.0.1:9", "m", timeout_s=2).metadata()
    with pytest.raises(ConfigError, match="give model_name"):
        tfship.Client("127.0.0.1:9").metadata()


@pytest.mark.slow
def test_readme_example_ships_serves_and_answers_a_keras_model(tmp_path):
    """The README's example as a user runs it: a Keras model from memory, published, served, queried twice."""
    done = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, capture_output=True, text=True,
                          env=ENV, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "status: published" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / "models" / "tiny" / "1" / "model.onnx").is_file()
    assert done.stdout.count("'logits': array(") == 2, done.stdout  # gRPC and REST both answered
    inputs = [p for p in (tmp_path / "runs" / ".inputs").rglob("*") if p.is_file()]
    assert {p.name for p in inputs} == {"model.keras", "data.npz"}


@pytest.mark.slow
def test_ship_runs_the_digits_pipeline_and_each_stage_alone(tmp_path):
    result = tfship.ship(repository=tmp_path / "models", runs_dir=tmp_path / "runs", train={"epochs": 1},
                         convert={"tflite_modes": ["float32"]})
    assert result.ok and result.status == "published", result.errors
    assert result.published == (tmp_path / "models" / "digits" / "1").resolve()
    assert [a.name for a in result.artifacts] == ["saved_model", "onnx", "tflite_float32"]
    assert result.artifact("tflite_float32").path == result.published / "model.tflite"
    assert all(a.path.exists() for a in result.artifacts)
    assert [s.name for s in result.stages][-1] == "publish" and result.report.is_file()
    html, markdown = result._repr_html_(), result._repr_markdown_()
    assert html.count("<table>") == 2 and "<td>tflite_float32</td>" in html
    assert any(line.startswith("| onnx |") and "| published |" in line for line in markdown.splitlines()), markdown
    assert tfship.ShipResult.load(result.run).artifacts == result.artifacts
    with pytest.raises(KeyError, match="tflite_int8"):
        result.artifact("tflite_int8")

    validated = tfship.validate(result)
    assert validated.name == "validate" and validated.run == result.run
    assert {row["artifact"] for row in validated.fields["artifacts"]} == {"saved_model", "onnx", "tflite_float32"}
    assert "<table>" in validated._repr_html_()
    published = tfship.publish(result, repository=tmp_path / "models")
    assert published.fields["version"] == 2

    inspection = tfship.inspect(tmp_path / "models" / "digits")
    assert inspection.format == "saved_model"
    assert [t["name"] for t in inspection.signatures["serving_default"]["inputs"]] == ["image"]
    assert "signature_def['serving_default']" in inspection._repr_markdown_()


def test_ship_result_tables_escape_and_name_left_out_artifacts(tmp_path):
    """A partial run's result, from a summary as the runner writes it: HTML escapes, Markdown escapes `|`,
    `errors` names every left-out artifact with its stage."""
    from tfship.pipeline.orchestration.stages import RunFolder, StageRecord, StageStatus

    version = tmp_path / "models" / "m" / "3"
    summary = {"status": "partial", "status_line": "status: partial (1 of 2 artifacts left out: onnx)",
               "published": str(version), "version": 3,
               "artifacts": [{"artifact": "saved_model", "status": "published", "stage": "", "reason": "",
                              "file": "saved_model.pb", "required": True},
                             {"artifact": "onnx", "status": "left out", "stage": "validate",
                              "reason": "max |err| 0.3 > 1e-05 on <logits>", "file": "model.onnx", "required": False}]}
    records = [StageRecord("publish", StageStatus.OK, 1.25)]
    result = tfship.ShipResult.from_summary("m", RunFolder(tmp_path), summary, records)
    assert result.ok and result.version == 3 and result.report is None
    assert result.artifact("saved_model").path == version and result.artifact("onnx").path is None
    assert result.errors == ["onnx (validate): max |err| 0.3 > 1e-05 on <logits>"]
    assert "&lt;logits&gt;" in result._repr_html_() and "<logits>" not in result._repr_html_()
    assert "max \\|err\\| 0.3" in result._repr_markdown_()
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(result)
    text = console.export_text()
    assert "left out" in text and "│ publish │ ok" in text
