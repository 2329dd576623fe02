"""Cost of the training debug switches: steps/s of the digits CNN train step (no XLA, batch 64) under
`check_numerics`, `assert_inputs` and `run_eagerly` against the plain step, timed interleaved (5 rounds
of 60 steps each, 10 for eager; medians) so machine load hits every variant alike. Prints JSON.

`python -m bench.train.debug_switches` (figures in docs/training.md, "Debugging").
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

VARIANTS = {"baseline": {}, "check_numerics": {"train.check_numerics": True},
            "assert_inputs": {"train.assert_inputs": True}, "run_eagerly": {"train.run_eagerly": True}}


def _build(name: str, overrides: dict):
    import tensorflow as tf

    from tfship.pipeline.config import load_config
    from tfship.pipeline.data.splits import load_split_arrays
    from tfship.pipeline.training.train import TrainInputs, _Loop
    from tfship.pipeline.training.train_checks import numerics_checked_tracing

    config = load_config(None, {"train.jit_compile": False, "train.tensorboard": False} | overrides)
    splits = load_split_arrays(config.data, config.run.seed)
    loop = _Loop(TrainInputs(config, splits, Path(tempfile.mkdtemp())), None)
    tf.config.run_functions_eagerly(name == "run_eagerly")
    with numerics_checked_tracing(config.train.check_numerics):
        steps, _ = loop._build_step()
    tf.config.run_functions_eagerly(False)
    return loop, steps


def _rate(name: str, loop, steps, count: int) -> float:
    import tensorflow as tf

    tf.config.run_functions_eagerly(name == "run_eagerly")
    started = time.perf_counter()
    for _ in range(count):
        outputs = steps.train_step(*next(loop.iterator))
    float(outputs[0])
    tf.config.run_functions_eagerly(False)
    return count / (time.perf_counter() - started)


def main() -> None:
    built = {name: _build(name, overrides) for name, overrides in VARIANTS.items()}
    for name, (loop, steps) in built.items():
        _rate(name, loop, steps, 3)
    rates: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(5):
        for name, (loop, steps) in built.items():
            rates[name].append(_rate(name, loop, steps, 10 if name == "run_eagerly" else 60))
    print(json.dumps({name: round(statistics.median(values), 1) for name, values in rates.items()}))


if __name__ == "__main__":
    main()
