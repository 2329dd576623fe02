"""The held-out rows `tfship query` sends: a run's own (an export-only run's `--data`, or its config's test
split) or the test split of a config's data, as named inputs {input name: [N, ...]} with their labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def held_out_rows(count: int, config: Path | None = None, run: Path | str | None = None
                  ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The first `count` held-out rows: named inputs and labels [count, ...].

    Args:
        count: rows wanted (fewer when the data holds fewer).
        config: pipeline TOML (None: the bundled digits config); with `run`, its runs_dir locates the run.
        run: a run folder, a run id under `run.runs_dir`, or "latest": that run's data (an export-only run's
            `--data` rows; a trained run's test split), with the run's own config.

    Raises:
        ConfigError, DatasetError, StageError: the config, the run or its data is unusable (named).
    """
    from tfship.pipeline.config import load_config

    cfg = load_config(config)
    if run is None:
        from tfship.pipeline.data.splits import load_splits, scan_cache_dir

        splits = load_splits(cfg, scan_cache_dir(cfg))
        images = splits.test.images  # a streamed split's bounded sample; named inputs: a dict
        named = images if isinstance(images, dict) else {splits.input_name: images}
        return {name: value[:count] for name, value in named.items()}, splits.test.labels[:count]
    from tfship.pipeline.orchestration.chain import load_run_data
    from tfship.pipeline.orchestration.resume import resolve_run, stored_config

    folder = resolve_run(run, cfg.run.runs_dir)
    data = load_run_data(stored_config(folder), folder)
    if hasattr(data, "inputs"):  # export-only EvalData: every row of --data is held out
        labels = data.labels if data.labels is not None else np.zeros(len(next(iter(data.inputs.values()))))
        return {name: value[:count] for name, value in data.inputs.items()}, labels[:count]
    return {data.input_name: data.test.images[:count]}, data.test.labels[:count]
