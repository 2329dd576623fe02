"""Start-up of the edge image: container start to SERVING, for the published digits model (`make bench-edge-startup`).

For each backend (ONNX; the float32 and int8 TFLite files by their published names) the image is started
`--runs` times against the repository. Two figures per start, both against the engine's own clock:

* `serving_s`: the engine's `State.StartedAt` to the engine's timestamp of the server's `listening` log line,
  which the server writes after every model is loaded, health is SERVING and the ports are bound;
* `host_seen_s`: `StartedAt` to the moment this host's `grpc.health.v1` Watch stream first reads SERVING
  (an upper bound: it includes the client's connection attempts).

Writes `bench/results/edge-startup-latest.{json,md}` (median and max per backend, the machine's load).
Usage: `python -m bench.edge_startup [--image tfship:edge] [--repository models] [--runs 5]`.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
from datetime import datetime, timezone
from pathlib import Path

from bench.host import ROOT, host_info, uptime
from tfship.deploy.engine import Engine, Ports, RunSpec
from tfship.serving.tfs.client import PredictClient

CASES = ({"MODEL_BACKEND": "onnx"}, {"MODEL_ARTIFACT": "tflite_float32"}, {"MODEL_ARTIFACT": "tflite_int8"})
READY_LINE = "tfship.serving.server: listening:"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_start(engine: Engine, image: str, repository: Path, model: str, env: dict[str, str]) -> dict[str, float]:
    """Start one container, wait for SERVING over the health Watch stream, read the timeline, remove it."""
    spec = RunSpec(image=image, name=f"tfship-bench-startup-{next(iter(env.values()))}".replace("_", "-"),
                   repository=repository, model_name=model,
                   ports=Ports(grpc=_free_port(), rest=_free_port(), metrics=_free_port()),
                   host_network=not engine.has_bridge(), env=env)
    engine.run(spec)
    try:
        with PredictClient(f"127.0.0.1:{spec.ports.grpc}", timeout_s=30) as client:
            client.wait_until_serving(120)
        seen = datetime.now(timezone.utc)
        started, lines = engine.timeline(spec.name)
        ready = next((stamp for stamp, text in lines if READY_LINE in text), None)
        if ready is None:
            raise RuntimeError(f"{spec.name}: no {READY_LINE!r} line in its log:\n" + "\n".join(t for _, t in lines))
        return {"serving_s": (ready - started).total_seconds(), "host_seen_s": (seen - started).total_seconds()}
    finally:
        engine.remove(spec.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.edge_startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="tfship:edge")
    parser.add_argument("--repository", type=Path, default=ROOT / "models")
    parser.add_argument("--model-name", default="digits")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    engine = Engine.connect()
    rows = []
    for env in CASES:
        runs = [one_start(engine, args.image, args.repository.resolve(), args.model_name, env)
                for _ in range(args.runs)]
        serving = [r["serving_s"] for r in runs]
        seen = [r["host_seen_s"] for r in runs]
        rows.append({"case": env, "runs": runs, "serving_median_s": statistics.median(serving),
                     "serving_max_s": max(serving), "host_seen_median_s": statistics.median(seen)})
        print(f"{env}: SERVING {statistics.median(serving):.2f}s median, {max(serving):.2f}s max "
              f"(host saw it after {statistics.median(seen):.2f}s)", flush=True)
    report = {"image": args.image, "image_bytes": engine.image_size(args.image),
              "platform": engine.image_platform(args.image), "host": host_info(), "uptime": uptime(), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "edge-startup-latest.json").write_text(json.dumps(report, indent=2) + "\n")
    table = ["| serves | container start → SERVING, median | max | host saw SERVING, median |", "|---|---|---|---|"]
    table += [f"| {next(iter(r['case'].values()))} | {r['serving_median_s']:.2f} s | {r['serving_max_s']:.2f} s | "
              f"{r['host_seen_median_s']:.2f} s |" for r in rows]
    (args.out / "edge-startup-latest.md").write_text(
        f"# Edge image start-up ({args.image}, {report['platform']}, {report['image_bytes'] / 1e6:.0f} MB)\n\n"
        f"{args.runs} starts per row; `python -m bench.edge_startup` (make bench-edge-startup). "
        f"Machine: {report['host']['cpus']} CPUs, {report['uptime']}.\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
