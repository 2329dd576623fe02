"""What a shadow and tracing cost the primary: `make bench-shadow-tracing` (about two minutes).

One tfship server (ONNX, an MLP 784 -> 256 -> 10, built here with onnx.helper; v1 stable, v2 the same weights;
one intra-op thread, as `make bench-serve`: ONNX Runtime's spinning pool would otherwise take the other core)
per setting, all up at once, each loaded in turn by `CLIENTS` closed-loop gRPC Predict caller(s) for
`WINDOW_S` seconds, the order rotated over `ROUNDS` rounds; figures are medians over rounds, ratios are to the
baseline of the same round (short interleaved windows share the shared machine's noise across settings):
  * `baseline`: no shadow, tracing off;
  * `shadow 10%` / `shadow 100%`: `--shadow m=canary --shadow-rate 0.1` / `1` (that share of the requests also
    runs on v2 and is compared);
  * `tracing 1%` / `tracing 100%`: OTLP/HTTP export to a receiver in this process (`OTEL_TRACES_SAMPLER=
    traceidratio`, ratio 0.01 / 1.0), batch span processor defaults.
Per setting: throughput (answers/s), client-side latency p50/p99 (ms), and the ratios to the baseline of the
same round. Also the hand-over cost the shadow adds to each request on the request path (`Shadows.offer`:
a random draw, two dict copies, a `put_nowait`), timed in-process over 20,000 calls: the shadow's stated bound
on added latency, the rest of its cost being the CPU its own threads take (set by `--shadow-rate`).

`python -m bench.serve.shadow_tracing --out bench/results` writes `shadow-tracing-latest.{json,md}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from bench.serve.endpoints import THREAD_FLAGS, child_env
from bench.serve.server_counters import process_cpu_s

MODEL, CLIENTS, WINDOW_S, ROUNDS = "m", 1, 1.5, 12
SETTINGS = ("baseline", "shadow 10%", "shadow 100%", "tracing 1%", "tracing 100%")


def _write_mlp(folder: Path, seed: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(0, 0.05, (784, 256)).astype(np.float32), rng.normal(0, 0.05, (256, 10)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["class_id"], axis=1, keepdims=0)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 784])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 10]),
                               helper.make_tensor_value_info("class_id", TensorProto.INT64, ["n"])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))


class _Receiver:
    """An OTLP/HTTP receiver that counts and drops what it gets (the exporter's far end)."""

    def __init__(self) -> None:
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _load(target: str, seconds: float) -> tuple[int, list[float]]:
    from tfship.serving.tfs.client import PredictClient

    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    stop = time.monotonic() + seconds

    def run(index: int) -> None:
        with PredictClient(target, timeout_s=30) as client:
            client.predict(MODEL, {"x": x}, version_label="stable")  # metadata cached, channel warm
            while time.monotonic() < stop:
                started = time.perf_counter()
                client.predict(MODEL, {"x": x}, version_label="stable")
                latencies[index].append(time.perf_counter() - started)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = [v for part in latencies for v in part]
    return len(flat), flat


def _server(repo: Path, setting: str, receiver: _Receiver):
    from tfship.serving.launcher import ServerProcess

    env, flags = child_env(), ["--model-config-file", str(repo / "models.config"), *THREAD_FLAGS,
                               "--file-system-poll-wait-seconds", "0", "--rest-port", "-1"]
    if setting.startswith("shadow"):
        flags += ["--shadow", f"{MODEL}=canary", "--shadow-rate", "1" if setting == "shadow 100%" else "0.1",
                  "--shadow-report-dir", str(repo / ("shadow" if setting == "shadow 100%" else "shadow-10"))]
    if setting.startswith("tracing"):
        env.update(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url, OTEL_TRACES_SAMPLER="traceidratio",
                   OTEL_TRACES_SAMPLER_ARG="0.01" if setting == "tracing 1%" else "1.0")
    return ServerProcess(repo, MODEL, backend="onnx", env=env, extra_args=flags)


def _window(server, setting: str) -> dict:
    cpu = process_cpu_s(server.process.pid)
    count, latencies = _load(server.grpc_target, WINDOW_S)
    cpu_us = (process_cpu_s(server.process.pid) - cpu) / max(count, 1) * 1e6
    ms = np.array(latencies) * 1000
    return {"setting": setting, "answers": count, "per_s": count / WINDOW_S, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "server_cpu_us": cpu_us}


def offer_cost_us(calls: int = 20_000) -> float:
    """Microseconds one `Shadows.offer` takes on the request path (median of 5 runs of `calls` calls)."""
    from tfship.serving.dataplane.shadow import ShadowOptions, Shadows
    from tfship.serving.dataplane.types import ModelRef

    class NoManager:  # the workers' side is not timed here: every pair is left in the queue or dropped
        def hold(self, ref):
            raise RuntimeError("not used")

    shadows = Shadows(NoManager(), {MODEL: ModelRef(MODEL, label="canary")}, ShadowOptions(rate=1.0, queue_size=calls))
    shadows._stop.set()  # workers stop: the queue only fills
    for thread in shadows._threads:
        thread.join()
    inputs, outputs = {"x": np.zeros((1, 784), np.float32)}, {"logits": np.zeros((1, 10), np.float32)}
    runs = []
    for _ in range(5):
        while not shadows._queue.empty():
            shadows._queue.get_nowait()
        started = time.perf_counter()
        for _ in range(calls):
            shadows.offer(MODEL, 1, "serving_default", inputs, outputs, 0.001, None)
        runs.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(runs)


def run(out: Path) -> dict:
    """Measure every setting `ROUNDS` times, alternating; write the JSON and Markdown reports into `out`."""
    receiver = _Receiver()
    with tempfile.TemporaryDirectory(prefix="tfship-bench-shadow-") as tmp:
        repo = Path(tmp)
        for version in (1, 2):
            _write_mlp(repo / MODEL / str(version))
        (repo / "models.config").write_text(
            f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{repo / MODEL}" model_platform: "onnx" '
            'model_version_policy { specific { versions: 1 versions: 2 } } '
            'version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } } }\n')
        rounds = []
        with contextlib.ExitStack() as stack:  # every server up at once; idle while another is measured
            servers = {setting: stack.enter_context(_server(repo, setting, receiver)) for setting in SETTINGS}
            for index in range(ROUNDS):
                order = SETTINGS[index % len(SETTINGS):] + SETTINGS[:index % len(SETTINGS)]  # rotated
                measured = {setting: _window(servers[setting], setting) for setting in order}
                rows = [measured[setting] for setting in SETTINGS]
                base = rows[0]
                for row in rows:
                    row.update(round=index, throughput_ratio=row["per_s"] / base["per_s"],
                               p50_ratio=row["p50_ms"] / base["p50_ms"], p99_ratio=row["p99_ms"] / base["p99_ms"],
                               cpu_ratio=row["server_cpu_us"] / base["server_cpu_us"])
                    print(f"round {index} {row['setting']:>13}: {row['per_s']:8.0f}/s p50 {row['p50_ms']:.3f} ms "
                          f"p99 {row['p99_ms']:.3f} ms (x{row['throughput_ratio']:.3f} throughput)", flush=True)
                rounds.append(rows)
            time.sleep(1.5)  # the shadow's part is written once a second
            from tfship.serving.shadow_cli import load_report

            shadow = load_report(MODEL, str(repo / "shadow"))["figures"]
    summary = {s: {k: statistics.median(r[i][k] for r in rounds)
                   for k in ("per_s", "p50_ms", "p99_ms", "server_cpu_us", "throughput_ratio", "p50_ratio",
                             "p99_ratio", "cpu_ratio")}
               for i, s in enumerate(SETTINGS)}
    result = {"clients": CLIENTS, "window_s": WINDOW_S, "rounds": rounds, "median": summary, "shadow": shadow,
              "offer_us": offer_cost_us(), "otlp_requests_received": receiver.requests,
              "load_average": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
    out.mkdir(parents=True, exist_ok=True)
    (out / "shadow-tracing-latest.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "shadow-tracing-latest.md").write_text(_markdown(result))
    return result


def _markdown(result: dict) -> str:
    lines = ["# Shadow and tracing cost (`make bench-shadow-tracing`)", "",
             f"Host load average at the end: {result['load_average']} (2 cores shared with other work: throughput "
             "and latency swing between rounds; the server's CPU per answer is the steadier figure).", "",
             f"{result['clients']} closed-loop gRPC clients, {result['window_s']:g} s per setting, "
             f"{len(result['rounds'])} alternating rounds (medians); ONNX MLP 784-256-10, batch 1. Ratios are to "
             "the baseline of the same round.", "",
             "| setting | answers/s | p50 ms | p99 ms | server CPU µs/answer | throughput vs baseline | "
             "p50 vs baseline | p99 vs baseline | CPU/answer vs baseline |",
             "|---|---|---|---|---|---|---|---|---|"]
    for setting, row in result["median"].items():
        lines.append(f"| {setting} | {row['per_s']:.0f} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                     f"{row['server_cpu_us']:.0f} | {row['throughput_ratio']:.3f} | {row['p50_ratio']:.3f} | "
                     f"{row['p99_ratio']:.3f} | {row['cpu_ratio']:.3f} |")
    shadow = result["shadow"]
    lines += ["", f"Shadow report at the end: {shadow['pairs']} pairs, top-1 agreement {shadow['top1_agreement']}, "
              f"value agreement {shadow['value_agreement']}, shadow errors {shadow['shadow_errors']}, dropped "
              f"{shadow['dropped']} (queue full: the shadow's own queue bounds its work)."]
    lines += ["", f"`Shadows.offer` on the request path: {result['offer_us']:.2f} µs per request (median of 5 x "
              "20,000 calls): the latency a shadow adds to a primary by itself; the rest of its cost is the CPU "
              "its own threads take (the candidate's model call and the comparison), set by `--shadow-rate`.",
              f"OTLP export requests received: {result['otlp_requests_received']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serve.shadow_tracing")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    run(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
