"""Measure the two ways the `saved_model` backend could run a TF2 SavedModel: its restored functions
(`tf.saved_model.load`, the backend before) or its MetaGraph in a `tf.compat.v1.Session` (TF Serving's
way, `serving.runtimes.saved_model.GraphSession`, the backend now).

Each engine runs in a fresh process (so one's memory does not count for the other): load time (s), the
resident-memory growth of the load (MiB), and the median / p90 latency of one `predict` call (µs) at batch
1 and 32, over `--calls` calls after 20 warm-up calls. Answers of both engines are compared (atol 1e-6).

Usage: `python -m bench.serve.saved_model_engines [--calls N] [--out PATH.json]`
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


GRAPH_SESSION, OBJECT_FUNCTIONS = "graph_session", "object_functions"


class ObjectFunctions:
    """The backend before TF Serving's way: `tf.saved_model.load` and each signature's concrete function."""

    def __init__(self, version_dir: Path, tags: list[str]) -> None:
        import tensorflow as tf

        self._functions = dict(tf.saved_model.load(str(version_dir), tags=tags).signatures)

    def run(self, signature_name: str, inputs: dict) -> dict:
        import tensorflow as tf

        outputs = self._functions[signature_name](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in outputs.items()}


def _measure(engine: str, version_dir: str, calls: int, queue) -> None:
    import tensorflow as tf  # noqa: F401  (imported before the baseline: TF itself is not the engine's cost)

    from tfship.core.saved_model import read_signatures, serving_tags
    from tfship.serving.runtimes import saved_model
    from tfship.serving.runtimes.base import RuntimeOptions

    path = Path(version_dir)
    signatures = read_signatures(path, include_internal=True)
    before = _rss_mib()
    started = time.perf_counter()
    if engine == GRAPH_SESSION:
        runner = saved_model.GraphSession(path, serving_tags(path), signatures, RuntimeOptions())
    else:
        runner = ObjectFunctions(path, serving_tags(path))
    load_s = time.perf_counter() - started
    result = {"engine": engine, "load_s": round(load_s, 3)}
    rng = np.random.default_rng(0)
    answers = {}
    for batch in (1, 32):
        images = rng.random((batch, 8, 8, 1), dtype=np.float32)
        for _ in range(20):
            runner.run("serving_default", {"image": images})
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            out = runner.run("serving_default", {"image": images})
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        result[f"batch{batch}_median_us"] = round(statistics.median(times), 1)
        result[f"batch{batch}_p90_us"] = round(times[int(0.9 * len(times))], 1)
        answers[batch] = {k: np.asarray(v).tolist() for k, v in out.items()}
    result["rss_growth_mib"] = round(_rss_mib() - before, 1)
    queue.put((result, answers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "serving"))
    from model_factory import build_saved_model

    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        version_dir = Path(tmp) / "1"
        build_saved_model(version_dir, onnx=False, tflite=False)
        results, answers = [], []
        for engine in (OBJECT_FUNCTIONS, GRAPH_SESSION):
            queue = context.Queue()
            process = context.Process(target=_measure, args=(engine, str(version_dir), args.calls, queue))
            process.start()
            result, answer = queue.get()
            process.join()
            results.append(result)
            answers.append(answer)
    same = all(np.allclose(np.asarray(answers[0][b][k]), np.asarray(answers[1][b][k]), atol=1e-6)
               for b in answers[0] for k in answers[0][b])
    report = {"model": "tests/serving/model_factory.py digits SavedModel (TF2, Keras 3)", "calls": args.calls,
              "same_answers": same, "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
