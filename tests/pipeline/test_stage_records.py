"""Stage records: each stage's typed record reads back from its run-folder file as the same record, a resumed run
fills the `StageContext`'s typed fields from them, and the artifacts' outcomes are decided once, by the publish
stage, and shown unchanged by the summary, the report, the manifest and `ShipResult`.

The run folder is written by hand (a SavedModel proto with one signature, no weights) so nothing trains, converts
or serves: only the publish stage reruns, on the records read back.
"""

from __future__ import annotations

import json

import pytest

from tfship.core import protocol
from tfship.core.contract import Signature, TensorSpec
from tfship.core.manifest import VersionManifest
from tfship.core.saved_model import to_signature_def
from tfship.pipeline.api.results import ShipResult
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import VariantOutcome
from tfship.pipeline.conversion.convert import ConvertResult
from tfship.pipeline.gate.compare import OutputParity
from tfship.pipeline.gate.serve_check import ServeCheckResult
from tfship.pipeline.gate.validate import ArtifactParity, ParityReport, ReferenceNoise
from tfship.pipeline.orchestration import outcomes, stage_publish
from tfship.pipeline.orchestration.chain import CHAIN, StageContext
from tfship.pipeline.orchestration.publish import PublishResult
from tfship.pipeline.orchestration.records import ExportRecord, TrainRecord
from tfship.pipeline.orchestration.report import write_report
from tfship.pipeline.orchestration.run import execute
from tfship.pipeline.orchestration.stages import RunFolder


def _parity_row(artifact: str, passed: bool, reason: str = "") -> ArtifactParity:
    output = OutputParity("logits", 1e-6, 1e-5, "atol 1e-05", passed, "", (3, 1, 0))
    return ArtifactParity(artifact, "onnx" if artifact == "onnx" else "saved_model", "float32", 1024, 97.5, 100.0,
                          0.25, (output,), (1, 40), passed, reason, 97.5, 0, 0, 1e-6)


PARITY = ParityReport(97.5, 40, (_parity_row("saved_model", True), _parity_row("onnx", True),
                                 _parity_row("tflite_float32", False, "output 'logits' differs by 0.5")),
                      required=("onnx",), noise={"logits": ReferenceNoise(1e-7, (1, 40))},
                      signatures={"onnx": {}})
CONVERTED = ConvertResult((VariantOutcome("onnx", "produced", path="model.onnx", size_bytes=1024),
                           VariantOutcome("tflite_float32", "produced", path="model.tflite", size_bytes=900),
                           VariantOutcome("tflite_int8", "refused", "refused: needs Flex ops ['Erf']")),
                          {"budget_bytes": 0, "rows": []})
SERVED = ServeCheckResult({"saved_model": {"passed": True, "reason": "", "signatures": {}},
                           "onnx": {"passed": True, "reason": "", "signatures": {}}}, ("onnx",))


def _as_json(value):
    return json.loads(json.dumps(value))


def test_each_record_reads_back_from_its_json_as_the_same_record():
    parity = _as_json(PARITY.to_json())
    assert ParityReport.from_json(parity) == PARITY and _as_json(ParityReport.from_json(parity).to_json()) == parity
    assert ConvertResult.from_json(CONVERTED.to_json(), CONVERTED.memory) == CONVERTED
    assert ServeCheckResult.from_json(_as_json(SERVED.to_json())) == SERVED
    older = {k: v for k, v in SERVED.to_json().items() if k != "required"} | {"passed": False, "left_out": {"x": "no"}}
    assert not ServeCheckResult.from_json(older | {"artifacts": {"x": {"passed": False, "reason": "no"}}}).passed
    train = TrainRecord({"test_accuracy": 0.9, "epochs": 1}, ({"epoch": 0, "loss": 1.0},))
    assert TrainRecord.from_json(_as_json(train.to_json())) == train and train.test_accuracy == 0.9


def _saved_model(folder) -> None:
    proto = protocol.SavedModel()
    graph = proto.meta_graphs.add()
    graph.meta_info_def.tags.append("serve")
    signature = Signature.of("serving_default", (TensorSpec(dtype="float32", shape=(None, 8, 8, 1), name="image"),),
                             (TensorSpec(dtype="float32", shape=(None, 10), name="logits"),))
    graph.signature_def["serving_default"].CopyFrom(to_signature_def(signature))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "saved_model.pb").write_bytes(proto.SerializeToString())


def _finished_run(tmp_path) -> tuple[StageContext, RunFolder]:
    """A run folder whose train ... serve-check records are complete and valid; publish has not run."""
    config = load_config(None, {"run.runs_dir": str(tmp_path / "runs"), "publish.repository": str(tmp_path / "models"),
                                "convert.required": ["onnx"]})
    run = RunFolder.create(config.run.runs_dir, config.run.model_name)
    run.write_json("config.json", config.model_dump(mode="json", by_alias=True))
    (run.root / "model.keras").write_bytes(b"")  # train is complete (never loaded: export does not rerun)
    run.write_json("train.json", TrainRecord({"test_accuracy": 0.93, "epochs": 1, "steps": 10, "train_step_traces": 1,
                                              "jit_compile": False, "seconds": 1.0}, ()).to_json())
    _saved_model(run.artifacts)
    run.write_json("audit.json", {"passed": True, "signatures": ["serving_default"], "violations": [],
                                  "op_histogram": {"MatMul": 1}, "variables": [], "behaviour": None})
    run.write_json("export.json", {"recurrent": {}})
    run.write_json("convert.json", CONVERTED.to_json())
    run.write_json("convert_memory.json", CONVERTED.memory)
    run.write_json("parity.json", PARITY.to_json())
    run.write_json("serve_check.json", SERVED.to_json())
    _saved_model(run.candidate_repository / config.run.model_name / "1")  # the serve-check's candidate
    return StageContext(config, run, config.publish.repository, resume_training=True), run


@pytest.fixture()
def counted(monkeypatch):
    calls = []
    decide = outcomes.artifact_outcomes

    def counting(*args, **kwargs):
        calls.append(args)
        return decide(*args, **kwargs)

    monkeypatch.setattr(stage_publish, "artifact_outcomes", counting)
    return calls


def test_a_resumed_run_reads_typed_records_and_decides_outcomes_once(tmp_path, counted):
    ctx, run = _finished_run(tmp_path)
    result = execute(ctx, resume=True)

    assert isinstance(ctx.train, TrainRecord) and ctx.train.test_accuracy == 0.93
    assert isinstance(ctx.export, ExportRecord) and ctx.export.signatures == ("serving_default",)
    assert ctx.convert == CONVERTED and ctx.validate == PARITY and ctx.serve_check == SERVED
    assert isinstance(ctx.publish, PublishResult) and result.published is ctx.publish
    stages = {s["name"]: s for s in json.loads((run.root / "stages.json").read_text())}
    assert [n for n, s in stages.items() if s["summary"].get("skipped")] == [
        s.name for s in CHAIN if s.name not in ("data", "publish")]

    assert len(counted) == 1  # the publish stage decided, nothing recomputed after it
    decided = [o.to_json() for o in ctx.publish.outcomes]
    assert {o["artifact"]: (o["status"], o["stage"]) for o in decided} == {
        "saved_model": ("published", ""), "onnx": ("published", ""), "tflite_float32": ("left out", "validate"),
        "tflite_int8": ("left out", "convert")}
    manifest = json.loads((result.published.version_dir / "manifest.json").read_text())
    assert [{k: row[k] for k in decided[0]} for row in manifest["artifacts"]] == decided
    assert result.summary["artifacts"] == decided
    assert VersionManifest.read(result.published.version_dir) == ctx.publish.manifest  # one writer, one reader
    onnx = ctx.publish.manifest.artifact("onnx")
    assert (onnx.backend, onnx.family, onnx.signatures) == ("onnx", "float32", ("serving_default",))
    reference, listed = ctx.publish.manifest.artifact("saved_model"), ctx.publish.manifest.file("saved_model.pb")
    assert (reference.backend, reference.family) == ("saved_model", "float32")
    assert (reference.size_bytes, reference.sha256) == (listed.size_bytes, listed.sha256) and listed.size_bytes > 0
    assert manifest["metrics"]["test_accuracy"] == 0.93 and manifest["serve_check"] == _as_json(SERVED.to_json())
    assert result.summary["status"] == "partial" and _as_json(result.summary["parity"]) == _as_json(PARITY.to_json())
    write_report(run, result.summary)
    assert json.loads((run.root / "report.json").read_text())["artifacts"] == decided
    shipped = ShipResult.from_summary("digits", run, result.summary, list(result.records), ctx.publish.outcomes)
    assert [(a.name, a.outcome, a.stage, a.reason) for a in shipped.artifacts] == [
        (o.artifact, o.status, o.stage, o.reason) for o in ctx.publish.outcomes]
    assert ShipResult.load(run.root).artifacts == shipped.artifacts

    again = StageContext(ctx.config, run, ctx.config.publish.repository)
    resumed = execute(again, resume=True)  # now complete: publish's record is read back, not decided again
    assert len(counted) == 1 and [o.to_json() for o in again.publish.outcomes] == decided  # full text: reasons/
    assert resumed.summary["artifacts"] == decided and again.publish.version == ctx.publish.version
