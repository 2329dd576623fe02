"""Export-only runs on the default config publish under the model's own name, never over the digits model."""

from __future__ import annotations

import pytest

from tfship.core.errors import ConfigError
from tfship.pipeline.api.ship import model_name_from, repository_name
from tfship.pipeline.cli.app import build_parser
from tfship.pipeline.cli.arguments import config_from_args


@pytest.mark.parametrize(("model", "expected"), [
    ("path/to/tiny.keras", "tiny"),
    ("tests.pipeline.user_models:multi_input", "multi_input"),
    ("my model (v2).h5", "my_model__v2_"),
])
def test_name_comes_from_the_model(model, expected):
    assert model_name_from(model) == expected


@pytest.mark.parametrize(("keras_name", "expected"), [
    ("mobilenetv2_0.35_96", "mobilenetv2_0.35_96"),  # keras.applications.MobileNetV2(alpha=0.35, ...)'s name
    ("efficientnet-b0 (tuned)", "efficientnet-b0__tuned_"),
    ("", "model"),
])
def test_a_keras_model_name_is_kept_whole_not_read_as_a_file_name(keras_name, expected):
    """A Keras model's `name` is no path: `mobilenetv2_0.35_96` was published as `mobilenetv2_0`."""
    assert repository_name(keras_name) == expected


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



def test_a_stage_run_alone_keeps_the_run_s_model_name_and_repository(tmp_path):
    """`tfship publish --run <a bring-your-own run>` published it as `digits` into ./models."""
    import json

    from tfship.pipeline.api.ship import configure
    from tfship.pipeline.cli.commands import stage_config
    from tfship.pipeline.orchestration.stages import RunFolder

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    stored = configure(None, {"run.model_name": "mobilenetv2_0.35_96", "publish.repository": str(tmp_path / "cli")})
    (run / "config.json").write_text(json.dumps(stored.model_dump(mode="json", by_alias=True)
                                                | {"export_only": {"model": "m.keras", "data": "d.npz"}}))
    parser = build_parser()
    for command, expected in (
            (["publish", "--run", str(run)], ("mobilenetv2_0.35_96", str(tmp_path / "cli"), 1e-2)),
            (["validate", "--run", str(run), "--set", "validate.float16.atol=0.05"],
             ("mobilenetv2_0.35_96", str(tmp_path / "cli"), 0.05)),
            (["publish", "--run", str(run), "--repository", str(tmp_path / "elsewhere")],
             ("mobilenetv2_0.35_96", str(tmp_path / "elsewhere"), 1e-2))):
        args = parser.parse_args(command)
        config = stage_config(args, config_from_args(args), RunFolder(run))
        assert (config.run.model_name, str(config.publish.repository), config.parity.float16.atol) == expected
    with pytest.raises(ConfigError, match="validate.float16.atol"):
        args = parser.parse_args(["validate", "--run", str(run), "--set", "validate.float16.atol=-1"])
        stage_config(args, config_from_args(args), RunFolder(run))
