"""The pipeline's stages as functions of (config, run folder, data, the earlier stages' typed records).

Each stage writes its record into the run folder (`pipeline.orchestration.records`); a record not handed in
(None) is read back from there, so every stage also runs alone from the CLI.

Run folder contents: `model.keras` (train), `artifacts/` (a complete TF Serving version folder:
SavedModel at its root, `model.onnx`, `model*.tflite`, written by export and convert), and one
record per stage (`train.json`, `audit.json` + `export.json`, `convert.json`, `parity.json`, `serve_check.json`).

Each stage's glue lives in a module of its own; this module names them all in one place (what
`pipeline.orchestration.chain` and the CLI call):

| stage | function | module |
|---|---|---|
| train | `train_step_stage` | `stage_train` |
| export | `export_stage`, `export_user_stage` | `stage_export` |
| convert | `convert_stage` | `stage_convert` |
| validate | `validate_stage` | `stage_validate` |
| serve-check | `serve_check_stage`, `signature_probes` | `stage_serve_check` |
| publish | `publish_stage`, `signatures_carried`, `version_manifest` | `stage_publish` |
| (shared) | `as_eval_data`, `read_contract`, `produced_artifacts` | `stage_inputs` |
"""

from __future__ import annotations

from tfship.pipeline.orchestration.stage_convert import convert_stage
from tfship.pipeline.orchestration.stage_export import ExportOutcome, export_stage, export_user_stage
from tfship.pipeline.orchestration.stage_inputs import as_eval_data, produced_artifacts, read_contract
from tfship.pipeline.orchestration.stage_publish import publish_stage, signatures_carried, version_manifest
from tfship.pipeline.orchestration.stage_serve_check import (
    GOLDEN_SAMPLES,
    SERVE_BATCH_SIZES,
    serve_check_stage,
    signature_probes,
)
from tfship.pipeline.orchestration.stage_train import train_step_stage
from tfship.pipeline.orchestration.stage_validate import validate_stage

__all__ = ["GOLDEN_SAMPLES", "SERVE_BATCH_SIZES", "ExportOutcome", "as_eval_data", "convert_stage", "export_stage",
           "export_user_stage", "produced_artifacts", "publish_stage", "read_contract", "serve_check_stage",
           "signature_probes", "signatures_carried", "train_step_stage", "validate_stage", "version_manifest"]
