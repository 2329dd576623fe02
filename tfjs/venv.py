"""`.venv-tfjs` (the TF.js converter's environment) and `tfjs/node/node_modules` (its Node.js runner).

Why a venv of its own: `tensorflowjs` 4.22.0 declares tensorflow-decision-forests (pinned to tensorflow
2.19.0), jax, flax and tf-keras, and imports tensorflow_decision_forests and jax at import time; installing
it into the main venv would downgrade TensorFlow. `.venv-tfjs` holds only the packages of
`requirements-tfjs.lock` (installed `--no-deps`) and reads everything else — TensorFlow 2.21.0 included —
from the main venv's site-packages through a `.pth` file placed after its own, so the converter runs the
same TensorFlow as the export; `tfjs/shims` supplies the import-only `tensorflow_decision_forests`.

Both are built on first use and stamped with the hash of what they were built from (lock file, main
site-packages path; package-lock.json), so the second call returns at once. `python -m tfship.tfjs.venv` prebuilds
both (`make tfjs-setup`).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tfship.core.build_lock import building
from tfship.core.errors import ConversionError

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-tfjs"
LOCK = ROOT / "requirements-tfjs.lock"
NODE_DIR = ROOT / "tfjs" / "node"
SHIMS = ROOT / "tfjs" / "shims"
NODE_MAJOR = 20


def _run(command: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError as err:
        raise ConversionError(f"{what}: {command[0]} not found ({err})") from err
    except subprocess.CalledProcessError as err:
        tail = " ".join((err.stdout + err.stderr).split())[-1200:]
        raise ConversionError(f"{what}: {' '.join(command[:4])} ... exited {err.returncode}: {tail}") from err
    except subprocess.TimeoutExpired as err:
        raise ConversionError(f"{what}: {' '.join(command[:4])} ... timed out") from err
    return done.stdout


def _ensure_tfjs_venv() -> Path:
    """`.venv-tfjs/bin/python`, creating or updating the venv when its stamp is stale.

    Raises:
        ConversionError: the venv cannot be created or a pinned package cannot be installed.
    """
    main_site = sysconfig.get_paths()["purelib"]
    digest = hashlib.sha256(LOCK.read_bytes() + main_site.encode()).hexdigest()
    stamp, interpreter = VENV / ".tfship-tfjs-stamp", VENV / "bin" / "python"
    if stamp.is_file() and stamp.read_text() == digest and interpreter.exists():
        return interpreter
    if not interpreter.exists():
        _run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], "create .venv-tfjs")
    site = Path(_run([str(interpreter), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     "locate .venv-tfjs site-packages").strip())
    # pip from the main venv installs into .venv-tfjs (--prefix-free: --python); no pip inside the venv.
    _run([sys.executable, "-m", "pip", "--python", str(interpreter), "install", "--quiet", "--no-deps",
          "--disable-pip-version-check", "-r", str(LOCK)], "install requirements-tfjs.lock")
    # .pth lines are appended to sys.path in file-name order, after the venv's own site-packages.
    (site / "tfship-a-shims.pth").write_text(str(SHIMS) + "\n")
    (site / "tfship-b-main-venv.pth").write_text(main_site + "\n")
    (site / "tfship-c-repo.pth").write_text(str(ROOT) + "\n")
    probe = _run([str(interpreter), "-c", "import tensorflow, tensorflowjs; print(tensorflow.__version__)"],
                 "import tensorflowjs in .venv-tfjs")
    import tensorflow as tf

    if probe.strip().splitlines()[-1] != tf.__version__:
        raise ConversionError(f".venv-tfjs runs TensorFlow {probe.strip()}, the main venv {tf.__version__}")
    stamp.write_text(digest)
    return interpreter


def node_executable() -> str:
    """Path of `node` (major version >= 20).

    Raises:
        ConversionError: no `node` on PATH or an older one.
    """
    node = shutil.which("node")
    if node is None:
        raise ConversionError("the TF.js artifact is proven in Node.js: install Node.js >= 20 (`node` on PATH)")
    version = _run([node, "--version"], "node --version").strip()
    if int(version.lstrip("v").split(".")[0]) < NODE_MAJOR:
        raise ConversionError(f"Node.js {version} found; the TF.js runner needs >= {NODE_MAJOR}")
    return node


def _ensure_node_modules() -> Path:
    """`tfjs/node/node_modules`, installed with `npm ci` from the project's package-lock.json when stale.

    The packages are pure JavaScript (@tensorflow/tfjs-core, tfjs-converter, tfjs-backend-cpu 4.22.0);
    `--ignore-scripts` keeps npm from running install scripts.

    Raises:
        ConversionError: node or npm missing, or `npm ci` failed.
    """
    node_executable()
    modules = NODE_DIR / "node_modules"
    stamp = modules / ".tfship-stamp"
    digest = hashlib.sha256((NODE_DIR / "package-lock.json").read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        return modules
    npm = shutil.which("npm")
    if npm is None:
        raise ConversionError("npm not found: it installs the TF.js runner's packages (tfjs/node/package-lock.json)")
    _run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], "npm ci (tfjs/node)", cwd=NODE_DIR)
    stamp.write_text(digest)
    return modules


def ensure_tfjs_venv() -> Path:
    """`.venv-tfjs/bin/python`, built or updated when stale by one process at a time (`core.build_lock`).

    Raises:
        ConversionError: the venv cannot be created or a pinned package cannot be installed.
    """
    with building(VENV):
        return _ensure_tfjs_venv()


def ensure_node_modules() -> Path:
    """`tfjs/node/node_modules`, installed when stale by one process at a time (`core.build_lock`).

    Raises:
        ConversionError: node or npm missing, or `npm ci` failed.
    """
    with building(NODE_DIR / "node_modules"):
        return _ensure_node_modules()


if __name__ == "__main__":
    print(ensure_tfjs_venv())
    print(ensure_node_modules())
