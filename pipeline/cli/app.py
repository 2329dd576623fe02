"""The `tfship` command: `run`, the stages alone (`train`, `export`, `convert`, `validate`,
`publish`), `serve`, `query`, `inspect` and `deploy`.

Process-wide TensorFlow settings (log level) are set here, in the entry point, before any stage
imports TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import rich.markup
from rich.console import Console

import tfship.deploy.cli as deploy
from tfship.core.errors import TfshipError, cli_error
from tfship.core.locations import cli_location, cli_path
from tfship.core.scratch import remove_orphaned_scratch
from tfship.pipeline.cli import commands
from tfship.pipeline.cli.arguments import add_config_arguments, add_run_folder_argument
from tfship.pipeline.orchestration.held_out import held_out_rows
from tfship.serving import cli as serving_cli
from tfship.serving import shadow_cli
from tfship.serving.shadow_cli import DEFAULT_SERVER


def _held_out_rows(count: int, config: Path | None, run: Path | None = None, model_name: str | None = None):
    """`tfship query`'s rows (data read only when the command runs): {input name: [count, ...]} and labels, the
    served model's own (`pipeline.orchestration.held_out`).
    """
    return held_out_rows(count, config, run, model_name)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="tfship", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_command(sub)
    _add_stage_commands(sub)
    _add_inspect_command(sub)
    _add_promote_command(sub)
    shadow_cli.register(sub)
    _add_recommender_data_command(sub)
    serving_cli.register(sub, held_out=_held_out_rows)
    deploy.register(sub)
    _no_abbreviations(parser)
    return parser


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    """`tfship run`: the whole pipeline, or export-only from a given model (`--model`, `--data`)."""
    run = sub.add_parser("run", help="train, export, convert, validate, serve-check and publish")
    add_config_arguments(run)
    run.add_argument("--model", help="export-only: a .keras/.h5 file, a SavedModel folder or module:function "
                     "returning a keras.Model (training is skipped; needs --data)")
    run.add_argument("--data", type=cli_path, help="export-only: validation/calibration data (NPZ with x/y or one "
                     "array per input, CSV with a label column, or an image folder <root>/<class>/<file>)")
    run.add_argument("--tags", default="serve", metavar="TAG[,TAG]", help="export-only: the SavedModel MetaGraph "
                     "tag-set to export (default: serve), e.g. --tags serve,gpu")
    run.add_argument("--custom-objects", action="append", default=[], metavar="MODULE",
                     help="export-only: import MODULE before loading a .keras/.h5 file, so the custom layers it "
                          "registers (@keras.saving.register_keras_serializable) load (repeatable)")
    run.add_argument("--resume", metavar="RUN", help="resume RUN (run folder or run id): stages whose outputs are "
                     "complete and valid are skipped, training continues from its latest checkpoint")
    run.set_defaults(func=commands.cmd_run)


def _add_stage_commands(sub: argparse._SubParsersAction) -> None:
    """`tfship train|export|convert|validate|publish`: one stage alone (train into a new run folder, the others
    on a run folder's outputs).
    """
    for name, text in (("train", "train the model into a new run folder"),
                       ("export", "export + audit the run's SavedModel"),
                       ("convert", "convert the run's SavedModel to ONNX and TFLite"),
                       ("validate", "parity gate: every artifact against the SavedModel"),
                       ("publish", "serve-check the run's artifacts, then publish them")):
        stage = sub.add_parser(name, help=text)
        add_config_arguments(stage)
        if name != "train":
            add_run_folder_argument(stage)
        else:
            stage.add_argument("--resume", nargs="?", const="latest", metavar="RUN",
                               help="continue training from the latest checkpoint of RUN (a run folder or run id "
                                    "under run.runs_dir; default: the latest run), with the run's own config")
            stage.add_argument("--workers", type=int, metavar="N",
                               help="train with MultiWorkerMirroredStrategy in N local processes, each with its own "
                                    "TF_CONFIG on free loopback ports; worker 0's run folder holds the model")
        stage.set_defaults(func=getattr(commands, f"cmd_{name}"))


def _add_inspect_command(sub: argparse._SubParsersAction) -> None:
    """`tfship inspect PATH`: the signatures of a SavedModel, .tflite or .onnx."""
    inspect = sub.add_parser("inspect", help="print the signatures of a SavedModel, .tflite or .onnx")
    inspect.add_argument("path", type=cli_path)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of tables")
    inspect.set_defaults(func=commands.cmd_inspect)


def _add_promote_command(sub: argparse._SubParsersAction) -> None:
    """`tfship promote MODEL VERSION --label ...`: move a version label by offline or shadow evidence."""
    promote = sub.add_parser("promote", help="move a version label (canary, stable) in <repository>/models.config, "
                             "by evidence against the current stable")
    promote.add_argument("model", help="model name in the repository")
    promote.add_argument("version", type=int, help="the published version to label")
    promote.add_argument("--label", required=True, choices=["canary", "stable"])
    promote.add_argument("--repository", type=cli_location, required=True, help="a folder or s3://BUCKET/PREFIX")
    promote.add_argument("--data", type=cli_path, help="held-out NPZ with x and y for the task metric (default: "
                         "the held-out split of --config's data)")
    promote.add_argument("--config", type=cli_path, help="pipeline TOML whose held-out split is the task data")
    promote.add_argument("--max-metric-drop", type=float, default=0.01, help="how much lower (absolute accuracy) "
                         "the candidate may score than stable (TFX change_threshold); default 0.01")
    promote.add_argument("--task", choices=["classification", "binary", "regression"], default="classification",
                         help="the metric judged (core.tasks): accuracy, AUC or MAE; --max-metric-drop is in its unit")
    promote.add_argument("--force", action="store_true", help="move the label even when the evidence refuses "
                         "(recorded as forced)")
    promote.add_argument("--evidence", choices=["offline", "shadow"], default="offline", help="offline: golden set "
                         "and held-out metric (default); shadow: the live shadow report of a server shadowing VERSION")
    promote.add_argument("--shadow-report", default=DEFAULT_SERVER, help="with --evidence shadow: server REST "
                         f"address, report URL or --shadow-report-dir folder (default {DEFAULT_SERVER})")
    promote.add_argument("--min-pairs", type=int, default=100, help="shadow pairs required (default 100)")
    promote.add_argument("--min-top1-agreement", type=float, default=0.99, help="top-1 agreement floor, 0..1 "
                         "(default 0.99)")
    promote.add_argument("--min-value-agreement", type=float, default=0.0, help="share of pairs within the value "
                         "bound, 0..1 (default 0: a retrained candidate differs in value by design)")
    promote.set_defaults(func=commands.cmd_promote)


def _add_recommender_data_command(sub: argparse._SubParsersAction) -> None:
    """`tfship make-recommender-data --out FOLDER`: synthetic recommender tf.Examples in TFRecord shards."""
    synth = sub.add_parser("make-recommender-data", help="write synthetic recommender tf.Examples (user, item, "
                           "history, dense, 0/1 label with a planted signal) in TFRecord shards")
    synth.add_argument("--out", type=cli_path, required=True, help="folder for the shards and manifest.json")
    for flag, default, text in (("records", 100_000, "records in all"), ("shards", 8, "TFRecord files"),
                                ("users", 50_000, "user ids"), ("items", 50_000, "item ids"),
                                ("history-length", 20, "most recent item ids per record"),
                                ("clusters", 16, "taste groups of the planted signal"), ("seed", 0, "seed")):
        synth.add_argument(f"--{flag}", type=int, default=default, help=f"{text} (default {default:,})")
    synth.set_defaults(func=commands.cmd_make_recommender_data)


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Refuse abbreviated flags everywhere (`--run` must not silently mean `--runs-dir`)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _no_abbreviations(child)


# Top-level modules only the `pipeline` extra installs (pyproject.toml): a command that needs one of them in the
# TF-free install says which install it needs instead of a traceback.
PIPELINE_ONLY_MODULES = frozenset({"tensorflow", "keras", "tf2onnx", "onnxslim", "onnx", "tensorflow_serving",
                                   "sklearn", "scipy", "matplotlib"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tfship` console script; returns the exit code (`core.errors` table for tfship errors)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    remove_orphaned_scratch()  # temp folders of tfship processes killed with SIGKILL (core.scratch)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TfshipError as err:
        line, code = cli_error(f"tfship {args.command}", err)
        head = f"tfship {args.command}: {type(err).__name__}"  # the start of `line`, in red
        Console(stderr=True).print(f"[bold red]{rich.markup.escape(head)}[/bold red]"
                                   f"{rich.markup.escape(line[len(head):])}", highlight=False, markup=True,
                                   soft_wrap=True)
        return code
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in PIPELINE_ONLY_MODULES:
            raise
        print(f"tfship {args.command}: this environment has the TensorFlow-free server install, and "
              f"`tfship {args.command}` needs the pipeline's packages (missing: {err.name}); install them with "
              "pip install 'tfship[pipeline]' (or `make setup` in a checkout)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
