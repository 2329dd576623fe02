"""Every message that names a config setting names one that exists: the string literals of the
pipeline, signatures and format packages are scanned for `section.key` names of the `[section]`
tables (and for `--set section.key`), and each is checked against the pydantic config schema."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel

from tfship.pipeline.config import PipelineConfig, load_config

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "signatures", "tflite", "tfjs", "onnx_format")
# `model.keras`, `model.tflite`, `model.sig`, ... are file names, not the [model] table's keys.
FILE_SUFFIXES = {"keras", "h5", "onnx", "tflite", "json", "npz", "pb", "png", "md", "log", "toml", "inputs",
                 "outputs", "weights", "layers", "name", "output", "input", "variables", "trainable_variables",
                 "optimizer", "fit", "save", "predict", "call", "summary", "get_config", "dtype_policy",
                 "load_model", "signatures", "sig"}


def _schema_keys(model: type[BaseModel] = PipelineConfig, prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        shown = field.alias or name
        keys.add(prefix + shown)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= _schema_keys(annotation, prefix + shown + ".")
    return keys


def _sections() -> tuple[str, ...]:
    return tuple(field.alias or name for name, field in PipelineConfig.model_fields.items())


def _literals(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def named_settings() -> list[tuple[str, int, str]]:
    """(file, line, dotted name) for every `section.key` a string literal names."""
    pattern = re.compile(rf"(?<![\w./-])({'|'.join(_sections())})\.([a-z_][a-z0-9_]*)\b(?![.(/\w-])")
    named = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for line, text in _literals(path):
                for match in pattern.finditer(text):
                    if match.group(2) not in FILE_SUFFIXES:
                        named.append((str(path.relative_to(REPO_ROOT)), line, match.group(0)))
    return named


def test_every_setting_a_message_names_exists():
    keys = _schema_keys()
    named = named_settings()
    assert len(named) >= 10, named  # the scan finds the settings our messages do name
    unknown = [entry for entry in named if entry[2] not in keys]
    assert unknown == [], f"messages name settings the config does not have: {unknown}"


def test_the_flex_advice_names_a_setting_that_set_accepts():
    named = {name for path, _, name in named_settings() if path == "tflite/worker.py"}
    assert "convert.allow_flex" in named
    assert load_config(None, {"convert.allow_flex": True}).convert.allow_flex is True


def test_no_message_advises_a_bare_setting_name_that_does_not_exist():
    """`set allow_flex ...` (a bare key, the old Flex advice) must be a real key, and should be dotted."""
    leaves = {key.rsplit(".", 1)[-1] for key in _schema_keys()}
    bare = re.compile(r"\b(?:[Ss]et|[Ee]nable|[Dd]isable) ([a-z]+_[a-z0-9_]+)\b(?!\.)")
    found = [(str(path.relative_to(REPO_ROOT)), line, match.group(1))
             for package in PACKAGES for path in sorted((REPO_ROOT / package).rglob("*.py"))
             for line, text in _literals(path) for match in bare.finditer(text)]
    assert [entry for entry in found if entry[2] not in leaves] == []
    assert bare.search("needs Flex ops; set allow_flex to try SELECT_TF_OPS")  # the scan sees the old advice
