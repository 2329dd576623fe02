"""Create (once) a TensorFlow-free venv, `.venv-edge`, that can serve onnx/tflite and run `query`.

Packages are pinned to `requirements.lock`; tfship itself is put on the path by a `.pth` file
(what `pip install --no-deps -e` does, without needing a recent setuptools in the venv). A stamp
holding the hash of the package list makes the second run free. Run directly to prebuild:
`python3.11 tests/serving/edge_venv.py`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-edge"
PACKAGES = ("onnxruntime", "ai-edge-litert", "grpcio", "grpcio-health-checking", "grpcio-reflection", "numpy",
            "protobuf", "pydantic", "rich", "aiohttp", "prometheus-client", "scikit-learn",
            "google-crc32c")


def _pins() -> list[str]:
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line:
            name, version = line.strip().split("==", 1)
            lock[name.lower().replace("_", "-")] = f"{name}=={version}"
    return [lock[p] for p in PACKAGES]


def ensure_edge_venv(python: str = "python3.11") -> Path:
    """Path of `.venv-edge/bin/python`, creating/updating the venv when its stamp is stale."""
    pins = _pins()
    stamp = VENV / ".tfship-edge-stamp"
    digest = hashlib.sha256("\n".join(pins).encode()).hexdigest()
    interpreter = VENV / "bin" / "python"
    if stamp.is_file() and stamp.read_text() == digest and interpreter.exists():
        return interpreter
    if not interpreter.exists():
        subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    pip = [str(interpreter), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *pins], check=True)
    site = subprocess.run([str(interpreter), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "tfship-dev.pth").write_text(str(ROOT) + "\n")  # same effect as `pip install --no-deps -e`
    probe = subprocess.run([str(interpreter), "-c", "import importlib.util as u; print(u.find_spec('tensorflow'))"],
                           check=True, capture_output=True, text=True)
    if probe.stdout.strip() != "None":
        raise RuntimeError(f"{VENV} unexpectedly has TensorFlow: {probe.stdout}")
    stamp.write_text(digest)
    return interpreter


if __name__ == "__main__":
    print(ensure_edge_venv(sys.argv[1] if len(sys.argv) > 1 else "python3.11"))
