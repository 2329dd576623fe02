"""The conversion registry is the one source of what the pipeline knows about an artifact format.

- Every registered format's spec (`core.formats.ArtifactFormat`) drives its file name, serving backend, tolerance
  family, enable key, peak-memory model and converter family, and a change to the spec's family table changes the
  bound its artifact is held to.
- A toy format registered in this test process (a SavedModel folder with every output moved by 5e-3, served by the
  `saved_model` backend, judged as float16, enabled by `convert.formats`) is converted by the convert stage, planned
  by the memory budget with its own peak model, judged by the parity gate with its own family's table (passed at
  float16's default bound, refused when that table's `atol` is tightened) and given its own reason for the
  signatures it does not carry: no pipeline module names it.
- No kind-string branch (`"tflite"`, `"onnx"`, `"tfjs"`, the mode names compared with `==`) remains under
  `pipeline/`; the file names are derived in the format packages alone.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfship.core.errors import ConfigError
from tfship.core.formats import MIB, ArtifactFormat, ConversionJob, PeakModel, ToleranceFamily, VariantOutcome
from tfship.core.saved_model import read_signatures
from tfship.core.statuses import ConversionStatus
from tfship.pipeline.config import ConvertSection, load_config
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, artifact_kinds, enabled_kinds
from tfship.pipeline.conversion.convert import convert_artifacts
from tfship.pipeline.conversion.memory_budget import family, peak_model
from tfship.pipeline.conversion.registry import (
    FORMAT_PACKAGES,
    check_required,
    format_of,
    register_format,
    unregister_format,
)
from tfship.pipeline.gate.signatures import signature_carriage
from tfship.pipeline.gate.validate import tolerance_for, validate_artifacts

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
SHIFT = 5e-3  # the toy format's error on every output: within float16's 1e-2 bound, far outside float32's 1e-5
INPUTS = {"x": np.random.default_rng(3).standard_normal((40, 4)).astype(np.float32)}


def test_every_format_package_is_registered_and_names_are_unique():
    exported = [spec for package in FORMAT_PACKAGES for spec in package.FORMATS]
    assert [spec.name for spec in exported] == list(artifact_kinds())[:len(exported)]
    assert {spec.package for spec in exported} == {"onnx", "tflite", "tfjs"}
    assert len({spec.filename for spec in exported}) == len(exported)  # no two formats write one file
    with pytest.raises(ConfigError, match="already registered"):
        register_format(exported[0])
    with pytest.raises(ConfigError, match="already registered"):
        register_format(replace(exported[0], name=SAVED_MODEL))


@pytest.mark.parametrize("name", sorted(artifact_kinds()))
def test_the_spec_drives_file_backend_family_enable_key_and_peak(name, tmp_path):
    spec = artifact_kinds()[name]
    artifact = spec.artifact(tmp_path)
    assert (artifact.name, artifact.kind, artifact.mode, artifact.path) == (
        name, spec.backend, spec.family, tmp_path / spec.filename)
    assert isinstance(spec.family, ToleranceFamily) and spec.filename in spec.files
    assert peak_model(name) is spec.peak and family(name) == spec.package
    if spec.file_option:  # the backend is told which file to load, and serve-check serves that file
        assert spec.runtime_options == {spec.file_option: spec.filename} and spec.filename in spec.serve_flags
    # enabled by its own key: off, it is not converted and requiring it names the key that enables it
    value = (spec.enable_value,) if spec.enable_value is not None else True
    other = ("float32",) if spec.enable_key == "tflite_modes" and spec.enable_value != "float32" else \
        ("float16",) if spec.enable_key == "tflite_modes" else ()
    on = ConvertSection(**{spec.enable_key: value})
    off = ConvertSection(**{spec.enable_key: other if spec.enable_value is not None else False})
    assert spec in enabled_kinds(on) and spec not in enabled_kinds(off)
    check_required(replace_required(on, name))
    with pytest.raises(ConfigError, match=rf"{name}.*{spec.enable_setting}"):
        check_required(replace_required(off, name))
    # its family's table is the bound it is held to: tightening that table tightens it, another table does not
    settings = load_config().parity
    tight = load_config(None, {f"validate.{spec.family.value}.atol": 1e-9}).parity
    other_family = next(f for f in ToleranceFamily if f is not spec.family)
    loose_elsewhere = load_config(None, {f"validate.{other_family.value}.atol": 0.5}).parity
    assert tolerance_for(spec.family, settings).atol == settings.family(spec.family).atol
    assert tolerance_for(spec.family, tight).atol == 1e-9
    assert tolerance_for(spec.family, loose_elsewhere) == tolerance_for(spec.family, settings)


def replace_required(settings: ConvertSection, name: str) -> ConvertSection:
    return settings.model_copy(update={"required": (name,)})


def test_an_unknown_format_in_convert_formats_is_refused_by_name():
    with pytest.raises(ConfigError, match="convert.formats.*'nosuch'"):
        check_required(ConvertSection(formats=("nosuch",)))


def test_old_tolerance_keys_are_refused_naming_the_new_key(tmp_path):
    config = tmp_path / "old.toml"
    config.write_text("[validate]\nint8_tolerance = 0.2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"old.toml: key 'validate.int8_tolerance' moved: set validate.int8.atol"):
        load_config(config)
    with pytest.raises(ConfigError, match=r"'validate.min_top1_agreement' moved: set validate.<family>"):
        load_config(None, {"validate.min_top1_agreement": {"int8": 80.0}})
    partial = load_config(None, {"validate.int8.atol": 0.2}).parity  # the new key; the rest keeps int8's defaults
    assert partial.int8.atol == 0.2 and partial.int8.outlier_fraction == load_config().parity.int8.outlier_fraction


class Linear(tf.Module):
    def __init__(self, shift: float):
        super().__init__()
        self.w = tf.Variable(WEIGHTS)
        self.shift = shift

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        return {"scores": tf.matmul(x, self.w) + self.shift}


def _convert_toy(job: ConversionJob) -> VariantOutcome:
    """The toy converter: the same graph with every output moved by SHIFT, as a SavedModel folder `toy_model`."""
    path = job.version_dir / "toy_model"
    shutil.rmtree(path, ignore_errors=True)
    module = Linear(SHIFT)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return VariantOutcome("toy", ConversionStatus.PRODUCED, "", str(path), Artifact("toy", "", "", path).size_bytes())


TOY = ArtifactFormat("toy", package="toy", backend="saved_model", family=ToleranceFamily.FLOAT16,
                     filename="toy_model", enable_key="formats", enable_value="toy", convert=_convert_toy,
                     peak=PeakModel(7 * MIB, 3.0), one_signature_reason="the toy format holds serving_default alone")


@pytest.fixture
def toy():
    register_format(TOY)
    yield TOY
    unregister_format(TOY.name)


def test_a_toy_format_registered_here_is_converted_planned_and_judged_end_to_end(toy, tmp_path):
    version = tmp_path / "1"
    module = Linear(0.0)
    tf.saved_model.save(module, str(version), signatures={"serving_default": module.serve})
    contract = read_signatures(version)["serving_default"]
    settings = ConvertSection(onnx=False, tflite_modes=("float32",), formats=("toy",), max_workers=1)
    check_required(settings.model_copy(update={"required": ("toy",)}))
    result = convert_artifacts(version, contract, settings, {"x": INPUTS["x"][:8]}, {"x": INPUTS["x"][:2]})
    assert result.produced == ("tflite_float32", "toy"), result.outcomes
    row = next(r for r in result.memory["rows"] if r["name"] == "toy")
    assert row["predicted_bytes"] == toy.peak.predict(result.memory["weight_bytes"])  # its own peak model

    reference = Artifact(SAVED_MODEL, SAVED_MODEL, ToleranceFamily.FLOAT32, version)
    candidate = format_of("toy").artifact(version)
    passed = validate_artifacts(reference, [candidate], contract, INPUTS, None, load_config().parity)
    judged = next(r for r in passed.rows if r.artifact == "toy")
    assert judged.passed and judged.mode == "float16", judged.reason
    assert judged.outputs[0].max_abs_error == pytest.approx(SHIFT, rel=1e-3)
    tight = load_config(None, {"validate.float16.atol": 1e-4, "validate.float16.rtol": 0.0}).parity
    refused = next(r for r in validate_artifacts(reference, [candidate], contract, INPUTS, None, tight).rows
                   if r.artifact == "toy")
    assert not refused.passed and "validate.float16.atol" in refused.reason, refused.reason

    carriage = signature_carriage(candidate, ["serving_default", "score"])
    assert "serving_default" in carriage and carriage.left_out == {"score": toy.one_signature_reason}


# A comparison or lookup keyed on a format's name or its backend's name, in pipeline code.
KIND_WORDS = {"tflite", "onnx", "tfjs", "tflite_float32", "tflite_float16", "tflite_dynamic_range", "tflite_int8",
              "tfjs_float16", "tfjs_uint8", "float16", "dynamic_range", "int8", "uint8"}
# A format's file name spelled out (`model_int8.tflite`, f"model_{mode}.tflite", ".onnx"): only its package may.
FILE_NAME = re.compile(r"[\w.*{}-]*\.(tflite|onnx)(\.data)?")


def _kind_branches(path: Path) -> list[str]:
    where, found = (path.relative_to(REPO) if path.is_relative_to(REPO) else path.name), []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            words = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
            found += [f"{where}:{node.lineno}: compares with {w!r}" for w in words
                      if w in KIND_WORDS]
        elif isinstance(node, ast.Dict):
            found += [f"{where}:{node.lineno}: keyed by {k.value!r}" for k in node.keys
                      if isinstance(k, ast.Constant) and k.value in KIND_WORDS]
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if FILE_NAME.fullmatch(text):
                found.append(f"{where}:{node.lineno}: derives a file name {text!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and FILE_NAME.fullmatch(node.value):
            found.append(f"{where}:{node.lineno}: names a file {node.value!r}")
    return found


def test_no_kind_string_branch_remains_under_pipeline():
    found = [hit for path in sorted((REPO / "pipeline").rglob("*.py")) for hit in _kind_branches(path)]
    assert found == [], "\n".join(found)


def test_the_kind_branch_scan_finds_a_planted_branch(tmp_path):
    planted = tmp_path / "planted_kind_branch.py"
    planted.write_text('def f(a, mode):\n    if a.kind == "tflite":\n        return f"model_{mode}.tflite"\n'
                       '    return {"onnx": 1}.get(a.name, "model_int8.tflite")\n', encoding="utf-8")
    found = _kind_branches(planted)
    assert [hit.split(": ", 1)[1].split()[0] for hit in found].count("compares") == 1, found
    assert any("keyed by 'onnx'" in hit for hit in found) and any("'model_{}.tflite'" in hit for hit in found)
    assert any("'model_int8.tflite'" in hit for hit in found), found


def test_the_report_compares_sizes_within_a_format_package():
    from tfship.pipeline.orchestration.report import _size_ratio

    rows = [{"artifact": "saved_model", "size_bytes": 500}, {"artifact": "onnx", "size_bytes": 120},
            {"artifact": "tflite_float32", "size_bytes": 100}, {"artifact": "tflite_int8", "size_bytes": 26},
            {"artifact": "tfjs_uint8", "size_bytes": 30}]
    assert _size_ratio(rows[3], rows) == "26.0% of tflite_float32"
    assert [_size_ratio(row, rows) for row in (rows[0], rows[1], rows[2], rows[4])] == ["-"] * 4  # no own float32
    with_tfjs = [*rows, {"artifact": "tfjs", "size_bytes": 120}]
    assert _size_ratio(rows[4], with_tfjs) == "25.0% of tfjs"
