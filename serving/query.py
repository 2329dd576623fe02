"""`query`: send labelled rows to a server and print predicted vs true labels and the task's metric
(TensorFlow-free).

Rows are named inputs {input name: [N, ...]} (one `image` for the digits model; any number for a
multi-input model), sent in one Predict request. The metric is the task's (`core.tasks`): accuracy for
class ids, AUC for a binary model's one-column score, MAE (and RMSE) for a regression; `task = "auto"`
picks it from the labels and outputs.

The samples come from the caller: `tfship query` passes the pipeline's own held-out test split
(`pipeline.data.splits.held_out_digits`, so the accuracy printed matches what the pipeline validated);
`python -m tfship.serving query --samples FILE.npz` reads arrays `image` and `label` from a file, or a
published version's golden set (`assets.extra/tfship_golden.npz`: `input:image`, and `output:class_id` as
the label, so the "accuracy" printed is then the agreement with the SavedModel's own answers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tfship.core.errors import ConfigError
from tfship.core.tasks import TASKS, primary, task_metrics
from tfship.serving.tfs.client import PredictClient

LABEL_KEYS = ("y", "label", "labels")


def samples_from_file(path: Path, count: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The first `count` rows of named inputs {name: [N, ...]} and labels [N, ...] from the `.npz` file `path`.

    Reads `image` and `label` (the digits layout), one array per input name plus `y` / `label` (what
    `tfship.ship(model, (x, y))` writes), or a published golden set (`input:<name>` arrays, with
    `output:class_id` as the label: agreement with the SavedModel's own answers).

    Raises:
        ConfigError: the file is unreadable or holds no inputs and labels (names the file and what it holds).
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            held = sorted(data.keys())
            if "output:class_id" in held:
                inputs = {k.split(":", 1)[1]: data[k][:count] for k in held if k.startswith("input:")}
                return inputs, np.asarray(data["output:class_id"][:count]).astype(np.int64)
            label = next((k for k in LABEL_KEYS if k in held), None)
            inputs = {k: data[k][:count] for k in held if k != label and ":" not in k}
            if label is not None and inputs:
                labels = np.asarray(data[label][:count])
                return inputs, labels.astype(np.int64) if labels.dtype.kind in "iub" else labels
    except (OSError, ValueError) as err:
        raise ConfigError(f"--samples {path}: cannot read it as an .npz ({err})") from err
    raise ConfigError(f"--samples {path}: need input arrays and labels ('image' and 'label', one array per input "
                      f"name and 'y', or a golden set's 'input:<name>' and 'output:class_id'); the file holds {held}")


def infer_task(outputs: dict[str, np.ndarray], labels: np.ndarray) -> str:
    """Classification for integer labels with an [N, C >= 2] score or integer output; binary for 0/1 labels
    with a one-column score; regression for float labels.
    """
    rows = len(labels)
    if labels.dtype.kind == "f":
        return "regression"
    one_column = [v for v in outputs.values() if v.dtype.kind == "f" and v.shape in ((rows,), (rows, 1))]
    if one_column and np.isin(labels, (0, 1)).all() and not any(v.ndim == 2 and v.shape[1] > 1
                                                                  for v in outputs.values()):
        return "binary"
    return "classification"


def _scored_output(task: str, outputs: dict[str, np.ndarray], labels: np.ndarray) -> np.ndarray:
    """The output the task metric scores: class scores [N, C] (or class ids [N] one-hot), a one-column score,
    or the float prediction.
    """
    rows = len(labels)
    if task == "classification":
        for name in ("probabilities", "logits", *outputs):
            value = outputs.get(name)
            if value is not None and value.dtype.kind == "f" and value.ndim == 2 and value.shape[1] > 1:
                return value
        if "class_id" in outputs:  # only an index output: scored as one-hot rows wide enough for the labels
            ids = outputs["class_id"].astype(np.int64).reshape(rows)
            return np.eye(int(max(ids.max(), labels.max())) + 1)[ids]
    for value in outputs.values():
        if value.dtype.kind == "f" and value.shape in ((rows,), (rows, 1)):
            return value
    raise ConfigError(f"query: no output fits task {task!r}: outputs {{name: shape}} = "
                      f"{ {k: v.shape for k, v in outputs.items()} }")


def query_rows(target: str, model_name: str, inputs: dict[str, np.ndarray], labels: np.ndarray, *,
               task: str = "auto", signature_name: str = "serving_default", version: int | None = None,
               timeout_s: float = 30.0, console: Console | None = None) -> dict[str, float]:
    """Predict `inputs` (named, [N, ...] each) in one request; print a table of the first rows and the task's
    metrics against `labels`; return the metrics (`core.tasks.task_metrics`, plus "rows").

    Raises:
        serving.tfs.client.RemoteError: the server refused the request.
        ConfigError: an unknown task, or no output fits it.
    """
    if task != "auto" and task not in TASKS:
        raise ConfigError(f"query: --task {task!r}; expected auto or one of {list(TASKS)}")
    with PredictClient(target, timeout_s=timeout_s) as client:
        outputs = client.predict(model_name, inputs, signature_name=signature_name, version=version)
    labels = np.asarray(labels)
    task = infer_task(outputs, labels) if task == "auto" else task
    scored = _scored_output(task, outputs, labels)
    try:
        metrics = task_metrics(task, scored, labels)
    except ValueError as err:
        raise ConfigError(f"query: task {task!r}: {err}") from None
    predicted = scored.argmax(axis=1) if task == "classification" else scored.reshape(len(labels))
    console = console or Console()
    table = Table(title=f"{model_name} @ {target}: {len(labels)} held-out rows ({task}; inputs {sorted(inputs)})")
    for column in ("#", "true", "predicted"):
        table.add_column(column, justify="right")
    for i, (true, pred) in enumerate(zip(labels[:20], predicted[:20])):
        table.add_row(str(i), f"{true:.4g}" if task == "regression" else str(int(true)),
                      str(int(pred)) if task == "classification" else f"{float(pred):.4g}")
    console.print(table)
    name = primary(task).name
    others = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != name)
    console.print(f"{name}: {metrics[name]:.4f} on {len(labels)} rows ({others})")
    return {**metrics, "rows": float(len(labels))}


def query_digits(target: str, model_name: str, images: np.ndarray, labels: np.ndarray,
                 signature_name: str = "serving_default", version: int | None = None, timeout_s: float = 30.0,
                 console: Console | None = None) -> int:
    """`query_rows` for the digits model's single `image` input [N, 8, 8, 1] and class-id labels; returns 0."""
    query_rows(target, model_name, {"image": images}, labels, task="classification", signature_name=signature_name,
               version=version, timeout_s=timeout_s, console=console)
    return 0
