"""Results of `bench.serve.run_bench`: medians of the rounds, issue 14's targets, JSON, Markdown, plot.

Rows (`doc["rows"]`) are the load generator's dicts (`inferences_per_s`, `latency_ms` in ms, `server_cpu`
in cores, `errors`) tagged with `mode` (`grpc`, `rest`, `multiprocess`), `model`, `case` and `repeat`,
or in-process rows (`mode` `inprocess`, `batch`, `inferences_per_s`). Every figure shown is the median
over the rounds of one run; targets are ratios inside that run (absolute rates vary between machines).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRPC_ROWS = (("ort", "hand-written grpcio + ONNX Runtime, per request"),
             ("ort_batching", "hand-written grpc.aio micro-batching ONNX Runtime (32 rows, 1 ms)"),
             ("onnx_batching", "tfship onnx, batching"),
             ("onnx_batching_tensor_content", "tfship onnx, batching, tensor_content answers"),
             ("onnx", "tfship onnx, no batching"), ("saved_model_batching", "tfship saved_model, batching"))
# Answer encodings (issue 19): TF Serving's default typed fields vs --enable_serialization_as_tensor_content.
ENCODING_ROWS = (("identity", "identity_tensor_content", "tfship identity (echoes the input: 64 / 784 floats)"),
                 ("onnx_batching", "onnx_batching_tensor_content", "tfship onnx, batching (10 outputs)"))
REST_ROWS = (("rest_bare", "bare aiohttp, prebuilt reply"),
             ("rest_ort", "hand-written aiohttp + orjson + ONNX Runtime, per request"),
             ("rest_row", "tfship onnx batching, row (instances)"),
             ("rest_columnar", "tfship onnx batching, columnar (inputs)"))
MODELS = (("digits", "small"), ("mlp", "heavy"))


def medians(rows: list[dict]) -> dict[tuple, dict]:
    """(mode, model, case, concurrency) -> median inf/s, p50, p99 (ms), server CPU and the round count."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("mode") in ("grpc", "rest", "multiprocess") and "error" not in r:
            key = (r["mode"], r["model"], r["case"] if r["mode"] != "multiprocess" else r["processes"], r["concurrency"])
            groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        lat = [r["latency_ms"] for r in rs if r.get("latency_ms")]
        out[key] = {"inf_s": statistics.median(r["inferences_per_s"] for r in rs),
                    "p50": statistics.median(q["p50"] for q in lat) if lat else 0.0,
                    "p99": statistics.median(q["p99"] for q in lat) if lat else 0.0,
                    "server_cpu": statistics.median(r["server_cpu"] or 0 for r in rs),
                    "rows_per_call": statistics.median(r.get("mean_batch_rows") or 0 for r in rs),
                    "errors": sum(r["errors"] for r in rs), "rounds": len(rs),
                    **_thread_medians(rs)}
    return out


def _thread_medians(rs: list[dict]) -> dict:
    """Median per-request server thread figures of one case (`server_counters.thread_counters` deltas):
    main-thread and other-thread CPU (microseconds per request) and the main thread's involuntary
    context switches per request; {} when the rows carry no thread figures.
    """
    main_us, other_us, preempted = [], [], []
    for r in rs:
        threads, done = r.get("server_threads"), r.get("requests_per_s", 0) * r.get("window_s", 0)
        if not threads or not done:
            continue
        main = threads.get("main", {})
        main_us.append(main.get("cpu_s", 0) / done * 1e6)
        other_us.append(sum(t["cpu_s"] for name, t in threads.items() if name != "main") / done * 1e6)
        preempted.append(main.get("involuntary", 0) / done)
    if not main_us:
        return {}
    return {"main_us": statistics.median(main_us), "other_us": statistics.median(other_us),
            "main_preempted": statistics.median(preempted)}


def inprocess(rows: list[dict], model: str, batch: int) -> float | None:
    """Median in-process inferences/s of ONNX Runtime on `model` at `batch` rows."""
    values = [r["inferences_per_s"] for r in rows if r.get("mode") == "inprocess" and r["model"] == model
              and r["batch"] == batch]
    return statistics.median(values) if values else None


def _rate(m: dict, *key) -> float | None:
    return m[key]["inf_s"] if key in m else None


def _target(name: str, value: float | None, goal: float, higher: bool = True) -> dict:
    met = value is not None and (value >= goal if higher else value <= goal)
    return {"target": name, "value": value, "goal": goal, "met": met}


def targets(rows: list[dict], levels: tuple[int, ...]) -> tuple[list[dict], dict]:
    """Issue 14's targets as PASS/MISS rows (each with its value in every round, `rounds`, and their `min` and
    `max`: the spread over the repetitions), plus the one-core limit's parts and the heavy model's rows per
    model call at c=32 (`rows_per_call_c32`, batching).
    """
    out, limit = _targets(rows, levels)
    repeats = sorted({r["repeat"] for r in rows if "repeat" in r})
    per_round = [_targets([r for r in rows if r.get("repeat") == k], levels)[0] for k in repeats]
    for i, target in enumerate(out):
        values = [p[i]["value"] for p in per_round if p[i]["value"] is not None]
        target.update(rounds=values, min=min(values) if values else None, max=max(values) if values else None)
    heavy = medians(rows).get(("grpc", "mlp", "onnx_batching", 32))
    return out, {**limit, "rows_per_call_c32": heavy["rows_per_call"] if heavy else None}


def compare(previous: dict | None, found: list[dict]) -> list[dict]:
    """Each target of this run beside the previous report's (`previous`: its JSON document): `fell` when it moved
    the wrong way by more than its spread (the larger of the two runs' max - min over their rounds; 0 with one
    round). [] without a previous report.
    """
    if not previous:
        return []
    before = {t["target"]: t for t in previous.get("targets", [])}
    out = []
    for t in found:
        old = before.get(t["target"])
        if old is None or old.get("value") is None or t["value"] is None:
            continue
        spread = max([(x["max"] - x["min"]) for x in (t, old) if x.get("max") is not None] or [0.0])
        change = t["value"] - old["value"]
        worse = -change if t["goal"] != 3.0 else change  # p99/p50 (goal <= 3) is better lower
        out.append({"target": t["target"], "before": old["value"], "now": t["value"], "spread": spread,
                    "fell": worse > spread})
    return out


def _targets(rows: list[dict], levels: tuple[int, ...]) -> tuple[list[dict], dict]:
    m, out = medians(rows), []
    for c in levels:
        bare, ident = _rate(m, "grpc", "mlp", "bare", c), _rate(m, "grpc", "mlp", "identity", c)
        out.append(_target(f"identity / bare grpc.aio, heavy payload, c={c}", ident / bare if bare and ident else None,
                           0.90))
    for c in levels:  # context for the line above: the hand-written floor of any handler that parses the request
        bare, echo = _rate(m, "grpc", "mlp", "bare", c), _rate(m, "grpc", "mlp", "echo", c)
        ident = _rate(m, "grpc", "mlp", "identity", c)
        out.append(_target(f"hand-written echo handler / bare grpc.aio, heavy payload, c={c} (the floor)",
                           echo / bare if bare and echo else None, 0.90))
        out.append(_target(f"identity / hand-written echo handler, heavy payload, c={c}",
                           ident / echo if echo and ident else None, 0.90))
    for case, label in (("onnx_batching", "onnx batching"), ("onnx", "onnx no batching")):
        for c in levels:
            ort, tf = _rate(m, "grpc", "digits", "ort", c), _rate(m, "grpc", "digits", case, c)
            out.append(_target(f"small: tfship {label} / hand-written ORT, c={c}", tf / ort if ort and tf else None,
                               1.0))
    bare32, model32 = _rate(m, "grpc", "mlp", "bare", 32), inprocess(rows, "mlp", 32)
    limit = 1 / (1 / bare32 + 1 / model32) if bare32 and model32 else None
    heavy = m.get(("grpc", "mlp", "onnx_batching", 32))
    out.append(_target("heavy: tfship onnx batching c=32 / one-core limit",
                       heavy["inf_s"] / limit if heavy and limit else None, 0.90))
    echo32 = _rate(m, "grpc", "mlp", "echo", 32)  # the same limit with the echo handler's transport cost
    echo_limit = 1 / (1 / echo32 + 1 / model32) if echo32 and model32 else None
    out.append(_target("heavy: tfship onnx batching c=32 / one-core limit over the echo handler",
                       heavy["inf_s"] / echo_limit if heavy and echo_limit else None, 0.90))
    hand = _rate(m, "grpc", "mlp", "ort_batching", 32)
    out.append(_target("heavy: tfship onnx batching / hand-written micro-batching ORT, c=32",
                       heavy["inf_s"] / hand if heavy and hand else None, 1.0))
    out.append(_target("heavy: tfship onnx batching c=32 p99 / p50", heavy["p99"] / heavy["p50"] if heavy and
                       heavy["p50"] else None, 3.0, higher=False))
    for model, label in MODELS:
        for c in levels:
            hand, tf = _rate(m, "rest", model, "rest_ort", c), _rate(m, "rest", model, "rest_row", c)
            out.append(_target(f"REST {label}: tfship row / hand-written aiohttp+orjson+ORT, c={c}",
                               tf / hand if hand and tf else None, 1.0))
    typed, raw = _rate(m, "grpc", "mlp", "onnx_batching", 32), _rate(m, "grpc", "mlp", "onnx_batching_tensor_content", 32)
    out.append(_target("heavy c=32: typed-field answers (default) / tensor_content answers, onnx batching",
                       typed / raw if typed and raw else None, 0.90))
    on1, off1 = _rate(m, "grpc", "mlp", "onnx_batching", 1), _rate(m, "grpc", "mlp", "onnx", 1)
    out.append(_target("heavy c=1: batching / no batching (no loss; 5 % noise allowance)",
                       on1 / off1 if on1 and off1 else None, 0.95))
    return out, {"bare_c32": bare32, "inprocess_b32": model32, "limit": limit}


def _cell(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _rate_table(m: dict, mode: str, cases, levels, ratio_to: str | None = None) -> list[str]:
    head = [f"{size} c={c}" for _, size in MODELS for c in levels]
    lines = ["| server | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for case, label in cases:
        cells = []
        for model, _ in MODELS:
            for c in levels:
                value, base = _rate(m, mode, model, case, c), _rate(m, mode, model, ratio_to, c) if ratio_to else None
                extra = f" ({value / base:.2f}x)" if value and base and case != ratio_to else ""
                cells.append(_cell(value) + extra)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def markdown(doc: dict) -> str:
    """The result document as Markdown: conditions, targets, the issue's tables, latencies."""
    rows, host, plan = doc["rows"], doc["host"], doc["plan"]
    levels = tuple(plan["levels"])
    m = medians(rows)
    lines = [f"# Serving benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(doc['started']))})", "",
             f"git {host['git_commit']}, {host['cpus']} CPUs; {plan['repeats']} alternating round(s), median shown; "
             f"window {plan['window_s']} s after {plan['warmup_s']} s warm-up per level; server pinned to one core "
             f"({' '.join(doc['server_flags'])}), load generator to the other; batch-1 requests, closed loop. "
             f"Batching: max 32, 1 ms, 1 batch thread.", "",
             f"Machine load: before `{host.get('uptime_before', '')}`; after `{host.get('uptime_after', '')}`.", "",
             "## Targets (ratios inside this run)", "", "| target | value | rounds min - max | goal | |",
             "|---|---:|---:|---:|:---:|"]
    for t in doc["targets"]:
        spread = f"{t['min']:.2f} - {t['max']:.2f}" if t.get("min") is not None else "-"
        lines.append(f"| {t['target']} | {_cell(t['value'], '{:.2f}')} | {spread} | "
                     f"{'>=' if t['goal'] != 3.0 else '<='} {t['goal']:.2f} | {'PASS' if t['met'] else 'MISS'} |")
    lines += _comparison(doc)
    lim = doc["limit"]
    lines += ["", f"One-core limit (heavy, c=32) = 1 / (1/bare + 1/in-process) = 1 / (1/{_cell(lim['bare_c32'])} + "
                  f"1/{_cell(lim['inprocess_b32'])}) = **{_cell(lim['limit'])}** inferences/s.", "",
              f"Heavy model, onnx batching, c=32: **{_cell(lim.get('rows_per_call_c32'), '{:.1f}')} rows per model "
              "call** (median of the rounds; `tfship_batch_size` over the window).", "",
              "## gRPC Predict, inferences/s (ratio to the hand-written server)", ""]
    lines += _rate_table(m, "grpc", GRPC_ROWS, levels, ratio_to="ort")
    lines += _encodings(m, levels)
    lines += ["", "## Transport alone: identity backend vs bare grpc.aio (requests/s, ratio to bare)", ""]
    lines += _rate_table(m, "grpc", (("bare", "bare grpc.aio, prebuilt reply"),
                                     ("echo", "hand-written grpc.aio echo (parse, np.frombuffer, reply)"),
                                     ("identity", "tfship identity")), levels, ratio_to="bare")
    if any(k[0] == "rest" for k in m):
        lines += ["", "## REST :predict JSON, inferences/s (ratio to the hand-written REST server)", ""]
        lines += _rate_table(m, "rest", REST_ROWS, levels, ratio_to="rest_ort")
    lines += _multiprocess(m)
    lines += _mixed_load(doc.get("mixed_load"))
    lines += ["", "## Latency and server CPU (medians)", "",
              "| mode | model | case | c | inf/s | p50 ms | p99 ms | p99/p50 | rows/call | server CPU | errors |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (mode, model, case, c), v in sorted(m.items(), key=lambda kv: tuple(map(str, kv[0]))):
        tail = v["p99"] / v["p50"] if v["p50"] else 0
        lines.append(f"| {mode} | {model} | {case} | {c} | {v['inf_s']:,.0f} | {v['p50']:.2f} | {v['p99']:.2f} | "
                     f"{tail:.2f} | {v['rows_per_call']:.1f} | {v['server_cpu']:.2f} | {v['errors']} |")
    lines += _threads(m, doc.get("handler_cost"))
    lines += ["", "## In-process (ONNX Runtime, one thread, server core; median)", "", "| model | batch | inf/s |",
              "|---|---:|---:|"]
    lines += [f"| {model} | {b} | {_cell(inprocess(rows, model, b))} |" for model, _ in MODELS for b in (1, 32)]
    failed = [r for r in rows if "error" in r]
    lines += [f"\nFailed case {r['mode']} {r['model']}/{r.get('case')}: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def _comparison(doc: dict) -> list[str]:
    """The targets beside the previous report's (`compare`), naming those that fell by more than their spread."""
    rows, previous = doc.get("compared_with") or [], doc.get("previous") or {}
    if not rows:
        return []
    fell = [r["target"] for r in rows if r["fell"]]
    lines = ["", f"Against the previous report ({previous.get('file', '?')}, git {previous.get('git', '?')}): "
             + (f"**fell by more than its spread: {'; '.join(fell)}**." if fell else "nothing fell by more than its "
                "spread."), "", "| target | before | now | spread | |", "|---|---:|---:|---:|:---:|"]
    lines += [f"| {r['target']} | {r['before']:.2f} | {r['now']:.2f} | {r['spread']:.2f} | "
              f"{'FELL' if r['fell'] else ''} |" for r in rows]
    return lines


def _mixed_load(results: list[dict] | None) -> list[str]:
    """The mixed-load rows (`bench.serve.mixed_load`): each side alone and beside the other, one server."""
    if not results:
        return []
    lines = ["", "## Mixed load: each protocol alone and together (one tfship server, tflite digits)", "",
             "| pair | side | c | alone req/s | alone p99 ms | mixed req/s | mixed p99 ms | share | p99 x | holds |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for result in results:
        for side in result["sides"]:
            solo, mixed = side["solo"], side["mixed"]
            lines.append(f"| {result['pair']} | {side['label']} | {side['concurrency']} | "
                         f"{solo['requests_per_s']:,.0f} | {solo['p99_ms']:.0f} | {mixed['requests_per_s']:,.0f} | "
                         f"{mixed['p99_ms']:.0f} | {side['share']:.2f} | {side['p99_ratio']:.1f} | "
                         f"{'yes' if side['holds'] else 'NO'} |")
    return lines


def _encodings(m: dict, levels) -> list[str]:
    """gRPC inferences/s with typed-field answers (TF Serving's default) and with tensor_content answers."""
    if not any(k[2].endswith("_tensor_content") for k in m if k[0] == "grpc"):
        return []
    head = [f"{size} c={c}" for _, size in MODELS for c in levels]
    lines = ["", "## Answer encoding: typed fields (default) vs tensor_content (gRPC inferences/s; ratio typed / "
             "tensor_content)", "", "| server | encoding | " + " | ".join(head) + " |",
             "|---|---|" + "---:|" * len(head)]
    for typed, raw, label in ENCODING_ROWS:
        for case, encoding in ((typed, "typed fields (float_val, ...)"), (raw, "tensor_content")):
            cells = []
            for model, _ in MODELS:
                for c in levels:
                    value, other = _rate(m, "grpc", model, case, c), _rate(m, "grpc", model, raw, c)
                    extra = f" ({value / other:.2f}x)" if case == typed and value and other else ""
                    cells.append(_cell(value) + extra)
            lines.append(f"| {label} | {encoding} | " + " | ".join(cells) + " |")
    return lines


def _threads(m: dict, handler_cost: dict | None) -> list[str]:
    """Where the pinned server's core goes per request (gRPC cases), and tfship's handler cost in-process."""
    keys = sorted((k for k in m if k[0] == "grpc" and "main_us" in m[k]), key=lambda k: tuple(map(str, k)))
    if not keys:
        return []
    lines = ["", "## Where the server's core goes, per request (gRPC, medians)", "",
             "CPU time of the server's threads from /proc (schedstat) over the window, divided by the requests "
             "answered: `main` is the event loop (grpc.aio's callbacks, tfship's handler, ONNX Runtime when run "
             "inline); `other` is grpc's poller and event-engine threads, model threads and the batch thread. "
             "`preempted` counts the main thread's involuntary context switches per request.", "",
             "| model | case | c | req/s | main us | other us | total us | preempted |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for key in keys:
        v = m[key]
        lines.append(f"| {key[1]} | {key[2]} | {key[3]} | {v['inf_s']:,.0f} | {v['main_us']:.0f} | "
                     f"{v['other_us']:.0f} | {v['main_us'] + v['other_us']:.0f} | {v['main_preempted']:.1f} |")
    warm, cold = (handler_cost or {}).get("warm"), (handler_cost or {}).get("cold")
    if warm:
        lines += ["", f"tfship's Predict handler on the identity backend (request parsed, handler, reply serialised), "
                      f"called in a loop on the server core with no transport (`bench.serve.handler_cost`): "
                      f"**{warm['us_per_call']:.1f} us CPU per call** with warm caches ({warm['calls']:,} calls)"
                      + (f", **{cold['us_per_call']:.1f} us** when {cold['evict_mib']} MiB are written between calls "
                         f"so each call starts with cold caches ({cold['calls']:,} calls)" if cold else "")
                      + ". Compare the main-thread difference identity - bare above: in the server the core runs "
                      "grpc's work between two handler calls, so the handler runs at its cold-cache cost."]
    return lines


def _multiprocess(m: dict) -> list[str]:
    keys = sorted(k for k in m if k[0] == "multiprocess")
    if not keys:
        return []
    lines = ["", "## --num-processes (mlp, onnx batching, nothing pinned, 8 connections)", "",
             "| processes | c | inf/s | gain per added process |", "|---:|---:|---:|---:|"]
    for _, model, procs, c in keys:
        one = m.get(("multiprocess", model, 1, c))
        gain = (m[("multiprocess", model, procs, c)]["inf_s"] / one["inf_s"] - 1) / (procs - 1) if one and procs > 1 else None
        lines.append(f"| {procs} | {c} | {m[('multiprocess', model, procs, c)]['inf_s']:,.0f} | "
                     f"{_cell(gain and gain * 100, '{:+.0f} %')} |")
    lines += ["", "On this 2-core machine the load generator shares the two cores with both workers, so a second "
              "process can add at most what the load generator leaves free. On a host with N free cores (load "
              "generated elsewhere) each process is an independent event loop and model session on its own core, "
              "so throughput should grow close to N x one process until the NIC or memory bandwidth binds."]
    return lines


def plot(doc: dict, path: Path) -> None:
    """inferences/s vs concurrency: one panel per model (gRPC) plus one for REST; dashed: one-core limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = medians(doc["rows"])
    panels = [("grpc", model) for model, _ in MODELS] + [("rest", model) for model, _ in MODELS
                                                        if any(k[:2] == ("rest", model) for k in m)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (mode, model) in zip(axes[0], panels):
        for case in sorted({k[2] for k in m if k[:2] == (mode, model)}):
            pts = sorted((k[3], v["inf_s"]) for k, v in m.items() if k[:3] == (mode, model, case))
            ref = case in ("bare", "echo", "ort", "ort_batching", "rest_bare", "rest_ort")
            ax.plot(*zip(*pts), marker="o", linestyle="--" if ref else "-", label=case)
        if (mode, model) == ("grpc", "mlp") and doc["limit"]["limit"]:
            ax.axhline(doc["limit"]["limit"], color="grey", linewidth=0.8, linestyle=":")
            ax.text(1, doc["limit"]["limit"], " one-core limit", fontsize=7, va="bottom")
        ax.set(title=f"{model} ({mode})", xscale="log", xlabel="concurrency", ylabel="inferences/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict, out: Path) -> list[Path]:
    """Add targets and their comparison with the previous `serve-latest.json` in `out`; write
    serve-<timestamp>.json, serve-latest.json/.md/.png under `out`; returns the paths.
    """
    found, limit = targets(doc["rows"], tuple(doc["plan"]["levels"]))
    latest = out / "serve-latest.json"
    previous = json.loads(latest.read_text()) if latest.exists() else None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(doc["started"]))
    doc = {**doc, "targets": found, "limit": limit, "compared_with": compare(previous, found),
           "previous": {"file": f"serve-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(previous['started']))}.json",
                        "git": previous.get("host", {}).get("git_commit")} if previous else None}
    text = json.dumps(doc, indent=1, default=str)
    paths = [out / f"serve-{stamp}.json", out / "serve-latest.json", out / "serve-latest.md", out / "serve-latest.png"]
    for p in paths[:2]:
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(text)
        tmp.replace(p)
    paths[2].write_text(markdown(doc))
    plot(doc, paths[3])
    return paths
