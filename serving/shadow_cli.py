"""`tfship shadow-report MODEL`: fetch a shadow report (a server's JSON endpoint, or a folder of report parts)
and print it as tables (rich), or as JSON with `--json`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tfship.core.errors import ConfigError

DEFAULT_SERVER = "http://127.0.0.1:8501"


def load_report(model: str, source: str, token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The shadow report of `model` from `source`: a server's REST address (`http://host:port`, the report is
    `GET /v1/shadow/<model>`), a full report URL, or a folder of report parts (`--shadow-report-dir`).

    Raises:
        ConfigError: the server cannot be reached or answers an error, or the folder holds no part of `model`
            (names the source and what it said).
    """
    if source.startswith(("http://", "https://")):
        url = source if "/v1/shadow/" in source else f"{source.rstrip('/')}/v1/shadow/{model}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as err:
            raise ConfigError(f"shadow report {url}: HTTP {err.code}: {err.read()[:500].decode(errors='replace')}"
                              ) from err
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ConfigError(f"shadow report {url}: cannot read it: {err}") from err
    from tfship.serving.dataplane.shadow import read_reports

    folder = Path(source)
    if not folder.is_dir():
        raise ConfigError(f"shadow report source {source!r}: neither an http(s) address nor a folder")
    return read_reports(folder, model)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _number(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.3g}{unit}"


def render(report: dict[str, Any], console: Console | None = None) -> None:
    """Print `report` (`ShadowReport.to_json` or a merge) as three tables: summary, outputs, worst pairs."""
    console = console or Console()
    figures = report["figures"]
    summary = Table(title=f"shadow of {report['model']} -> {report['shadow']}")
    for column in ("pairs", "top-1 agreement", "value agreement", "primary p50/p99", "shadow p50/p99",
                   "shadow errors", "dropped"):
        summary.add_column(column)
    latency = figures["latency_s"]
    summary.add_row(str(figures["pairs"]), _rate(figures["top1_agreement"]), _rate(figures["value_agreement"]),
                    f"{_number(latency['primary']['p50'], 's')} / {_number(latency['primary']['p99'], 's')}",
                    f"{_number(latency['shadow']['p50'], 's')} / {_number(latency['shadow']['p99'], 's')}",
                    ", ".join(f"{k} {v}" for k, v in sorted(report["errors"].items())) or "0",
                    ", ".join(f"{k} {v}" for k, v in sorted(report["dropped"].items())) or "0")
    console.print(summary)
    outputs = Table(title="per output")
    for column in ("output", "max error", "p99 error", "value agreement", "top-1 agreement"):
        outputs.add_column(column)
    for name, entry in figures["outputs"].items():
        outputs.add_row(name, _number(entry["max_error"]), _number(entry["p99_error"]),
                        _rate(entry["value_agreement"]), _rate(entry["top1_agreement"]))
    console.print(outputs)
    if report["worst"]:
        worst = Table(title="worst disagreements")
        for column in ("output", "max error", "x bound", "versions", "rows", "detail"):
            worst.add_column(column)
        for entry in report["worst"]:
            worst.add_row(entry["output"], _number(entry["max_error"]), _number(entry["excess"]),
                          f"v{entry['primary_version']} / v{entry['shadow_version']}", str(entry["rows"]),
                          entry["detail"])
        console.print(worst)


def run_shadow_report(args) -> int:
    """`tfship shadow-report MODEL [--source S] [--json]`; exit 0."""
    import os

    token = os.environ.get(args.token_env) if args.token_env else None
    report = load_report(args.model, args.source, token)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 0


def register(subparsers) -> None:
    """Add `shadow-report` to an argparse subparsers object."""
    parser = subparsers.add_parser("shadow-report", help="print a model's live shadow parity report")
    parser.add_argument("model", help="the served model that has a shadow (--shadow MODEL=TARGET)")
    parser.add_argument("--source", default=DEFAULT_SERVER, help="server REST address, report URL, or the "
                        f"--shadow-report-dir folder (default {DEFAULT_SERVER})")
    parser.add_argument("--token-env", help="env var holding a bearer token for the REST port")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run_shadow_report)
