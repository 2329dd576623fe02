"""The held-out rows `tfship query` sends: a run's own (an export-only run's `--data`, or its config's test
split) or the test split of a config's data, as named inputs {input name: [N, ...]} with their labels.

Without `--run`, the rows are the served model's own: the newest run under `run.runs_dir` that published that
model name (`config.json`'s `run.model_name`, with a `summary.json`), else the config's data when the config
is that model's; otherwise nothing is sent and the refusal says to pass `--run` or `--samples`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tfship.pipeline.data.split_types import DatasetSplits


def served_model_run(runs_dir: Path, model_name: str) -> Path | None:
    """The newest run folder under `runs_dir` that published `model_name` (its `config.json` says
    `run.model_name`, and its `summary.json` exists), or None.
    """
    import json

    folder = Path(runs_dir)
    runs = sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), reverse=True) \
        if folder.is_dir() else []
    for candidate in runs:
        try:
            stored = json.loads((candidate / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        named = stored.get("run", {}).get("model_name") if isinstance(stored, dict) else None
        if named == model_name and (candidate / "summary.json").is_file():
            return candidate
    return None


def held_out_rows(count: int, config: Path | None = None, run: Path | str | None = None,
                  model_name: str | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The first `count` held-out rows: named inputs and labels [count, ...].

    Args:
        count: rows wanted (fewer when the data holds fewer).
        config: pipeline TOML (None: the bundled digits config); with `run`, its runs_dir locates the run.
        run: a run folder, a run id under `run.runs_dir`, or "latest": that run's data (an export-only run's
            `--data` rows; a trained run's test split), with the run's own config.
        model_name: the served model's name (`--model-name`); without `run`, the newest run that published it
            gives the rows (`served_model_run`), else the config's data if the config is that model's.

    Raises:
        ConfigError: without `run`, no run published `model_name` and the config is another model's (one line
            saying to pass `--run` or `--samples`; nothing is sent).
        ConfigError, DatasetError, StageError: the config, the run or its data is unusable (named).
    """
    from tfship.core.errors import ConfigError
    from tfship.pipeline.config import load_config

    cfg = load_config(config)
    if run is None and model_name is not None and model_name != cfg.run.model_name:
        run = served_model_run(cfg.run.runs_dir, model_name)
        if run is None:
            raise ConfigError(f"query: no run under {cfg.run.runs_dir} published model {model_name!r}, and the "
                              f"config's data is {cfg.run.model_name!r}'s; pass --run RUN (its held-out rows) or "
                              "--samples FILE.npz")
    if run is None:
        from tfship.pipeline.data.splits import load_splits, scan_cache_dir

        return _test_rows(load_splits(cfg, scan_cache_dir(cfg)), count)
    from tfship.pipeline.export_only.user_model import EvalData
    from tfship.pipeline.orchestration.chain import load_run_data
    from tfship.pipeline.orchestration.resume import resolve_run, stored_config

    folder = resolve_run(run, cfg.run.runs_dir)
    data = load_run_data(stored_config(folder), folder)
    if isinstance(data, EvalData):  # export-only (or a named run's held_out.npz): every row of it is held out
        labels = data.labels if data.labels is not None else np.zeros(len(next(iter(data.inputs.values()))))
        return {name: value[:count] for name, value in data.inputs.items()}, labels[:count]
    return _test_rows(data, count)  # a named run before its export wrote held_out.npz: the config's splits


def _test_rows(splits: DatasetSplits, count: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The test split's first `count` rows by input name (a streamed split's bounded sample)."""
    images = splits.test.images
    named = images if isinstance(images, dict) else {splits.input_name: images}
    return {name: value[:count] for name, value in named.items()}, splits.test.labels[:count]
