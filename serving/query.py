"""`query`: send labelled images to a server and print predicted vs true labels (TensorFlow-free).

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
from tfship.serving.tfs.client import PredictClient


def samples_from_file(path: Path, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` rows of images [N, ...] and int64 labels [N] from the `.npz` file `path`.

    Reads arrays `image` and `label`, or a golden set's `input:image` and `output:class_id` (the published
    SavedModel's answers, written by the pipeline's publish stage).

    Raises:
        ConfigError: the file is unreadable or holds neither pair (names the file and what it holds).
    """
    try:
        with np.load(path) as data:
            for image_key, label_key in (("image", "label"), ("input:image", "output:class_id")):
                if image_key in data and label_key in data:
                    return (np.asarray(data[image_key][:count]),
                            np.asarray(data[label_key][:count]).astype(np.int64))
            held = sorted(data.keys())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--samples {path}: cannot read it as an .npz ({err})") from err
    raise ConfigError(f"--samples {path}: need arrays 'image' and 'label' (or a golden set's 'input:image' and "
                      f"'output:class_id'); the file holds {held}")


def query_digits(target: str, model_name: str, images: np.ndarray, labels: np.ndarray,
                 signature_name: str = "serving_default", version: int | None = None, timeout_s: float = 30.0,
                 console: Console | None = None) -> int:
    """Predict `images` (input `image`, [N, ...]) in one request; print a table and the accuracy against `labels`.

    Uses output `class_id` when the signature has it, else the argmax of `probabilities`/`logits`.

    Returns:
        0.

    Raises:
        serving.tfs.client.RemoteError: the server refused the request.
    """
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
