"""The type checker `make lint` runs (basedpyright, `[tool.basedpyright]` in pyproject.toml) resolves every `tfship.*`
import by path in the checkout (`tfship/`'s links: docs/architecture.md, "One import name") and fails on a wrong
annotation. One checker run over a temporary folder, against the checkout's own files: every `tfship.*` import the
package writes, each as one line, must resolve (module and name); a copy of `core/contract.py` must check clean,
and the same copy with one return annotation made wrong must fail on that line alone."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one checker run, ~20-40 s

ROOT = Path(__file__).resolve().parents[2]
CHECKER = Path(sys.executable).with_name("basedpyright")
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
CONTRACT = ROOT / "core" / "contract.py"
# `TensorSpec.rank` returns `int | None`; declared `str`, the checker must refuse its return statement.
RIGHT, WRONG = "    def rank(self) -> int | None:\n", "    def rank(self) -> str:\n"


def _tfship_imports() -> list[str]:
    """Each `tfship.*` import the package's modules write (at any depth, TYPE_CHECKING ones too), as one line each,
    every name bound to an alias of its own so that no two lines shadow each other."""
    lines: set[str] = set()
    for folder in PACKAGE_DIRS.values():
        for path in (ROOT / folder).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    lines.update(f"import {a.name}" for a in node.names if a.name.split(".")[0] == "tfship")
                elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "tfship":
                    lines.update(f"from {node.module} import {a.name}" for a in node.names if a.name != "*")
    return [f"{line} as _{i}" if line.startswith("from") else line for i, line in enumerate(sorted(lines))]


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, list[dict]]:
    """The checker's error diagnostics per file name, for `imports.py`, `contract_clean.py`, `contract_wrong.py`."""
    folder = tmp_path_factory.mktemp("typecheck")
    (folder / "imports.py").write_text("\n".join(_tfship_imports()) + "\n")
    source = CONTRACT.read_text(encoding="utf-8")
    assert source.count(RIGHT) == 1, "core/contract.py no longer declares TensorSpec.rank as this test plants it"
    (folder / "contract_clean.py").write_text(source)
    (folder / "contract_wrong.py").write_text(source.replace(RIGHT, WRONG))
    basedpyright = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["basedpyright"]
    config = {"include": ["."], "extraPaths": [str(ROOT)], "pythonVersion": basedpyright["pythonVersion"],
              "typeCheckingMode": basedpyright["typeCheckingMode"]}
    (folder / "pyrightconfig.json").write_text(json.dumps(config))
    assert CHECKER.is_file(), f"{CHECKER} missing: `make setup` installs it (pyproject's dev extra)"
    done = subprocess.run([str(CHECKER), "--outputjson", "--pythonpath", sys.executable, "-p", str(folder)],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    errors: dict[str, list[dict]] = {}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            errors.setdefault(Path(diagnostic["file"]).name, []).append(diagnostic)
    return errors


def test_every_tfship_import_resolves_by_path(checked):
    assert len(_tfship_imports()) > 500, "the package's tfship.* imports were not found"
    unresolved = [f"{d['range']['start']['line'] + 1}: {d['message']}" for d in checked.get("imports.py", [])]
    assert not unresolved, "tfship.* imports the checker cannot resolve:\n" + "\n".join(unresolved)


def test_the_checker_fails_on_a_planted_wrong_annotation(checked):
    assert not checked.get("contract_clean.py"), checked.get("contract_clean.py")
    wrong = checked.get("contract_wrong.py", [])
    lines = CONTRACT.read_text(encoding="utf-8").splitlines()
    planted = lines.index(RIGHT.rstrip("\n"))
    returns = next(i for i in range(planted, len(lines)) if lines[i].lstrip().startswith("return "))  # 0-based
    assert [(d["rule"], d["range"]["start"]["line"]) for d in wrong] == [("reportReturnType", returns)], wrong
