"""Create (once) `.venv-edge`: tfship installed WITHOUT TensorFlow by the README's command, beside PyPI's `tflite`.

PyPI's `tflite` (a `.tflite` flatbuffer parser ML engineers have installed) goes in first, as on a user's
machine; tfship must neither shadow it nor be shadowed (`tests/serving/test_edge.py`). The dependencies come from `pip install -c requirements.lock .` (the base install: server and client, ONNX
Runtime and LiteRT backends), run once and cached by a stamp holding the hash of `pyproject.toml` and
`requirements.lock`. tfship itself is installed as a copy (not a path to the source tree), so the tests run
what the install put in `site-packages`; when the sources change, only tfship is reinstalled
(`--no-deps`, seconds). Run directly to prebuild: `.venv/bin/python tests/serving/edge_venv.py` (an interpreter
with tfship installed, which maps `tfship.core` to `core/`: docs/architecture.md, "One import name").
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

if __package__ in (None, ""):  # run as a script (the prebuild): the repository root holds `tfship`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tfship.core.build_lock import building

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-edge"
# The README's TF-free install (run from the repository root).
INSTALL = ("install", "-c", "requirements.lock", ".")
# PyPI's `tflite` parser, installed before tfship: its import name is the one tfship's old layout took.
TFLITE_PARSER = ("install", "-c", "requirements.lock", "tflite==2.18.0")
# The folders the package is built from: pyproject.toml's package-dir (`tfship/` and each mapped top-level folder).
SOURCES = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())


def _digest(paths) -> str:
    sha = hashlib.sha256()
    for path in paths:
        sha.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def _source_files() -> list[Path]:
    files = [ROOT / "pyproject.toml", ROOT / "setup.py"]
    for folder in SOURCES:
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and "node_modules" not in p.parts)
    return files


def ensure_edge_venv(python: str = "python3.11") -> Path:
    """Path of `.venv-edge/bin/python`, built by one process at a time (`core.build_lock`: two test workers).

    Raises:
        RuntimeError: TensorFlow ended up in the venv (the base install must not pull it in).
        subprocess.CalledProcessError: pip failed (its output is on stderr).
    """
    with building(VENV):
        return _ensure_edge_venv(python)


def _ensure_edge_venv(python: str) -> Path:
    """Path of `.venv-edge/bin/python`: dependencies installed once, tfship reinstalled when its sources change.

    Raises:
        RuntimeError: TensorFlow ended up in the venv (the base install must not pull it in).
        subprocess.CalledProcessError: pip failed (its output is on stderr).
    """
    interpreter = VENV / "bin" / "python"
    deps_stamp, code_stamp = VENV / ".tfship-edge-deps", VENV / ".tfship-edge-code"
    deps = _digest([ROOT / "pyproject.toml", ROOT / "requirements.lock", Path(__file__)])
    code = _digest(_source_files())
    pip = [str(interpreter), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    if not (interpreter.exists() and deps_stamp.is_file() and deps_stamp.read_text() == deps):
        if not interpreter.exists():
            subprocess.run([python, "-m", "venv", str(VENV)], check=True)
        subprocess.run([*pip, *TFLITE_PARSER], cwd=ROOT, check=True)
        subprocess.run([*pip, *INSTALL], cwd=ROOT, check=True)
        deps_stamp.write_text(deps)
        code_stamp.write_text(code)
    elif not (code_stamp.is_file() and code_stamp.read_text() == code):
        subprocess.run([*pip, "install", "--no-deps", "--force-reinstall", "."], cwd=ROOT, check=True)
        code_stamp.write_text(code)
    probe = subprocess.run([str(interpreter), "-c", "import importlib.util as u; print(u.find_spec('tensorflow'))"],
                           check=True, capture_output=True, text=True, cwd=VENV)
    if probe.stdout.strip() != "None":
        raise RuntimeError(f"{VENV} unexpectedly has TensorFlow: {probe.stdout}")
    return interpreter


if __name__ == "__main__":
    print(ensure_edge_venv(sys.argv[1] if len(sys.argv) > 1 else "python3.11"))
