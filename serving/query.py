"""`query`: send held-out digits to a server and print predicted vs true labels (TensorFlow-free).

The samples are the pipeline's own held-out test split (`pipeline.data.splits.load_split_arrays` with the
config's data section and seed), so the accuracy printed matches what the pipeline validated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from serving.client import PredictClient


def held_out_digits(count: int, config: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` held-out test digits: images float32 [count, 8, 8, 1] in [0, 1], labels int64 [count]."""
    from pipeline.config import load_config
    from pipeline.data.splits import load_split_arrays

    cfg = load_config(config)
    test = load_split_arrays(cfg.data, cfg.run.seed).test
    return test.images[:count], test.labels[:count]


def query_digits(target: str, model_name: str, count: int = 20, signature_name: str = "serving_default",
                 version: int | None = None, config: Path | None = None, timeout_s: float = 30.0,
                 console: Console | None = None) -> int:
    """Predict `count` held-out digits in one request; print a table and the accuracy. Returns 0.

    Uses output `class_id` when the signature has it, else the argmax of `probabilities`/`logits`.
    Raises `serving.client.RemoteError` if the server refuses the request.
    """
    images, labels = held_out_digits(count, config)
    with PredictClient(target, timeout_s=timeout_s) as client:
        outputs = client.predict(model_name, {"image": images}, signature_name=signature_name, version=version)
    if "class_id" in outputs:
        predicted = outputs["class_id"].astype(np.int64)
    else:
        scores = outputs.get("probabilities", outputs.get("logits"))
        predicted = np.argmax(scores, axis=-1)
    console = console or Console()
    table = Table(title=f"{model_name} @ {target}: {len(labels)} held-out digits")
    for column in ("#", "true", "predicted", "ok"):
        table.add_column(column, justify="right")
    for i, (true, pred) in enumerate(zip(labels, predicted)):
        table.add_row(str(i), str(int(true)), str(int(pred)), "yes" if true == pred else "NO")
    console.print(table)
    accuracy = float(np.mean(predicted == labels)) if len(labels) else 0.0
    console.print(f"accuracy: {accuracy:.2%} ({int(np.sum(predicted == labels))}/{len(labels)})")
    return 0
