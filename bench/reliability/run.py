"""`make reliability`: the longer attacks on tfship, with a summary table written to `bench/results/`.

Rows (each: tried, failed, verdict): Predict load during hot swaps with corrupt versions; SIGTERM/SIGHUP
under load; kill -9 of the publisher, of a `--num-processes` server, of a parent holding a serve-check server
and a TFLite converter, and of a whole `tfship run`; probes on every port under TLS/mTLS/tokens; metrics
cardinality; memory per request; a second server on a taken gRPC port; the hostile-load round
(`hostile_attacks`: mixed-protocol load, huge echoed names, unrepresentable REST bodies, secret rotation, SIGTERM
mid-body, memory after large bodies and after refused 64 MB gRPC requests, 60 MB bodies beside 1.5 MB ones).
Loopback only; bounded by
`--budget-s` (default 900 s): rows that no longer fit are reported `skipped`, never silently dropped.
Exit status 1 when any row failed. `--quick` shortens every row (about 3 minutes).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.reliability import bucket_attacks, hostile_attacks, process_attacks, serving_attacks
from bench.reliability.common import Row, build_repository

BATCHING = "max_batch_size { value: 512 }\nbatch_timeout_micros { value: 1500000 }\nmax_enqueued_batches { value: 100 }\n"


def _plan(quick: bool, work: Path, source: Path) -> list[tuple[str, float, object]]:
    """(row name, rough seconds it needs, thunk) in the order they run."""
    def n(full, short):
        return short if quick else full

    certs = serving_attacks.make_certs(work / "certs")
    (work / "tokens").write_text("# inference tokens\nreader\n")
    (work / "admin").write_text("operator\n")
    (work / "batching.txt").write_text(BATCHING)
    return [
        ("hot_swap_load", n(40, 20), lambda: serving_attacks.hot_swap_under_load(source, work, n(30, 12))),
        ("sigterm_under_load", n(60, 25), lambda: serving_attacks.sigterm_under_load(source, n(6, 2),
                                                                                     work / "batching.txt")),
        ("tls_mtls_tokens", 15, lambda: serving_attacks.ports_under_tls(source, certs, work / "tokens",
                                                                        work / "admin")),
        ("metrics_cardinality", 20, lambda: serving_attacks.metrics_cardinality(source, n(20000, 5000))),
        ("memory_per_request", 40, lambda: serving_attacks.memory_per_request(source, n(3, 2))),
        ("grpc_port_sharing", 15, lambda: serving_attacks.port_sharing(source)),
        ("mixed_load", n(200, 130), lambda: hostile_attacks.mixed_load(source, n(3.0, 2.0), 3)),
        ("bounded_echoes", 40, lambda: hostile_attacks.bounded_echoes(source)),
        ("unrepresentable_bodies", 20, lambda: hostile_attacks.unrepresentable_bodies(source)),
        ("secret_rotation", n(40, 30), lambda: hostile_attacks.secret_rotation(source, work, n(3, 2))),
        ("sigterm_mid_body", n(60, 30), lambda: hostile_attacks.sigterm_mid_body(source, n(3, 1))),
        ("memory_after_large_bodies", 40, lambda: hostile_attacks.memory_after_large_bodies(source, n(3, 2))),
        ("memory_after_refused_grpc", 60, lambda: hostile_attacks.memory_after_refused_grpc(source)),
        ("large_beside_medium", n(90, 60), lambda: hostile_attacks.large_beside_medium(source, n(5, 3))),
        ("kill9_publisher", n(20, 10), lambda: process_attacks.kill_publisher(source, work, n(30, 10))),
        ("kill9_server", n(90, 30), lambda: process_attacks.kill_server(source, n(8, 3))),
        ("kill9_stage_children", n(80, 30), lambda: process_attacks.kill_serve_check_parent(source, work, n(4, 2))),
        ("kill9_run", n(100, 50), lambda: process_attacks.kill_run(work, n(2, 1))),
        ("bucket_load", n(60, 30), lambda: bucket_attacks.bucket_under_load(source, work, n(4, 2))),
    ]


def run(out: Path, budget_s: float, quick: bool, seed: int, only: tuple[str, ...] = ()) -> list[Row]:
    """Run every row (or those named in `only`) that fits in `budget_s`; write `reliability-latest.{json,md}`
    into `out`.

    Raises:
        ValueError: `only` names a row that does not exist.
    """
    random.seed(seed)
    started = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tfship-reliability-") as tmp:
        work = Path(tmp)
        source = build_repository(work)
        plan = _plan(quick, work, source)
        unknown = sorted(set(only) - {name for name, _, _ in plan})
        if unknown:
            raise ValueError(f"--only: no row named {unknown}; rows: {[name for name, _, _ in plan]}")
        for name, needs_s, thunk in plan:
            if only and name not in only:
                continue
            left = budget_s - (time.monotonic() - started)
            if left < needs_s:
                rows.append(Row(name, "skipped: did not fit in the time budget", notes=f"{left:.0f}s left"))
                continue
            began = time.monotonic()
            try:
                row = thunk()
            except Exception as err:  # noqa: BLE001 (an attack harness crash is a failed row, reported)
                row = Row(name, "harness error")
                row.tried += 1
                row.fail(f"{type(err).__name__}: {err}"[:300])
            row.seconds = round(time.monotonic() - began, 1)
            rows.append(row)
            print(f"{row.attack:22s} tried {row.tried:6d} failed {row.failed:4d} {row.verdict} ({row.seconds}s)",
                  flush=True)
    _write(out, rows, time.monotonic() - started, quick, seed)
    return rows


def _write(out: Path, rows: list[Row], total_s: float, quick: bool, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "seconds": round(total_s),
            "quick": quick, "seed": seed, "cpus": os.cpu_count(), "python": platform.python_version(),
            "host_note": "shared machine (about 7 other sessions' jobs on 2 cores); loopback only"}
    data = {"meta": meta, "rows": [{**vars(r), "verdict": r.verdict if r.tried else "skipped"} for r in rows]}
    (out / "reliability-latest.json").write_text(json.dumps(data, indent=2))
    lines = ["# tfship reliability attacks", "",
             f"{meta['when']}, {meta['seconds']} s, seed {seed}{', quick' if quick else ''}; {meta['host_note']}; "
             f"{meta['cpus']} CPUs.", "",
             "| attack | what | tried | failed | verdict | s | notes / first failures |",
             "|---|---|---:|---:|---|---:|---|"]
    for r in rows:
        detail = "; ".join(r.failures) or r.notes
        if r.children:
            detail = (detail + "; " if detail else "") + f"child processes at each kill: {r.children}"
        lines.append(f"| {r.attack} | {r.what} | {r.tried} | {r.failed} | "
                     f"{r.verdict if r.tried else 'skipped'} | {r.seconds} | {detail} |")
    (out / "reliability-latest.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """CLI: `python -m bench.reliability.run --out bench/results [--budget-s 600] [--quick]`."""
    parser = argparse.ArgumentParser(prog="python -m bench.reliability.run")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--budget-s", type=float, default=900.0, help="wall-clock bound for all rows (seconds)")
    parser.add_argument("--quick", action="store_true", help="fewer tries per row (about 3 minutes)")
    parser.add_argument("--seed", type=int, default=0, help="random kill moments and names")
    parser.add_argument("--only", default="", help="comma-separated row names to run (default: every row)")
    args = parser.parse_args(argv)
    rows = run(args.out, args.budget_s, args.quick, args.seed, tuple(n for n in args.only.split(",") if n))
    return 1 if any(r.failed or not r.tried for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
