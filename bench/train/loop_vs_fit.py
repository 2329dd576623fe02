"""`make bench-train-loop` (issue 39): `tfship train` against a hand-written Keras `fit` on the same data, model,
batch, optimizer (Adam, no clipping, the same learning rate) and XLA setting, ratios taken within one run.

    python -m bench.train.loop_vs_fit [--out bench/results] [--records 1000000] [--e2e-small 100000]
                                       [--e2e-variants cold,declared] [--repeats 3] [--quick]
                                       [--cases mlp,cnn,rec,modes]

Cases (each `tfship train` and each reference is its own process; a round runs every process of a case once,
the order rotated between rounds, and the ratios are the medians of the per-round ratios):

1. `mlp` (overhead-bound): N tf.Examples (x float32 [32], label 0..9) in 8 TFRecord shards, 32 -> 16 relu -> 10,
   batch 256, Adam, XLA, one epoch. tfship: train.json `input.records_per_second`. Reference
   (bench/train/loop_reference.py): Keras fit over TFRecordDataset -> shuffle -> batch(256, drop_remainder) ->
   parse_example -> prefetch, `steps_per_execution` 1, 32 and 256 (each reported); the best K is the
   reference. Both figures are timed over the same span: the K-step blocks after the first (which traces,
   compiles and fills the pipeline), their steps x batch over their summed wall time (tfship's `InputMeter`;
   the reference's block callback). Target: tfship >= 1.0x.
2. `cnn`: the digits CNN of configs/digits.toml (its model, batch 64, XLA) vs Keras fit of the same layers on
   the same train arrays, `--cnn-epochs` epochs.
3. `rec`: the recommender with a 5 M-row user table (ids drawn from 50 k users) through `tfship train`
   (model.kind recommender) vs Keras fit of the factory's model, `--rec-steps` steps of batch 512, XLA. Adam's
   moment updates touch the whole table (seconds a step here), so these runs are few and short
   (`--rec-repeats` rounds, default 1).
4. end to end: the marginal rate of whole `tfship train` processes, (N - n) / (T_N - T_n) records/s, from a run
   on N records (the `mlp` case's) and one on n = `--e2e-small` records (default N / 10; the same 8-shard
   layout and the same 2,000-record validation and test files), T being each process's wall time (start-up,
   the counted pass, training, evaluation, saving); against plain tf.data merely reading + parsing the N
   shards (TFRecordDataset -> batch(256) -> parse_example -> prefetch, records/s). Target >= 0.5x. Two
   variants, each reported with whether the counted pass (pipeline/data/scan.py, cached in
   `<runs_dir>/.data-scan`) ran, was reused or was skipped: `cold` (a fresh runs_dir: the scan runs) and
   `declared` (`data.split_sizes` given: no scan).
5. `modes`: the recommender through `tfship train` itself: eager (`train.run_eagerly`), tf.function and XLA, in
   float32 and mixed_bfloat16 (5 M-row table), and the 5 M- against a 50 k-row user table (tf.function, XLA).

Every `tfship train` row says what its layers computed in, read back from the run's model.keras (each layer's
dtype policy). `train.steps_per_execution` (the new loop's key) is passed only when this tfship's
`TrainSection` has it (`--tfship-spe`, default auto). Data is generated once into bench/work/train-loop/
(seeded) and kept. Writes train-loop-latest.json (every figure, each round, spread, host), train-loop-latest.md
(the table, PASS/MISS) and train-loop-latest.png into `--out`. `--quick`: tiny data (20 k and 5 k records), one
round, one reference K (32), short runs, and `--parallel` (a round's processes at the same time: figures not
comparable): the smoke test's mode, with `--cases mlp --e2e-variants cold`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.host import ROOT, host_info, uptime
from bench.train.loop_report import _finite, checks, markdown, plot
from bench.train.loop_runs import (
    MODES,
    QUICK_MODES,
    REC_ITEMS,
    REC_USERS,
    SCHEMA,
    SMALL_TABLE,
    TARGETS,
    WORK,
    cnn_config,
    has_steps_per_execution,
    mlp_config,
    rec_config,
    rec_data,
    reference,
    say,
    spread,
    tfship_train,
)


def _fit(r: dict, spe: int) -> dict:
    return next(f for f in r["reference"]["fits"] if f["steps_per_execution"] == spe)


def versus_fit(rounds: list[dict], target: float | None) -> dict:
    """The summary of a tfship-vs-Keras-fit case: tfship's figures, each K's reference, the best K, the ratio.

    Like for like: tfship's steady figure (train.json `input.records_per_second`: its K-step blocks after the
    first, summed) against the reference's fit timed the same way (its blocks after the first, summed: see
    loop_reference); where tfship reports only its whole fit, against the reference's whole fit (cold).
    """
    steady = "input.records_per_second" in rounds[0]["tfship"]["figure"]
    key = "records_per_second" if steady else "cold_records_per_second"
    spes = [f["steps_per_execution"] for f in rounds[0]["reference"]["fits"]]
    by_spe = {k: spread([_fit(r, k)[key] for r in rounds]) for k in spes}
    best = max(spes, key=lambda k: by_spe[k]["median"])
    paired = [r["tfship"]["records_per_second"] / _fit(r, best)[key] for r in rounds]
    summary = {
        "tfship_records_per_second": spread([r["tfship"]["records_per_second"] for r in rounds]),
        "tfship_figure": rounds[0]["tfship"]["figure"],
        "tfship_whole_process_records_per_second": spread(
            [r["tfship"]["whole_process_records_per_second"] for r in rounds]),
        "reference_figure": ("Keras fit's K-step blocks after the first, summed (the first traces, compiles and "
                             "fills the pipeline: left out, as tfship's meter leaves out its first block)" if steady
                             else "the whole fit (compile included, as in tfship's figure)"),
        "reference_records_per_second_by_steps_per_execution": {str(k): v for k, v in by_spe.items()},
        "reference_steady_records_per_second_by_steps_per_execution": {
            str(k): spread([_fit(r, k)["records_per_second"] for r in rounds]) for k in spes},
        "reference_best_steps_per_execution": best, "ratio": spread(paired)}
    if target is not None:
        summary |= {"target": f">= {target}", "pass": summary["ratio"]["median"] >= target}
    return summary


# ---------------------------------------------------------------- the cases
def _rounds(name: str, jobs: dict, args, repeats: int | None = None) -> list[dict]:
    """Each job once per round, the order rotated between rounds; progress lines as they finish. Under
    `--parallel` (the smoke test's mode) a round's processes run at the same time: quick, figures not
    comparable."""
    rounds = []
    names = list(jobs)
    repeats = repeats or args.repeats

    def one(job: str, index: int) -> dict:
        started = time.perf_counter()
        result = jobs[job](f"{name}-{job}-r{index + 1}")
        rate = result.get("records_per_second") or max(
            (f["records_per_second"] for f in result.get("fits", [])), default=0.0)
        say(f"{name} round {index + 1}/{repeats}: {job} {rate:,.0f} records/s "
            f"({time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f})")
        return result

    for index in range(repeats):
        shift = index % len(names)
        order = names[shift:] + names[:shift]
        if args.parallel:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(order)) as pool:
                futures = {job: pool.submit(one, job, index) for job in order}
            rounds.append({job: futures[job].result() for job in order})
        else:
            rounds.append({job: one(job, index) for job in order})
    return rounds


def _marginal(big: dict, small: dict, n_big: int, n_small: int) -> float | None:
    """(N - n) / (T_N - T_n): records/s of the records a bigger run adds (whole `tfship train` processes); None
    when T_N <= T_n (tiny sizes: the difference is lost in the noise of the processes' start-up)."""
    extra = big["wall_s"] - small["wall_s"]
    return round((n_big - n_small) / extra, 1) if extra > 0 else None


def end_to_end_summary(rounds: list[dict], variant: str, n_big: int, n_small: int) -> dict:
    big, small = ("tfship", "tfship_small") if variant == "cold" else ("tfship_declared", "tfship_small_declared")
    rates = [_marginal(r[big], r[small], n_big, n_small) for r in rounds]
    reads = [r["reference"]["read"]["records_per_second"] for r in rounds]
    ratios = [rate / read for rate, read in zip(rates, reads, strict=True) if rate is not None]
    measured = [rate for rate in rates if rate is not None]
    summary = {
        "variant": variant,
        "what": ("cold: a fresh runs_dir each run, so the counted pass (the scan) reads every record first"
                 if variant == "cold" else "declared: data.split_sizes given, so there is no counted pass"),
        "marginal_records_per_second": spread(measured) if measured else None,
        "marginal_rounds_measured": f"{len(measured)} of {len(rounds)}",
        "read_parse_records_per_second": spread(reads),
        "wall_s": {f"{n_big:,}": spread([r[big]["wall_s"] for r in rounds]),
                   f"{n_small:,}": spread([r[small]["wall_s"] for r in rounds])},
        "train_loop_seconds": {f"{n_big:,}": spread([r[big]["train_seconds"] for r in rounds]),
                               f"{n_small:,}": spread([r[small]["train_seconds"] for r in rounds])},
        "scan": {f"{n_big:,}": sorted({r[big]["scan"] for r in rounds}),
                 f"{n_small:,}": sorted({r[small]["scan"] for r in rounds})},
        "scan_seconds": {f"{n_big:,}": [r[big]["scan_seconds"] for r in rounds],
                         f"{n_small:,}": [r[small]["scan_seconds"] for r in rounds]},
        "target": f">= {TARGETS['end_to_end']}"}
    if ratios:
        summary |= {"ratio": spread(ratios), "pass": statistics.median(ratios) >= TARGETS["end_to_end"]}
    else:
        summary |= {"ratio": None, "pass": None}
    return summary


def case_mlp(args) -> tuple[dict, dict]:
    """The MLP case and the end-to-end case in one set of rounds: `tfship` (N records, fresh runs_dir) is the
    MLP case's tfship run and the end-to-end case's cold N run."""
    from bench.train.loop_data import HELD_OUT, mlp_shards

    n_big, n_small = args.records, args.e2e_small
    paths = mlp_shards(args.work / f"mlp-{n_big}", n_big, say=say)
    small_paths = mlp_shards(args.work / f"mlp-{n_small}", n_small, say=say)
    words = ["--case", "mlp", "--train", paths["train"], "--spe", args.spe, "--read"]
    jobs = {"tfship": lambda label: tfship_train(label, mlp_config(paths, args), args),
            "reference": lambda label: reference(label, words, args),
            "tfship_small": lambda label: tfship_train(label, mlp_config(small_paths, args), args)}
    variants = [v.strip() for v in args.e2e_variants.split(",") if v.strip()]
    if "declared" in variants:
        def sizes(n):
            return {"train": n, "validation": HELD_OUT, "test": HELD_OUT}

        jobs["tfship_declared"] = lambda label: tfship_train(label, mlp_config(paths, args, sizes(n_big)), args)
        jobs["tfship_small_declared"] = lambda label: tfship_train(
            label, mlp_config(small_paths, args, sizes(n_small)), args)
    rounds = _rounds("mlp", jobs, args)
    mlp_rounds = [{"tfship": r["tfship"], "reference": r["reference"]} for r in rounds]
    mlp = {"records": n_big, "shards": 8, "model": "32 -> 16 relu -> 10", "batch": 256, "xla": True,
           "rounds": mlp_rounds, "summary": versus_fit(mlp_rounds, TARGETS["mlp"])}
    end_to_end = {
        "records": {"big": n_big, "small": n_small, "held_out_each": HELD_OUT, "shards": 8},
        "definition": f"marginal rate of whole `tfship train` processes: ({n_big:,} - {n_small:,}) / "
                      f"(T_{n_big:,} - T_{n_small:,}) records/s (T: the process's wall time: start-up, scan, training, "
                      "evaluation, saving), against plain tf.data read + parse of the same "
                      f"{n_big:,}-record shards (records/s, in the reference process)",
        "variants": {v: end_to_end_summary(rounds, v, n_big, n_small) for v in ("cold", "declared") if v in variants},
        "rounds": [{k: v for k, v in r.items() if k != "reference"} | {"read": r["reference"]["read"]}
                   for r in rounds]}
    return mlp, end_to_end


def case_cnn(args) -> dict:
    text = cnn_config(args)
    words = ["--case", "cnn", "--epochs", str(args.cnn_epochs), "--spe", args.spe]
    rounds = _rounds("cnn", {"tfship": lambda label: tfship_train(label, text, args),
                             "reference": lambda label: reference(label, words, args)}, args)
    return {"data": "scikit-learn digits, tfship's train split", "epochs": args.cnn_epochs, "batch": 64, "xla": True,
            "rounds": rounds, "summary": versus_fit(rounds, None)}


def _rec_tfship(manifest, folder, args, table, mode, precision):
    text = rec_config(manifest, folder, args, table=table, mode=mode, precision=precision)
    return lambda label: tfship_train(label, text, args)


def _key(mode: str, precision: str, table: int) -> str:
    return f"{mode}_{precision}_{table}"


def case_recommender(args, manifest: dict, folder: Path, cases: list[str]) -> dict:
    """The `rec` and `modes` cases in one set of rounds (the XLA float32 5 M-row `tfship train` run is both
    `rec`'s tfship figure and a row of `modes`)."""
    big = args.big_table
    grid = [(m, p, big) for m, p in (QUICK_MODES if args.quick else MODES)] if "modes" in cases else []
    if "modes" in cases:
        grid += [("tf.function", "float32", SMALL_TABLE)] + ([] if args.quick else [("xla", "float32", SMALL_TABLE)])
    if "rec" in cases and ("xla", "float32", big) not in grid:
        grid.append(("xla", "float32", big))
    jobs = {_key(*g): _rec_tfship(manifest, folder, args, g[2], g[0], g[1]) for g in grid}
    if "rec" in cases:
        words = ["--case", "rec", "--train", str(folder / "part-0000[0-5]-of-00008.tfrecord"), "--spe", args.rec_spe,
                 "--steps", str(args.rec_steps), "--user-rows", str(big), "--item-rows", str(REC_ITEMS)]
        jobs["reference"] = lambda label: reference(label, words, args)
    rounds = _rounds("rec", jobs, args, args.rec_repeats)
    out = {}
    if "rec" in cases:
        paired = [{"tfship": r[_key("xla", "float32", big)], "reference": r["reference"]} for r in rounds]
        out["rec"] = {"records": args.rec_records, "user_table_rows": big, "user_ids_drawn_from": REC_USERS,
                      "batch": 512, "steps": args.rec_steps, "xla": True, "rounds": paired,
                      "summary": versus_fit(paired, None)}
    if "modes" in cases:
        out["modes"] = modes_summary(grid, rounds, args)
    return out


def modes_summary(grid: list[tuple], rounds: list[dict], args) -> dict:
    rows = {}
    for mode, precision, table in grid:
        runs = [r[_key(mode, precision, table)] for r in rounds]
        rows[_key(mode, precision, table)] = {
            "mode": mode, "precision": precision, "user_table_rows": table, "steps": runs[0]["steps"],
            "records_per_second": spread([r["records_per_second"] for r in runs]),
            "ms_per_step": spread([1000.0 * r["batch"] / r["records_per_second"] for r in runs]),
            "whole_process_records_per_second": spread([r["whole_process_records_per_second"] for r in runs]),
            "train_seconds": spread([r["train_seconds"] for r in runs]), "wall_s": spread([r["wall_s"] for r in runs]),
            "model_dtype_policy": runs[0]["model_dtype_policy"], "layers": runs[0]["layers"],
            "figure": runs[0]["figure"]}

    def ratio(a: tuple, b: tuple) -> dict | None:
        if _key(*a) not in rows or _key(*b) not in rows:
            return None
        return spread([r[_key(*a)]["records_per_second"] / r[_key(*b)]["records_per_second"] for r in rounds])

    big, small = args.big_table, SMALL_TABLE
    wanted = {"tf.function / eager (float32)": (("tf.function", "float32", big), ("eager", "float32", big)),
              "xla / tf.function (float32)": (("xla", "float32", big), ("tf.function", "float32", big)),
              "xla / eager (float32)": (("xla", "float32", big), ("eager", "float32", big)),
              "mixed_bfloat16 / float32 (xla)": (("xla", "mixed_bfloat16", big), ("xla", "float32", big)),
              "mixed_bfloat16 / float32 (tf.function)": (("tf.function", "mixed_bfloat16", big),
                                                         ("tf.function", "float32", big)),
              f"{small:,} / {big:,} rows (tf.function)": (("tf.function", "float32", small),
                                                          ("tf.function", "float32", big)),
              f"{small:,} / {big:,} rows (xla)": (("xla", "float32", small), ("xla", "float32", big))}
    ratios = {name: value for name, (a, b) in wanted.items() if (value := ratio(a, b)) is not None}
    notes = []
    if any(r["precision"] == "mixed_bfloat16" and r["model_dtype_policy"] == "float32" for r in rows.values()):
        notes.append("train.mixed_precision = mixed_bfloat16 left the recommender's layers float32 (model.keras "
                     "config): the policy was not applied, so the bf16 rows time float32")
    else:
        notes.append("layers' compute dtype read back from each run's model.keras (dtype policy per layer): " + "; ".join(
            f"{r['mode']} {r['precision']}: {(r.get('layers') or {}).get('text', 'n/a')}" for r in rows.values()))
    return {"records": args.rec_records, "batch": 512, "steps": args.rec_steps, "eager_steps": args.rec_eager_steps,
            "user_ids_drawn_from": REC_USERS, "rows": rows,
            "ratios": {"records_per_second": ratios}, "ratios_read": "a / b of records/s: above 1, a is faster",
            "notes": notes}


# ---------------------------------------------------------------- the report
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train.loop_vs_fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--cases", default="mlp,cnn,rec,modes")
    parser.add_argument("--records", type=int, default=1_000_000, help="mlp / end to end: training records")
    parser.add_argument("--e2e-small", type=int, default=None, help="end to end: the smaller run's training "
                        "records (default --records / 10)")
    parser.add_argument("--e2e-variants", default="cold,declared", help="end to end: cold (fresh runs_dir: the "
                        "scan runs) and/or declared (data.split_sizes: no scan)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spe", default="1,32,256", help="reference steps_per_execution values (mlp, cnn)")
    parser.add_argument("--rec-spe", default="1", help="reference steps_per_execution values (recommender: seconds "
                        "a step with Adam on a 5 M-row table, so the trip to the host is noise)")
    parser.add_argument("--rec-repeats", type=int, default=1, help="rounds of the recommender cases (each ~20 min "
                        "on 2 cores at 5 M rows)")
    parser.add_argument("--tfship-spe", default="auto", help="train.steps_per_execution when tfship has the key; "
                        "'omit' never passes it")
    parser.add_argument("--cnn-epochs", type=int, default=60)
    parser.add_argument("--rec-records", type=int, default=50_000)
    parser.add_argument("--rec-steps", type=int, default=12, help="recommender steps per run (max_steps)")
    parser.add_argument("--rec-eager-steps", type=int, default=4)
    parser.add_argument("--big-table", type=int, default=5_000_000, help="user table rows of the large table")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per process")
    parser.add_argument("--quick", action="store_true", help="tiny data, one round, short runs, --parallel "
                        "(smoke test)")
    parser.add_argument("--parallel", action="store_true", help="run a round's processes at the same time (quick; "
                        "the figures are then not comparable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.quick:
        args.records, args.repeats, args.cnn_epochs = min(args.records, 20_000), 1, 1
        args.rec_records, args.rec_steps, args.rec_eager_steps = min(args.rec_records, 8_000), 4, 2
        args.spe, args.rec_spe, args.big_table = "32", "1", min(args.big_table, 100_000)
        args.e2e_small, args.parallel = min(args.e2e_small or 5_000, args.records // 2), True
    args.e2e_small = args.e2e_small or max(1, args.records // 10)
    if not 0 < args.e2e_small < args.records:
        parser.error(f"--e2e-small {args.e2e_small}: between 0 and --records {args.records}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    started = time.perf_counter()
    results: dict = {"schema": SCHEMA, "command": "python -m bench.train.loop_vs_fit " + " ".join(
        argv if argv is not None else sys.argv[1:]), "host": host_info() | {"uptime": uptime()},
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeats": args.repeats,
        "quick": args.quick, "parallel": args.parallel, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tfship_steps_per_execution": (args.tfship_spe if has_steps_per_execution() and args.tfship_spe != "omit"
                                       else "not passed (TrainSection has no steps_per_execution)"
                                       if not has_steps_per_execution() else "not passed (--tfship-spe omit)"),
        "cases": {}}
    say(f"cases {cases}, {args.repeats} round(s), {args.records:,} mlp records; load {os.getloadavg()[0]:.1f}")
    if "mlp" in cases:
        results["cases"]["mlp"], results["cases"]["end_to_end"] = case_mlp(args)
    if "cnn" in cases:
        results["cases"]["cnn"] = case_cnn(args)
    if "rec" in cases or "modes" in cases:
        manifest, folder = rec_data(args)
        results["cases"] |= case_recommender(args, manifest, folder, cases)
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["checks"] = checks(results)
    results["all_figures_finite"] = _finite(results)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [args.out / "train-loop-latest.json", args.out / "train-loop-latest.md", args.out / "train-loop-latest.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results))
    plot(results, paths[2])
    print(markdown(results))
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
