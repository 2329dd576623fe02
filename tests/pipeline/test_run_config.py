"""A run folder's `config.json` is one typed record (`pipeline.orchestration.run_config.RunConfig`): written by every
way a run starts, read back by resume, a stage run alone, the chain and `ShipResult.load`; a bad one is refused
naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfship.core.errors import ConfigError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.export_only.user_model import ExportOnlyRequest
from tfship.pipeline.orchestration.chain import stored_run_config
from tfship.pipeline.orchestration.resume import resolve_run, stored_config
from tfship.pipeline.orchestration.run_config import CONFIG_FILE, RunConfig
from tfship.pipeline.orchestration.stages import RunFolder


def _config() -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"model_name": "fraud", "seed": 7},
                                          "convert": {"representative_samples": 64}})


def test_a_run_config_round_trips_with_and_without_an_export_only_request(tmp_path):
    run = RunFolder(tmp_path / "run-1")
    run.root.mkdir()
    RunConfig(_config()).write(run)
    assert RunConfig.read(run) == RunConfig(_config())
    assert stored_config(run) == _config() and stored_run_config(run).export_only is None
    request = ExportOnlyRequest("model.keras", tmp_path / "data.npz", ("serve", "gpu"), ("my.layers",))
    RunConfig(_config(), request).write(run)
    stored = RunConfig.read(run)
    assert stored.export_only == request and stored.config == _config()
    assert json.loads((run.root / CONFIG_FILE).read_text())["export_only"]["data"] == str(tmp_path / "data.npz")
    assert resolve_run(run.root, tmp_path) == RunFolder(run.root.resolve())


def test_keys_the_config_does_not_know_are_left_out_when_reading(tmp_path):
    run = RunFolder(tmp_path)
    payload = RunConfig(_config()).to_json() | {"written_by_a_newer_tfship": {"x": 1}}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(payload))
    assert RunConfig.read(run).config == _config()


@pytest.mark.parametrize(("change", "field"), [
    (lambda c: c["run"].update(seed="seven"), "'run.seed'"),
    (lambda c: c.update(export_only={"model": "m.keras"}), "'export_only'"),
])
def test_a_bad_run_config_is_refused_naming_the_file_and_the_field(tmp_path, change, field):
    payload = RunConfig(_config()).to_json()
    change(payload)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(payload))
    with pytest.raises(ConfigError) as refused:
        RunConfig.read(RunFolder(tmp_path))
    assert str(tmp_path / CONFIG_FILE) in str(refused.value) and field in str(refused.value)
    assert stored_run_config(RunFolder(tmp_path)) is None  # the chain's lenient read: no config to use


def test_a_missing_or_unparsable_run_config_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match="config.json does not exist"):
        RunConfig.read(RunFolder(tmp_path))
    (tmp_path / CONFIG_FILE).write_text("{")
    with pytest.raises(ConfigError, match=f"{tmp_path / CONFIG_FILE}: cannot read it as JSON"):
        RunConfig.read(RunFolder(tmp_path))
    assert not RunConfig.exists(Path(tmp_path) / "elsewhere")
