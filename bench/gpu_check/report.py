"""The records of `make gpu-check` and their two forms: JSON for machines, a Markdown table for people.

A check is a row of parts (`PartResult`); each part ran, was skipped (with the reason: no GPU, no Docker GPU
runtime, too few cores) or failed (with the error's first line). Figures are plain numbers with their units in
the key (`steps_per_s`, `inferences_per_s`, `gpu_memory_mib`); every figure comes from this run, none is
assumed.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = "tfship.gpu-check/1"


class PartStatus(enum.StrEnum):
    """What became of one part."""

    RAN = "ran"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class PartResult:
    """One part of the check.

    Attributes:
        name: part name (`environment`, `training`, `serving`, `multi_model`, `cloud_image`, `scaling`).
        status: ran / skipped / failed.
        reason: why it was skipped or failed ('' when it ran).
        seconds: wall time the part took.
        rows: measured rows, one dict each (the part's table), units in the keys.
        facts: single facts (device names, providers read back from the sessions, versions).
    """

    name: str
    status: PartStatus
    reason: str = ""
    seconds: float = 0.0
    rows: list[dict] = field(default_factory=list)
    facts: dict = field(default_factory=dict)


def document(parts: list[PartResult], machine: dict, started: float) -> dict:
    """The JSON document of one check: schema, when, the machine, and every part."""
    return {"schema": SCHEMA, "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": round(time.time() - started, 1), "machine": machine,
            "parts": [{**asdict(p), "status": str(p.status)} for p in parts]}


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value).replace("|", "/").replace("\n", " ")


def markdown(doc: dict) -> str:
    """The document as Markdown: the machine, the summary table (one line per part), then each part's rows."""
    machine = doc["machine"]
    lines = ["# gpu-check", "", f"Finished {doc['finished_utc']} in {doc['wall_s']} s.", "",
             "| machine | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in machine.items()]
    lines += ["", "## Summary", "", "| part | status | seconds | reason |", "|---|---|---:|---|"]
    for part in doc["parts"]:
        lines.append(f"| {part['name']} | {part['status']} | {part['seconds']:.1f} | {_cell(part['reason'])} |")
    for part in doc["parts"]:
        if not part["rows"] and not part["facts"]:
            continue
        lines += ["", f"## {part['name']}", ""]
        lines += [f"- {key}: {_cell(value)}" for key, value in part["facts"].items()]
        if part["rows"]:
            keys = list(dict.fromkeys(k for row in part["rows"] for k in row))
            lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(_cell(row.get(k, "")) for k in keys) + " |" for row in part["rows"]]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> list[Path]:
    """Write gpu-check-latest.json and .md under `out`; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "gpu-check-latest.json", out / "gpu-check-latest.md"]
    paths[0].write_text(json.dumps(doc, indent=2) + "\n")
    paths[1].write_text(markdown(doc))
    return paths
