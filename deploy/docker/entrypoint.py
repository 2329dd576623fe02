"""Container entry point: turn TF Serving-style env vars into the server's flags, then exec it.

The image's ENTRYPOINT runs this file in exec form; it replaces itself with
`python -m tfship.serving ...` (os.execv), so the server is PID 1 and gets SIGTERM directly from
`docker stop` or the kubelet. Arguments given to the container (CMD / `args:`) are appended
after the flags built here, so they can add or override any flag.

Env (same names and meaning as TF Serving's image where one exists):
    MODEL_NAME       model to serve (<MODEL_BASE_PATH>/<MODEL_NAME>/<version>/).
    MODEL_BASE_PATH  model repository root, default /models.
    GRPC_PORT        gRPC port (PredictionService, grpc.health.v1), default 8500.
    REST_PORT        REST port, default 8501.
    METRICS_PORT     Prometheus metrics port, default 9090.
    MODEL_BACKEND    saved_model, onnx or tflite; unset or empty: the server's auto choice.
    MODEL_ARTIFACT   serve this published artifact of each version (`--artifact`, e.g. tflite_int8): the file
                     and backend its manifest.json lists; unset or empty: MODEL_BACKEND decides.
"""

from __future__ import annotations

import os
import sys


def server_argv(env: dict[str, str], extra: list[str]) -> list[str]:
    """The server's command line for this environment (extra args appended last)."""
    return [
        sys.executable, "-m", "tfship.serving",
        "--repository", env.get("MODEL_BASE_PATH", "/models"),
        "--model-name", env.get("MODEL_NAME", "model"),
        "--host", "0.0.0.0",
        "--port", env.get("GRPC_PORT", "8500"),
        "--rest-port", env.get("REST_PORT", "8501"),
        "--metrics-port", env.get("METRICS_PORT", "9090"),
        *(["--backend", env["MODEL_BACKEND"]] if env.get("MODEL_BACKEND") else []),
        *(["--artifact", env["MODEL_ARTIFACT"]] if env.get("MODEL_ARTIFACT") else []),
        *extra,
    ]


def main() -> None:
    """Replace this process with the server (`exec`), so it is PID 1 and receives SIGTERM itself."""
    argv = server_argv(dict(os.environ), sys.argv[1:])
    print("tfship entrypoint: exec", " ".join(argv[1:]), flush=True)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
