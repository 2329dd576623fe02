"""Config loading: defaults, overrides and refusals that name the file, key and value."""

from __future__ import annotations

import re

import pytest

from tfship.core.errors import ConfigError
from tfship.pipeline.config import load_config, parse_override


def test_bundled_config_loads_with_documented_defaults():
    config = load_config()
    assert config.run.model_name == "digits"
    assert config.data.source == "digits"
    assert set(config.convert.tflite_modes) == {"float32", "float16", "dynamic_range", "int8"}
    assert config.parity.float32.atol == 1e-5 and config.parity.float32.rtol == 1e-5


def test_override_changes_one_field():
    assert load_config(None, {"train.epochs": 3}).train.epochs == 3


def test_unknown_key_is_refused_with_file_and_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nepochz = 3\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(path) in str(error.value) and "train.epochz" in str(error.value)


def test_bad_value_names_key_value_and_allowed(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[convert]\ntflite_modes = ["int4"]\n')
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "convert.tflite_modes" in message and "'int4'" in message and "'int8'" in message


def test_negative_tolerance_is_refused():
    with pytest.raises(ConfigError, match="validate.float32.atol"):
        load_config(None, {"validate.float32.atol": -1.0})


def test_bad_toml_and_missing_file_are_named(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")


def test_parse_override_reads_toml_values_and_refuses_missing_equals():
    assert parse_override("train.epochs=4") == ("train.epochs", 4)
    assert parse_override('convert.tflite_modes=["float32"]') == ("convert.tflite_modes", ["float32"])
    assert parse_override("run.model_name=abc") == ("run.model_name", "abc")
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("train.epochs")


def test_a_folder_as_config_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path)


def test_infinite_tolerance_is_refused():
    with pytest.raises(ConfigError, match="validate.float32.atol"):
        load_config(None, {"validate.float32.atol": float("inf")})


def test_abbreviated_flags_are_refused(capsys):
    from tfship.pipeline.cli.app import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--run", "x"])  # must not mean --runs-dir
    assert "unrecognized arguments: --run" in capsys.readouterr().err


def test_override_errors_name_where_the_key_came_from_and_the_known_keys():
    """A key from the Python API is named as an argument, one from the command line as --set, a moved key given
    as an override too; an unknown key lists the keys its table has (the alias `validate`, not the field)."""
    from tfship.pipeline.api.ship import configure

    with pytest.raises(ConfigError, match=r"argument validate\.int8_tolerance=0\.2: key 'validate\.int8_tolerance' "
                                          r"moved: set validate\.int8\.atol"):
        configure(validate={"int8_tolerance": 0.2})
    with pytest.raises(ConfigError, match=r"argument validate\.int8=\{'atoll': 0\.2\}: unknown key "
                                          r"'validate\.int8\.atoll' \(known: atol, max_accuracy_drop_points, "):
        configure(validate={"int8": {"atoll": 0.2}})
    with pytest.raises(ConfigError, match=r"--set validate\.int4\.atol=0\.2: unknown key 'validate\.int4' "
                                          r"\(known: .*float16, float32, .*int8,"):
        load_config(None, {"validate.int4.atol": 0.2})


@pytest.mark.parametrize(("key", "value", "why"), [
    ("validate.int8.atol", True, "expected a number, got a boolean"),
    ("validate.int8.atol", "0.1", "expected a number, got a string"),
    ("train.epochs", "3", "expected a number, got a string"),
    ("validate.batch_sizes", [1, True], "item 1: expected a number, got a boolean"),
    ("validate.int8.min_top1_agreement", False, "expected a number, got a boolean"),
    ("train.jit_compile", "yes", "expected true or false, got a string"),
    ("train.jit_compile", 1, "expected true or false, got a number"),
])
def test_a_value_of_the_wrong_toml_type_is_refused_not_converted(key, value, why):
    """pydantic's lax mode would read `true` as 1.0, "0.1" as 0.1 and 1 as true: a config means what it says or
    stops, naming the key, the value and what was expected."""
    with pytest.raises(ConfigError, match=rf"key '{key}': {re.escape(why)}; got {re.escape(repr(value))}"):
        load_config(None, {key: value})


@pytest.mark.parametrize(("key", "value"), [("train.jit_compile", "auto"), ("train.jit_compile", True),
                                            ("validate.int8.atol", 1), ("validate.batch_sizes", [1, 8])])
def test_values_of_the_right_type_still_load(key, value):
    load_config(None, {key: value})
