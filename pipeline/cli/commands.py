"""Handlers of the pipeline subcommands: each shows progress on long work and ends with a table."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tfship.core.errors import ConfigError
from tfship.pipeline.api.inspection import inspect
from tfship.pipeline.api.ship import ship_configured
from tfship.pipeline.api.stages import run_stage
from tfship.pipeline.cli.arguments import config_from_args, overrides_from_args
from tfship.pipeline.config import with_overrides
from tfship.pipeline.export_only.user_model import ExportOnlyRequest
from tfship.pipeline.orchestration.outcomes import RunStatus
from tfship.pipeline.orchestration.report import summary_notes, summary_tables
from tfship.pipeline.orchestration.resume import resolve_run, stored_config
from tfship.pipeline.orchestration.run import latest_run
from tfship.pipeline.orchestration.run_config import CONFIG_FILE, RunConfig
from tfship.pipeline.orchestration.stages import RunFolder, StageRecord, StageStatus
from tfship.pipeline.training.workers import launch_workers, worst_exit_code

console = Console(width=None if Console().is_terminal else 160)


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                    "{task.total}"), TimeElapsedColumn(), console=console, transient=False)


def _print_stage(name: str, record: StageRecord) -> None:
    colour = {StageStatus.OK: "green", StageStatus.FAILED: "red", StageStatus.SKIPPED: "yellow"}[record.status]
    note = f" — {record.reason}" if record.reason else ""
    console.print(f"[{colour}]{record.status.value:>7}[/{colour}] {name} ({record.seconds:.1f} s){note}",
                  highlight=False)


def cmd_run(args: argparse.Namespace) -> int:
    """`tfship run`: the whole pipeline through the API's code path (`tfship.ship`:
    `pipeline.api.ship.ship_configured`); prints the stage, artifact and publish tables and a status line.

    Returns the exit code: 0 every artifact published, 3 published with optional artifacts left out
    (`status: partial`); a failure raises (exit 2, nothing published). Under `train.strategy = "multi_worker"`
    only the chief runs the whole pipeline; another worker trains, says so and exits 0 (`_train_as_non_chief`),
    and a failure ends the process at once (`_ending_cleanly`).
    """
    config = config_from_args(args)
    started = time.perf_counter()
    if config.train.strategy == "multi_worker" and not getattr(args, "model", None):
        from tfship.pipeline.training.cluster import read_cluster  # only multi-worker runs read TF_CONFIG

        cluster = read_cluster()
        if not cluster.is_chief:
            return _ending_cleanly(lambda: _train_as_non_chief(args, cluster), "tfship run")
        return _ending_cleanly(lambda: _pipeline_command(args, config, started), "tfship run")
    return _pipeline_command(args, config, started)


def _pipeline_command(args: argparse.Namespace, config, started: float) -> int:
    """`tfship run`'s work once the config is known (see cmd_run)."""
    if bool(getattr(args, "model", None)) != bool(getattr(args, "data", None)):
        raise ConfigError("tfship run: --model and --data go together (export-only mode needs both)")
    request = None
    if getattr(args, "model", None) and not getattr(args, "resume", None):
        tags = tuple(t.strip() for t in args.tags.split(",") if t.strip())
        if not tags:
            raise ConfigError(f"tfship run: --tags {args.tags!r} names no tag; e.g. --tags serve")
        request = ExportOnlyRequest(args.model, args.data, tags, tuple(args.custom_objects))
    ignored = [f"--set {text}" for text in args.overrides] + [
        flag for flag, value in (("--config", args.config), ("--epochs", args.epochs)) if value is not None]
    if getattr(args, "resume", None) and ignored:
        console.print(f"[yellow]tfship run --resume: {', '.join(ignored)} ignored: a resumed run keeps the "
                      "config it started with (config.json); to change a setting of one stage, run that stage "
                      "alone, e.g. tfship validate --run <run> --set validate.float16.atol=0.05[/yellow]",
                      soft_wrap=True)
    with _progress() as progress:
        result = ship_configured(config, request, getattr(args, "resume", None), progress, _print_stage)
    stages, artifacts = summary_tables(result.summary, list(result.stages))
    console.print(stages)
    console.print(artifacts)
    for note in summary_notes(result.summary):  # whole, wrapped by rich, never cut
        console.print(note, highlight=False, markup=False)
    published = Table(title="published")
    for column in ("model", "version", "path", "audit", "served by our server", "left out", "total seconds"):
        published.add_column(column)
    left_out = [a.name for a in result.artifacts if not a.published]
    published.add_row(result.model_name, str(result.version), str(result.published),
                      "passed" if result.summary["audit_passed"] else "FAILED",
                      ", ".join(result.summary["serve_check"]), ", ".join(left_out) or "-",
                      f"{time.perf_counter() - started:.1f}")
    console.print(published)
    console.print(f"run folder: {result.run}", soft_wrap=True)
    console.print(f"report: {result.report}", soft_wrap=True)
    console.print(result.status_line, soft_wrap=True, highlight=False)
    return RunStatus(result.status).exit_code


def _train_as_non_chief(args: argparse.Namespace, cluster) -> int:
    """`tfship run` on a worker that is not the chief: train (the stage every worker takes part in), then say that
    the chief exports and publishes, and exit 0.
    """
    _stage_command(args, "train")  # `tfship run --resume RUN` on a worker continues its training in RUN
    console.print(f"{cluster.me.name} is not the chief: it trained its share; the chief ({cluster.chief.name} at "
                  f"{cluster.chief.address}) exports, converts, validates and publishes", highlight=False,
                  soft_wrap=True)
    return 0


def _run_folder(args: argparse.Namespace, config) -> RunFolder:
    return RunFolder(args.run.resolve()) if args.run else latest_run(config.run.runs_dir)


def stage_config(args: argparse.Namespace, config, run: RunFolder):
    """The config a stage run alone in `run` uses: the run's own (`config.json`: its model name, repository
    and settings, so a bring-your-own run never publishes as `digits`) with this command line's `--set` and
    shortcut flags on top; `config` (the command line's) when `--config` is given or the run stored none.

    Raises:
        ConfigError: the stored config with the flags is invalid (naming the file, key and value).
    """
    if args.config is not None or not RunConfig.exists(run.root):
        return config
    return with_overrides(stored_config(run), overrides_from_args(args), str(run.root / CONFIG_FILE))


def _stage_command(args: argparse.Namespace, name: str) -> int:
    """Run one stage of the chain alone through the API (`pipeline.api.stages.run_stage`) and print its result."""
    config = config_from_args(args)
    if name == "train":
        run = None
        if getattr(args, "resume", None):
            run = resolve_run(args.resume, config.run.runs_dir)
            config = stored_config(run)
        with _progress() as progress:
            result = run_stage(config, "train", run, progress, resume_training=run is not None)
        _print_json_table(name, result.run, result.fields)
        return 0
    run = _run_folder(args, config)
    result = run_stage(stage_config(args, config, run), name, run)
    if name == "validate":
        console.print(summary_tables({"parity": result.fields}, [])[1])
        for note in summary_notes({"parity": result.fields}):
            console.print(note, highlight=False, markup=False)
        console.print(f"run folder: {result.run} (full figures in parity.json)", soft_wrap=True)
    else:
        _print_json_table(name, result.run, result.fields)
    return 0


def _print_json_table(name: str, run: Path, result) -> None:
    table = Table(title=f"tfship {name}")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    rows = result.items() if isinstance(result, dict) else enumerate(result)
    for key, value in rows:
        if isinstance(value, dict) and "error_histogram" in json.dumps(value, default=str):
            continue  # plots' raw data: in the run folder's JSON files, not for the terminal
        text = json.dumps(value, default=str) if not isinstance(value, str) else value
        table.add_row(str(key), text if len(text) < 400 else text[:400] + "…")
    table.add_row("run folder", str(run))
    console.print(table)


def cmd_train(args: argparse.Namespace) -> int:
    """`tfship train`: train into a new run folder; `--workers N`: N local multi-worker processes."""
    if getattr(args, "workers", None) is not None:
        return _train_workers(args)
    from tfship.pipeline.cli.arguments import config_from_args

    if config_from_args(args).train.strategy != "multi_worker":
        return _stage_command(args, "train")
    return _ending_cleanly(lambda: _stage_command(args, "train"), "tfship train")


def _ending_cleanly(command, prog: str) -> int:
    """Run a multi-worker command; on a tfship error print its one line and end the process at once.

    After a lost peer, a timeout or a signal, TensorFlow may still hold a thread blocked in a collective and
    waits for its peers at exit; `os._exit` ends the process with the error's exit status instead (the stage
    record and the checkpoint, where there is one, are already written).
    """
    import os
    import sys

    from tfship.core.errors import TfshipError, cli_error
    from tfship.core.scratch import remove_own_scratch

    try:
        return command()
    except TfshipError as err:
        line, code = cli_error(prog, err)
        Console(stderr=True).print(line, style="bold red", highlight=False, markup=False, soft_wrap=True)
        remove_own_scratch()  # os._exit runs no atexit hook
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _train_workers(args: argparse.Namespace) -> int:
    """`tfship train --workers N` (pipeline.training.workers): exit code = the worst worker's."""
    if args.resume:
        raise ConfigError("tfship train: --workers and --resume do not go together")
    config = config_from_args(args)  # refuse a bad config before starting any process
    forwarded = [*(["--config", str(args.config)] if args.config else []),
                 *(part for text in args.overrides for part in ("--set", text)),
                 *(["--epochs", str(args.epochs)] if args.epochs is not None else []),
                 *(["--repository", str(args.repository)] if args.repository is not None else [])]
    console.print(f"training with {args.workers} local workers (train.strategy = multi_worker, TF_CONFIG on "
                  "loopback); worker 0 is the chief", highlight=False)
    results = launch_workers(args.workers, forwarded, config.run.runs_dir)
    console.print("workers' exit codes: " + ", ".join(f"{r.index}: {r.exit_code}" for r in results),
                  highlight=False)
    return worst_exit_code(results)


def cmd_export(args: argparse.Namespace) -> int:
    """`tfship export`: export and audit the run's model."""
    return _stage_command(args, "export")


def cmd_convert(args: argparse.Namespace) -> int:
    """`tfship convert`: ONNX and TFLite variants of the run's SavedModel."""
    return _stage_command(args, "convert")


def cmd_validate(args: argparse.Namespace) -> int:
    """`tfship validate`: the parity gate (non-zero exit on a miss)."""
    return _stage_command(args, "validate")


def cmd_publish(args: argparse.Namespace) -> int:
    """`tfship publish`: serve-check, then publish into the repository."""
    return _stage_command(args, "publish")


def cmd_inspect(args: argparse.Namespace) -> int:
    """`tfship inspect PATH`: signatures of a SavedModel, .tflite or .onnx."""
    inspection = inspect(args.path)
    if args.json:
        console.print_json(json.dumps(inspection.info, default=str))
    else:
        console.print(inspection)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    """`tfship promote MODEL VERSION --label canary|stable --repository R`: move a label by evidence."""
    import numpy as np

    from tfship.pipeline.orchestration.promote import promote

    held_out = shadow = None
    if args.evidence == "shadow":
        from tfship.pipeline.orchestration.shadow_evidence import ShadowEvidence
        from tfship.serving.shadow_cli import load_report

        source = args.shadow_report
        shadow = ShadowEvidence(load_report(args.model, source), source, args.min_pairs, args.min_top1_agreement,
                                args.min_value_agreement)
    elif args.data is not None:
        with np.load(args.data, allow_pickle=False) as data:
            if "y" not in data.files or len(data.files) < 2:
                raise ConfigError(f"--data {args.data}: needs 'y' and 'x' (or one array per input name), has "
                                  f"{sorted(data.files)}")
            named = {name: data[name] for name in data.files if name != "y"}
            held_out = (named["x"] if list(named) == ["x"] else named, data["y"])
    elif args.label == "stable":
        from tfship.pipeline.data.splits import held_out_digits

        held_out = held_out_digits(1_000_000, args.config)
    record = promote(args.repository, args.model, args.version, args.label, held_out=held_out,
                     max_metric_drop=args.max_metric_drop, force=args.force, shadow=shadow, task=args.task)
    evidence = record["evidence"]
    console.print(f"{args.model} v{args.version} is now {args.label!r} in {args.repository}"
                  + (f" (was v{record['previous']})" if record["previous"] is not None else "")
                  + (" [bold red]FORCED[/]" if record["forced"] else ""))
    if evidence:
        console.print(f"evidence: {evidence['summary']}")
    return 0


def cmd_make_recommender_data(args: argparse.Namespace) -> int:
    """`tfship make-recommender-data --out DIR`: synthetic recommender shards with a planted signal
    (`pipeline.data.recommender_data`); prints the manifest's planted AUC and the data.feature_spec to use.
    """
    from tfship.pipeline.data.recommender_data import (
        RecommenderDataSpec,
        recommender_feature_spec,
        write_recommender_data,
    )

    spec = RecommenderDataSpec(records=args.records, shards=args.shards, users=args.users, items=args.items,
                               history_length=args.history_length, clusters=args.clusters, seed=args.seed)
    manifest = write_recommender_data(args.out, spec, say=lambda line: console.print(line, highlight=False))
    console.print(f"{spec.records:,} records in {spec.shards} shards under {args.out}; planted AUC on the held-out "
                  f"shard {manifest['planted_auc']} (positives {manifest['positive_share']:.1%}); feature spec: "
                  f"{json.dumps(recommender_feature_spec(spec))}", highlight=False)
    return 0
