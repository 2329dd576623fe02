"""Where an ONNX file's tensors live, judged before ONNX Runtime opens anything (no `onnx` package needed).

An ONNX tensor may keep its values in another file (`data_location: EXTERNAL`, its `external_data` entry
`location`), which ONNX Runtime opens relative to the model file. A `location` that is absolute, climbs out with
`..`, or passes through a link makes the model read any file of the host into a weight (and the answers then
carry it). `external_data_problems` walks the file's protobuf wire format (every graph, subgraph, function and
training graph; every initializer, sparse initializer and tensor attribute) and names each such tensor; the
`onnx` backend refuses the version on any. The file is memory-mapped, so large weights are not copied.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

# Field numbers of onnx.proto (onnx 1.23) that hold messages the walk descends into: message -> {field: message}.
_MESSAGES: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "function": {7: "node", 11: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
_TENSOR_NAME, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 8, 13, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_MAX_DEPTH = 64


class WireError(ValueError):
    """The bytes are not a protobuf message."""


def _varint(data, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of one message: an int for varints, a memoryview for the rest."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = data[at:at + size], at + size
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise WireError("truncated field")
            value, at = data[at:at + size], at + size
        else:
            raise WireError(f"wire type {wire}")
        yield field, wire, value


def _external_tensors(data, kind: str = "model", depth: int = 0) -> Iterator[tuple[str, str]]:
    """(tensor name, location) of every tensor whose values are in another file."""
    if depth > _MAX_DEPTH:
        raise WireError("nested too deep")
    if kind == "tensor":
        name, location, external = "", None, False
        for field, wire, value in _fields(data):
            if field == _TENSOR_NAME and wire == 2:
                name = bytes(value).decode(errors="replace")
            elif field == _TENSOR_LOCATION and wire == 0:
                external = value == _EXTERNAL
            elif field == _TENSOR_EXTERNAL and wire == 2:
                entry = {f: bytes(v).decode(errors="replace") for f, w, v in _fields(value) if w == 2}
                if entry.get(1) == "location":
                    location = entry.get(2, "")
        if external or location is not None:
            yield name, location or ""
        return
    children = _MESSAGES[kind]
    for field, wire, value in _fields(data):
        if wire == 2 and field in children:
            yield from _external_tensors(value, children[field], depth + 1)


def _location_problem(model_file: Path, location: str) -> str | None:
    folder = model_file.parent
    pure = PurePosixPath(location)
    if not location or pure.is_absolute() or PureWindowsPath(location).is_absolute() or location.startswith("\\"):
        return "an absolute or empty path"
    if ".." in pure.parts or "\\" in location:
        return "a path leaving the version folder"
    step = folder
    for part in pure.parts:  # no component may be a link, even one pointing back inside
        step = step / part
        if step.is_symlink():
            return "a link"
    if not step.exists():
        return None  # ONNX Runtime refuses a missing file itself, naming it
    if not step.resolve().is_relative_to(folder.resolve()):
        return "a path leaving the version folder"
    return None if step.is_file() else "not a regular file"


def external_data_problems(model_file: Path) -> list[str]:
    """One line per tensor of `model_file` whose external data is outside its folder (module docstring).

    Raises:
        OSError: the file cannot be read.
        WireError: it is not a protobuf message (ONNX Runtime would refuse it too).
    """
    model_file = Path(model_file)
    if model_file.stat().st_size == 0:
        return []
    with open(model_file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            found = list(_external_tensors(view))
        finally:
            view.release()
    problems = []
    for name, location in found:
        why = _location_problem(model_file, location)
        if why is not None:
            problems.append(f"tensor {name[:100]!r} keeps its values in {location[:200]!r}, {why}: an ONNX file's "
                            "external data must be a file inside its version folder")
    return problems
