"""Left-out reasons a user can act on: one line naming the cause, the full text in the run folder.

A converter's or a runtime's message is often a traceback, a temporary file name (`.model.b2eee721.onnx`)
or a thousand characters of converter notes. `first_line` keeps what names the cause: the exception line
of a traceback, the converter's `error:` and the ops and graph nodes it names, the stage prefix
(`refused: `, `onnx: tf2onnx exited 1: `), with temporary names turned back into the artifact's own and
without the `reproduce:` command (it is in the full text). `write_reason_files` puts each full reason in
`<run>/reasons/<artifact>.txt`.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import re
from pathlib import Path

# A reason's first line is at most this long (characters), the pointer to the full text included.
FIRST_LINE_LIMIT = 300
REASONS_DIR = "reasons"

# .model.b2eee721.onnx -> model.onnx, .model.score.b2eee721.onnx -> model.score.onnx (a folder before it goes too)
_TEMPORARY = re.compile(r"(?:[\w.+-]*/)*\.([\w-]+(?:\.[\w-]+)*?)\.[0-9a-f]{6,}\b(\.\w+)?")
_LONG_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/){2,}([\w.+-]+)")  # /tmp/run/artifacts/x.onnx -> x.onnx
_REPRODUCE = re.compile(r";?\s*reproduce:.*$", re.DOTALL)
_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit))\s*:\s*(.+)$")
_TRACEBACK = re.compile(r"^\s*(Traceback \(most recent call last\)|File \".*\", line \d+|\^+|~+|During handling)")
_CONVERTER_ERROR = re.compile(r"error:\s*(.+?)(?=\s*(?:<unknown>|loc\(|\S+:\d+:\d+:\s*(?:error|note)|$))")
_NOT_SUPPORTED = re.compile(r"'(tf\.\w+)' op is neither a custom op nor a flex op")
_RECURRENT = re.compile(r"recurrent layer\(s\) (\[[^\]]*\]) have a dynamic time dimension")
_UNROLLED_TRIED = "recipe 'unrolled' (recurrent layers with unroll=True): "  # tflite.formats' recipe record
_FUSED_NOTE = "; TFLite's fused"  # the fused-LSTM note after the recipes (tflite.formats.FUSED_LSTM_NOTE)
_NODE = re.compile(r'"([\w.-]+(?:/[\w.-]+)+)(?:@[^"]*)?"')  # a graph node path inside a converter's loc(...)
_NOISE_START = re.compile(r"\s*(?:<unknown>|loc\(|error:|File \"|Traceback \(|\.\.\.|\n|;\s*output tail:)")
# A child's output tail is one whitespace-collapsed line (core.processes): its exceptions are found inline.
_INLINE_EXCEPTION = re.compile(r"(?:^|\s)(?:\w+\.)*([A-Z]\w*(?:Error|Exception))\s*:\s+(.+?)"
                               r"(?=\s+File \"|\s+Traceback \(|\s+During handling|\s+The above exception|$)")
_NESTED_CALLS = re.compile(r"\b(?:StatefulPartitionedCall/|PartitionedCall/)+")  # graph node paths' call prefixes


def _clean(text: str) -> str:
    text = _NESTED_CALLS.sub("", _TEMPORARY.sub(lambda m: m.group(1) + (m.group(2) or ""), text))
    return _LONG_PATH.sub(lambda m: m.group(1), text)


def _exception_line(lines: list[str]) -> str | None:
    """The last `SomeError: message` line of a traceback (the cause), or None; in a one-line output tail
    (a child's, whitespace collapsed), the last `SomeError: message` before the next `File "..."` frame.
    """
    for line in reversed(lines):
        match = _EXCEPTION.match(line)
        if match and not _TRACEBACK.match(line):
            return f"{match.group(1)}: {match.group(2).strip()}"
    tail = lines[-1].split("output tail:", 1)[1] if lines and "output tail:" in lines[-1] else ""
    found = list(_INLINE_EXCEPTION.finditer(tail))
    return f"{found[-1].group(1)}: {found[-1].group(2).strip()}" if found else None


def _converter_cause(text: str) -> str | None:
    """The blocker the conversion itself reports, then tfship's diagnosis only where it holds: ops the converter
    cannot express (from any recipe tried: an unrolled copy's string ops are the blocker, not its loop), the
    unrolled copy's own error, and only then the TensorList loop, whose "fix that axis's length" is said only
    when the export found a recurrent layer with a dynamic time dimension.
    """
    unsupported = [m for m in _NOT_SUPPORTED.finditer(text) if "TensorList" not in m.group(1)]
    if unsupported:
        nodes = list(_NODE.finditer(text, 0, unsupported[0].start()))
        where = f" at node '{nodes[-1].group(1)}'" if nodes else ""
        ops = ", ".join(dict.fromkeys(m.group(1) for m in unsupported))
        return f"ops {ops} are neither TFLite builtins nor Flex ops{where}"
    if "Lowering tensor list ops is failed" in text:
        if _UNROLLED_TRIED in text:
            tried = text.split(_UNROLLED_TRIED, 1)[1].split(_FUSED_NOTE, 1)[0]
            later = _converter_cause(tried) or re.split(r"\.\s", tried, maxsplit=1)[0].strip()  # its first sentence
            if later:
                return f"with the recurrent layers unrolled, the converter still fails: {later}"
        layers = _RECURRENT.search(text)
        if layers:
            return (f"recurrent layer(s) {layers.group(1)} over a variable-length axis: its TensorList ops are no "
                    "TFLite builtin and the bundled LiteRT runs no Flex ops; fix that axis's length to unroll it")
        return ("a loop (recurrent layer or tf.while_loop): its TensorList ops are no TFLite builtin and the "
                "bundled LiteRT runs no Flex ops")
    node = _NODE.search(text)
    where = f" at node '{node.group(1)}'" if node else ""
    error = _CONVERTER_ERROR.search(text)
    return f"{error.group(1).strip().rstrip(':')}{where}" if error else None


def first_line(reason: str, limit: int | None = FIRST_LINE_LIMIT) -> str:
    """One line (at most `limit` characters) that names the cause of `reason` (module docstring).

    Args:
        reason: a stage's full reason, possibly many lines of converter or traceback text.
        limit: the longest line kept, "…" marking a cut; None: never cut (the terminal wraps it instead).

    Returns:
        The stage prefix (text before the first line break or traceback) and the cause, with temporary
        file names and long paths shortened, whitespace collapsed; "" for "".
    """
    if not reason:
        return ""
    text = _clean(_REPRODUCE.sub("", reason))
    lines = [line for line in text.splitlines() if line.strip()]
    cause = _exception_line(lines) if len(lines) > 1 or "output tail:" in text else None
    converter = _converter_cause(text)
    if converter:
        cause = converter
    head = " ".join(lines[0].split()) if lines else ""
    if cause:
        head = _NOISE_START.split(head, maxsplit=1)[0].rstrip(" :;")
        head = f"{head}: {cause}" if head and cause not in head else (head or cause)
    line = " ".join(head.split())
    if limit is not None and len(line) > limit:
        line = line[:limit - 1].rstrip() + "…"
    return line


def reason_file_name(artifact: str) -> str:
    """`reasons/<artifact>.txt`, relative to the run folder (the artifact's name made file-safe)."""
    return f"{REASONS_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', artifact)}.txt"


def write_reason_files(run_root: Path, reasons: dict[str, str]) -> dict[str, str]:
    """Write each {artifact: full reason} to `<run_root>/reasons/<artifact>.txt`; return {artifact: file}
    (relative to `run_root`) for every non-empty reason.
    """
    written = {}
    for artifact, reason in reasons.items():
        if not reason:
            continue
        name = reason_file_name(artifact)
        path = Path(run_root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reason.rstrip() + "\n", encoding="utf-8")
        written[artifact] = name
    return written


def table_cell(text: str) -> str:
    """`text` safe inside a Markdown table cell: one line, pipes escaped, `-` for empty."""
    line = " ".join(str(text).split())
    return line.replace("|", "\\|") if line else "-"
