"""`make bench-recommender-e2e`: the recommender end to end at scale, once, with its figures.

Generate N records (default 1 M) in S shards (default 8) with a planted signal; stream the train shards
through tf.data (interleave -> batch -> `parse_example` -> prefetch) into one epoch of Keras `fit`; score
AUC on the held-out shard against the planted AUC; ship the model (`tfship.ship(model, (x, y))`: export,
ONNX and TFLite conversion, gate, publish); serve every published artifact and answer a multi-input Predict
over gRPC and REST, checked against the Keras model's own outputs. Writes `recommender-e2e-latest.json`
and `.md` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.train.recommender import _data, _dataset
from tfship.pipeline.config import DataSection
from tfship.pipeline.data.recommender_data import RecommenderDataSpec, recommender_feature_spec
from tfship.pipeline.training.input_specs import input_specs


def _held_out(folder: Path, manifest: dict, specs) -> tuple[dict, np.ndarray]:
    x, y = {}, []
    for inputs, labels in _dataset(folder, manifest["test"], specs, 4096):
        for name, value in inputs.items():
            x.setdefault(name, []).append(value.numpy())
        y.append(labels.numpy())
    return {name: np.concatenate(parts) for name, parts in x.items()}, np.concatenate(y)


def main(argv: list[str] | None = None) -> int:
    import keras

    import tfship
    from tfship.core.tasks import task_metrics
    from tfship.pipeline.training.multi_input import recommender, task_loss

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--work", type=Path, default=Path("bench/work/recommender-e2e"))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--ids", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args(argv)
    report, clock = {}, time.perf_counter()
    spec = RecommenderDataSpec(records=args.records, shards=args.shards, users=args.ids, items=args.ids)
    manifest = _data(args.work / "data", spec)
    report["generate_seconds"] = round(time.perf_counter() - clock, 1)
    specs = input_specs(DataSection(source="tfrecord", path=str(args.work / "data" / "*.tfrecord"), label="label",
                                    feature_spec=recommender_feature_spec(spec)))
    model = recommender(specs, embedding_dim=32)
    model.compile(keras.optimizers.Adam(3e-3), task_loss("binary"))
    clock = time.perf_counter()
    model.fit(_dataset(args.work / "data", manifest["train"], specs, args.batch), epochs=1, verbose=0)
    train_rows = args.records * len(manifest["train"]) // args.shards
    report |= {"train_seconds": round(time.perf_counter() - clock, 1), "train_rows_about": train_rows,
               "train_shards": len(manifest["train"])}
    x, y = _held_out(args.work / "data", manifest, specs)
    expected = model.predict(x, batch_size=8192, verbose=0)
    report |= {"auc": round(task_metrics("binary", expected, y)["auc"], 4), "planted_auc": manifest["planted_auc"],
               "test_rows": len(y)}
    print("bench-recommender-e2e:", report, flush=True)
    clock = time.perf_counter()
    sample = {name: value[:2000] for name, value in x.items()}
    result = tfship.ship(model, (sample, y[:2000]), repository=args.work / "models", runs_dir=args.work / "runs",
                         model_name="recommender", convert={"tflite_modes": ["float32"]})
    report |= {"ship_seconds": round(time.perf_counter() - clock, 1), "ship_status": result.status,
               "published": [a.name for a in result.artifacts], "version": str(result.published)}
    rows = {name: value[:16] for name, value in x.items()}
    answers = {}
    for backend in ("saved_model", "onnx", "tflite"):
        with tfship.serve(args.work / "models", "recommender", backend=backend) as served:
            for protocol in ("grpc", "rest"):
                got = served.client(protocol).predict(rows)["probability"]
                answers[f"{backend}/{protocol}"] = float(np.max(np.abs(got - expected[:16])))
    report["predict_max_abs_diff_vs_keras"] = answers
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recommender-e2e-latest.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# Recommender end to end", "", f"- {args.records:,} records in {args.shards} shards generated in "
             f"{report['generate_seconds']} s ({args.ids:,} users and items)",
             f"- 1 epoch streamed from {report['train_shards']} train shards (~{train_rows:,} records) in "
             f"{report['train_seconds']} s", f"- held-out AUC **{report['auc']}** against the planted "
             f"{report['planted_auc']} ({report['test_rows']:,} rows)",
             f"- shipped in {report['ship_seconds']} s: {report['ship_status']}, {report['published']}",
             "- multi-input Predict (user_id, item_id, history, dense), max |served - Keras| over 16 rows: "
             + ", ".join(f"{k} {v:.2g}" for k, v in answers.items()), ""]
    (args.out / "recommender-e2e-latest.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
