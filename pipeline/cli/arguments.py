"""The pipeline commands' shared arguments and the config they resolve to.

Used by the parser (`pipeline.cli.app`) and the handlers (`pipeline.cli.commands`), so neither imports the other's
module back.
"""

from __future__ import annotations

import argparse

from tfship.core.locations import cli_location, cli_path
from tfship.pipeline.api.ship import configure, model_name_from
from tfship.pipeline.config import parse_override


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config`, `--set` and the shortcuts `--epochs`, `--repository`, `--runs-dir`, `--model-name`."""
    parser.add_argument("--config", type=cli_path, help="pipeline TOML (default: the bundled configs/digits.toml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config field, e.g. --set train.epochs=3 (repeatable)")
    parser.add_argument("--epochs", type=int, help="shortcut for --set train.epochs=N")
    parser.add_argument("--repository", type=cli_location, help="model repository (overrides publish.repository)")
    parser.add_argument("--runs-dir", type=cli_path, help="runs folder (overrides run.runs_dir)")
    parser.add_argument("--model-name", help="name in the repository, <repository>/<name>/<version> (overrides "
                        "run.model_name; export-only runs on the default config take it from --model)")


def add_run_folder_argument(parser: argparse.ArgumentParser) -> None:
    """Add `--run` (a run folder; default: the latest under run.runs_dir)."""
    parser.add_argument("--run", type=cli_path, help="run folder (default: the latest under run.runs_dir)")


def config_from_args(args: argparse.Namespace):
    """The validated config from `--config`, `--set` and the shortcut flags (raises ConfigError)."""
    return configure(args.config, overrides_from_args(args))


def overrides_from_args(args: argparse.Namespace) -> dict:
    """{dotted key: value} that `--set` and the shortcut flags (`--epochs`, `--repository`, `--runs-dir`,
    `--model-name`) ask for (raises ConfigError on a malformed `--set`).
    """
    overrides = dict(parse_override(text) for text in args.overrides)
    if args.epochs is not None:
        overrides["train.epochs"] = args.epochs
    if args.repository is not None:
        overrides["publish.repository"] = str(args.repository)
    if args.runs_dir is not None:
        overrides["run.runs_dir"] = str(args.runs_dir)
    if getattr(args, "model_name", None) is not None:
        overrides["run.model_name"] = args.model_name
    elif getattr(args, "model", None) and args.config is None and "run.model_name" not in overrides:
        overrides["run.model_name"] = model_name_from(args.model)  # never publish a user's model as "digits"
    return overrides
