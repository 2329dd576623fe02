"""`make bench-input`: tfship's streaming input pipeline against hand-written tf.data, in the same run.

Three parts (bench/results/input-latest.{json,md}):

* throughput: records/s of `StreamSplit.dataset` (pipeline.data.stream) and of a plain tf.data pipeline on
  the same files, for TFRecord (`TFRecordDataset -> batch(256) -> parse_example -> prefetch`, the issue's
  reference) and CSV (lines -> batch -> `decode_csv` -> prefetch; and `CsvDataset` -> batch). Each pipeline is
  read to its end `--repeats` times, interleaved, and the median kept; the ratio is tfship / reference.
  tfship's training form (seeded shuffle, drop_remainder) is compared with the reference plus the same shuffle.
* memory: peak resident memory (process tree, /proc sampled every 20 ms) of `tfship train` on N and 10 N
  records (a tiny MLP, `train.max_steps` capped); target: within 10 %.
* input wait: the share of step time spent waiting for the next batch while the digits CNN trains from
  TFRecord shards (train.json `input.input_wait_share`), beside the same model on in-memory digits.

The data is generated into bench/work/ (gitignored) and kept for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.host import ROOT, host_info
from bench.input import make_data

WORK = ROOT / "bench" / "work" / "input"
BATCH = 256


def _rate(dataset) -> tuple[float, float, int]:
    """(records per wall second, records per CPU second of this process's threads, records) of one full read."""
    started, cpu, count = time.perf_counter(), time.process_time(), 0
    for inputs, *_ in dataset:
        count += int(inputs.shape[0])
    return count / (time.perf_counter() - started), count / max(time.process_time() - cpu, 1e-9), count


def _median_rates(pipelines: dict, repeats: int) -> dict:
    """Each pipeline read to its end `repeats` times, the pipelines interleaved (round-robin, the order rotated
    each round so none always runs first); medians of records/s (wall) and records per CPU second. On a machine
    shared with other jobs the wall rates swing with their load; CPU seconds count only the work done."""
    rates: dict[str, list[float]] = {name: [] for name in pipelines}
    per_cpu: dict[str, list[float]] = {name: [] for name in pipelines}
    counts: dict[str, int] = {}
    names = list(pipelines)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            rate, cpu_rate, counts[name] = _rate(pipelines[name]())
            rates[name].append(rate)
            per_cpu[name].append(cpu_rate)
    return {name: {"records_per_second": round(statistics.median(values)), "all": [round(v) for v in values],
                   "records_per_cpu_second": round(statistics.median(per_cpu[name])),
                   "all_per_cpu": [round(v) for v in per_cpu[name]], "records": counts[name]}
            for name, values in rates.items()}


def _tfship_split(fmt, files, classes, records):
    from tfship.pipeline.data.stream import StreamSplit

    return StreamSplit("train", fmt, tuple(files), None, None, classes, records)


def throughput_tfrecord(total: int, repeats: int) -> dict:
    import tensorflow as tf

    from tfship.pipeline.config import DataSection
    from tfship.pipeline.data.files import expand
    from tfship.pipeline.data.formats import tfrecord_format

    glob = make_data.write_tfrecord_shards(WORK / f"tfrecord-{total}", total, 8, 32)
    files = expand(glob, "bench")
    config = DataSection(source="tfrecord", path=glob, feature_spec={"x": {"dtype": "float32", "shape": [32]}})
    split = _tfship_split(tfrecord_format(config, files), files, ("0", "1", "2", "3"), total)
    spec = {"x": tf.io.FixedLenFeature([32], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(batch):
        parsed = tf.io.parse_example(batch, spec)
        return parsed["x"], parsed["label"]

    def reference(shuffle: bool = False):
        records = tf.data.TFRecordDataset(list(files), num_parallel_reads=tf.data.AUTOTUNE)
        if shuffle:
            records = records.shuffle(2048, seed=1)
        return records.batch(BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    return _median_rates({
        "reference": reference,
        "tfship": lambda: split.dataset(BATCH, training=False, seed=0),
        "reference+shuffle": lambda: reference(True),
        "tfship training": lambda: split.dataset(BATCH, training=True, seed=0, shuffle_buffer=2048),
    }, repeats)


def throughput_csv(total: int, repeats: int) -> dict:
    import tensorflow as tf

    from tfship.pipeline.config import DataSection
    from tfship.pipeline.data.files import expand
    from tfship.pipeline.data.formats import csv_format

    glob = make_data.write_csv_files(WORK / f"csv-{total}", total, 8, 16)
    files = expand(glob, "bench")
    config = DataSection(source="csv", path=glob, label="label")
    split = _tfship_split(csv_format(config, files[0]), files, ("0", "1", "2", "3"), total)
    defaults = [tf.constant([], tf.float32)] * 16 + [tf.constant([], tf.string)]

    def decode(lines):
        *columns, label = tf.io.decode_csv(lines, defaults)
        return tf.stack(columns, axis=1), label

    def lines_reference():
        names = tf.data.Dataset.from_tensor_slices(list(files))
        lines = names.interleave(lambda f: tf.data.TextLineDataset(f).skip(1), num_parallel_calls=tf.data.AUTOTUNE)
        return lines.batch(BATCH).map(decode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    def csv_dataset_reference():
        rows = tf.data.experimental.CsvDataset(list(files), [tf.float32] * 16 + [tf.string], header=True)
        return rows.batch(BATCH).map(lambda *c: (tf.stack(c[:16], axis=1), c[16])).prefetch(tf.data.AUTOTUNE)

    return _median_rates({
        "reference": lines_reference,
        "tfship": lambda: split.dataset(BATCH, training=False, seed=0),
        "reference CsvDataset": csv_dataset_reference,
    }, repeats)


def _train_config(path: Path, data: str, extra: str) -> Path:
    path.write_text(f"""[run]
model_name = "bench_input"
runs_dir = "{WORK / 'runs'}"
seed = 42

[data]
{data}

{extra}
""")
    return path


def _train(config: Path, label: str) -> dict:
    """`tfship train --config` under the RSS sampler, its scan cache removed first (the run scans its data)."""
    import shutil

    from bench.memory import run_sampled

    shutil.rmtree(WORK / "runs" / ".data-scan", ignore_errors=True)
    log = WORK / f"{label}.log"
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tfship.pipeline.cli", "train", "--config", str(config)]
    run = run_sampled(command, 1800, log, env=env, cwd=WORK)
    if run.returncode != 0:
        raise RuntimeError(f"{label}: tfship train exited {run.returncode}:\n{run.tail(20)}")
    folder = max((WORK / "runs").glob("*-bench_input-*"), key=lambda p: p.stat().st_mtime)
    train = json.loads((folder / "train.json").read_text())
    details = train.get("details", train)
    return {"peak_rss_bytes": run.peak_rss_bytes, "seconds": round(run.seconds, 1), "steps": train.get("steps"),
            "input": details.get("input"), "test_accuracy": train.get("test_accuracy"), "run": folder.name}


def memory(small: int, steps: int) -> dict:
    rows = {}
    for total in (small, 10 * small):
        glob = make_data.write_tfrecord_shards(WORK / f"mem-{total}", total, 10, 8)
        config = _train_config(WORK / f"mem-{total}.toml", f'''source = "tfrecord"
path = "{glob}"
batch_size = 256
[data.feature_spec.x]
dtype = "float32"
shape = [8]''', f'''[model]
kind = "mlp"
hidden_units = [16]

[train]
epochs = 1
max_steps = {steps}
jit_compile = false
tensorboard = false''')
        rows[str(total)] = _train(config, f"mem-{total}")
    small_peak, large_peak = (rows[str(n)]["peak_rss_bytes"] for n in (small, 10 * small))
    return {"runs": rows, "ratio_large_to_small": round(large_peak / small_peak, 4), "target": "< 1.10"}


def input_wait(epochs: int) -> dict:
    glob = make_data.write_digits_shards(WORK / "digits", 8)
    cnn = f'''[model]
kind = "cnn"
filters = [32, 64]
dense_units = 256
dropout = 0.1

[train]
epochs = {epochs}
jit_compile = true
tensorboard = false'''
    streamed = _train_config(WORK / "digits-tfrecord.toml", f'''source = "tfrecord"
path = "{glob}"
input_name = "image"
features = ["image"]
batch_size = 64
[data.feature_spec.image]
dtype = "float32"
shape = [8, 8, 1]''', cnn)
    memory_config = _train_config(WORK / "digits-memory.toml", 'source = "digits"\nbatch_size = 64', cnn)
    return {"tfrecord shards": _train(streamed, "digits-tfrecord"), "in-memory digits": _train(memory_config,
                                                                                               "digits-memory"),
            "target": "input_wait_share < 0.10 (tfrecord shards)"}


def _ratio(rows: dict, ours: str, reference: str) -> dict:
    """Ours / reference: of the median wall rates, the median of the per-round wall ratios (each round runs both
    back to back, so a busy spell hits both alike), and of the median records per CPU second."""
    paired = [a / b for a, b in zip(rows[ours]["all"], rows[reference]["all"], strict=True)]
    return {"of_medians": round(rows[ours]["records_per_second"] / rows[reference]["records_per_second"], 3),
            "median_paired": round(statistics.median(paired), 3), "paired": [round(r, 3) for r in paired],
            "per_cpu_second": round(rows[ours]["records_per_cpu_second"] / rows[reference]["records_per_cpu_second"],
                                    3)}


def _carried(part: dict) -> list[str]:
    run = part.get("carried_from")
    if not run:
        return []
    return [f"(From an earlier run: `{run['command']}` at commit {run['host']['git_commit']}.)", ""]


def write_report(results: dict, out: Path) -> list[Path]:
    """input-latest.json and input-latest.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "input-latest.json", out / "input-latest.md"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    lines = ["# Input pipeline benchmark (`make bench-input`)", "",
             f"Host: {results['host']['cpus']} CPUs, 1-min load {results['host']['loadavg_1m']:.1f} at the start (a "
             f"shared machine: figures are noisy), commit {results['host']['git_commit']}; command: "
             f"`{results['command']}`; {results['seconds']:.0f} s.", ""]
    for kind in ("tfrecord", "csv"):
        part = results.get("throughput", {}).get(kind)
        if not part:
            continue
        lines += [f"## Throughput, {kind} ({part['records']:,} records, batch {BATCH}, median of "
                  f"{len(next(iter(part['rates'].values()))['all'])})", "", *_carried(results["throughput"]),
                  "| pipeline | records/s | each run | records per CPU second |",
                  "| --- | ---: | --- | ---: |"]
        lines += [f"| {name} | {row['records_per_second']:,} | {', '.join(f'{v:,}' for v in row['all'])} | "
                  f"{row['records_per_cpu_second']:,} |" for name, row in part["rates"].items()]
        lines += ["", "| ratio (target >= 0.9) | median of per-round wall ratios | of median wall rates | each round "
                  "| per CPU second |", "| --- | ---: | ---: | --- | ---: |"]
        lines += [f"| {k} | **{v['median_paired']}** | {v['of_medians']} | {', '.join(map(str, v['paired']))} | "
                  f"{v['per_cpu_second']} |" for k, v in part["ratios"].items()]
        lines.append("")
    if "memory" in results:
        mem = results["memory"]
        lines += ["## Peak resident memory of `tfship train` (process tree)", "", *_carried(mem),
                  "| records | peak RSS MiB | wall s | steps | train records/s | input wait |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for total, row in mem["runs"].items():
            figures = row["input"] or {}
            lines.append(f"| {int(total):,} | {row['peak_rss_bytes'] / 2**20:,.0f} | {row['seconds']} | {row['steps']} "
                         f"| {figures.get('records_per_second')} | {figures.get('input_wait_share')} |")
        lines += ["", f"10x records / 1x records peak: **{mem['ratio_large_to_small']}** (target {mem['target']}).", ""]
    if "input_wait" in results:
        lines += ["## Input wait of the digits CNN (train.json `input`)", "", *_carried(results["input_wait"]),
                  "| data | input-wait share | train records/s | steps | test accuracy | wall s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, row in results["input_wait"].items():
            if isinstance(row, dict) and "input" in row:
                figures = row["input"] or {}
                lines.append(f"| {name} | {figures.get('input_wait_share')} | {figures.get('records_per_second')} | "
                             f"{row['steps']} | {row['test_accuracy']:.4f} | {row['seconds']} |")
        lines += ["", f"Target: {results['input_wait']['target']}.", ""]
    md_path.write_text("\n".join(lines) + "\n")
    return [json_path, md_path]


def main(argv: list[str] | None = None) -> int:
    """Run the parts named by --parts and write the report (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--parts", default="throughput,memory,wait")
    parser.add_argument("--records", type=int, default=400_000, help="throughput: TFRecord records (CSV: half)")
    parser.add_argument("--memory-records", type=int, default=1_000_000, help="memory: the small run (10x too)")
    parser.add_argument("--memory-steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=15, help="input wait: digits CNN epochs")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    started = time.perf_counter()
    WORK.mkdir(parents=True, exist_ok=True)
    results: dict = {"host": host_info(), "repeats": args.repeats,
                     "command": "make bench-input " + " ".join(argv if argv is not None else sys.argv[1:])}
    if "throughput" in parts:
        tfrecord = throughput_tfrecord(args.records, args.repeats)
        csv = throughput_csv(args.records // 2, args.repeats)
        results["throughput"] = {
            "tfrecord": {"records": args.records, "rates": tfrecord,
                         "ratios": {"tfship / reference": _ratio(tfrecord, "tfship", "reference"),
                                    "tfship training / reference+shuffle": _ratio(tfrecord, "tfship training",
                                                                                  "reference+shuffle")}},
            "csv": {"records": args.records // 2, "rates": csv,
                    "ratios": {"tfship / reference (lines + decode_csv)": _ratio(csv, "tfship", "reference"),
                               "tfship / CsvDataset": _ratio(csv, "tfship", "reference CsvDataset")}}}
        print(json.dumps(results["throughput"], indent=1), flush=True)
    if "memory" in parts:
        results["memory"] = memory(args.memory_records, args.memory_steps)
        print(json.dumps(results["memory"], indent=1), flush=True)
    if "wait" in parts:
        results["input_wait"] = input_wait(args.epochs)
        print(json.dumps(results["input_wait"], indent=1), flush=True)
    results["seconds"] = round(time.perf_counter() - started, 1)
    previous = args.out / "input-latest.json"
    if previous.is_file():  # parts not run this time are kept from the last report, marked with its run
        earlier = json.loads(previous.read_text())
        for key in ("throughput", "memory", "input_wait"):
            if key not in results and key in earlier:
                results[key] = earlier[key] | {"carried_from": earlier.get("carried_from_run")
                                               or {"command": earlier["command"], "host": earlier["host"]}}
    results["carried_from_run"] = {"command": results["command"], "host": results["host"]}
    for path in write_report(results, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
