"""Export-only runs on the default config publish under the model's own name, never over the digits model."""

from __future__ import annotations

import pytest

from tfship.pipeline.api.ship import model_name_from
from tfship.pipeline.cli.app import build_parser
from tfship.pipeline.cli.arguments import config_from_args


@pytest.mark.parametrize(("model", "expected"), [
    ("path/to/tiny.keras", "tiny"),
    ("tests.pipeline.user_models:multi_input", "multi_input"),
    ("my model (v2).h5", "my_model__v2_"),
])
def test_name_comes_from_the_model(model, expected):
    assert model_name_from(model) == expected


def test_saved_model_folder_named_by_version_takes_its_parents_name(tmp_path):
    (tmp_path / "resnet" / "3").mkdir(parents=True)
    assert model_name_from(str(tmp_path / "resnet" / "3")) == "resnet"
    assert model_name_from(str(tmp_path / "resnet")) == "resnet"


@pytest.mark.parametrize(("extra", "expected"), [
    ((), "tiny"),
    (("--model-name", "fraud"), "fraud"),
    (("--set", "run.model_name=churn"), "churn"),
    (("--config", "configs/digits.toml"), "digits"),  # an explicit config keeps its own name
])
def test_export_only_name_unless_chosen(extra, expected):
    args = build_parser().parse_args(["run", "--model", "tiny.keras", "--data", "d.npz", *extra])
    assert config_from_args(args).run.model_name == expected


def test_training_runs_keep_the_configs_name():
    assert config_from_args(build_parser().parse_args(["run"])).run.model_name == "digits"
    assert config_from_args(build_parser().parse_args(["run", "--model-name", "d2"])).run.model_name == "d2"

