"""The hand-written reference of `make bench-train-loop`: plain Keras `Model.fit` over plain tf.data, in its own
process (started by bench/train/loop_vs_fit.py, as `tfship train` is), no tfship training code.

    python -m bench.train.loop_reference --case mlp --train 'bench/work/train-loop/mlp-1000000/part-*.tfrecord' \
        --spe 1,32,256 [--read]

Cases (the same model, batch, Adam, learning rate and XLA setting as the tfship config of the same case):

* `mlp`: TFRecordDataset (parallel reads) -> shuffle(2048) -> batch(256, drop_remainder) -> parse_example ->
  prefetch; Dense(16, relu) -> Dense(10); one epoch. `--read` first times the plain read + parse of the same
  shards (TFRecordDataset -> batch(256) -> parse_example -> prefetch, read to its end): the end-to-end case.
* `cnn`: scikit-learn's digits, the train split tfship makes (`load_split_arrays`, data only), as
  from_tensor_slices -> cache -> shuffle -> batch(64, drop_remainder) -> prefetch; Conv2D 32 / pool / Conv2D 64 /
  pool / Flatten / Dense 256 relu / Dropout 0.1 / Dense 10 (pipeline.training.model's `_cnn_body`, written out).
* `rec`: the recommender (`pipeline.training.multi_input.recommender`, the model factory only) over the
  recommender shards parsed by hand (ids, padded history, dense), `--steps` steps of batch 512.

Per `steps_per_execution` K: a fresh model, compiled, one `fit` (the `cnn` case's epochs; `rec`: `--steps`
steps). Timed as `tfship train`'s train.json `input.records_per_second` is (its `InputMeter`): a callback takes
the time at the start of every K-step block and at each epoch's end (after Keras has waited for the epoch's
last step), so each block's wall time is known; the first block of the fit (it traces, compiles and fills the
pipeline: tfship's meter leaves out its first block too) is left out, and records/s = the other blocks' steps x
batch / their summed wall time (work between epochs left out, as tfship's evaluation is). The callback has no
`on_train_batch_end`, so Keras keeps its asynchronous callback dispatch. `cold_records_per_second` is every
step over the whole fit's wall time (compile included). Prints one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import time


def _parse_mlp(batch):
    import tensorflow as tf

    parsed = tf.io.parse_example(batch, {"x": tf.io.FixedLenFeature([32], tf.float32),
                                         "label": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["x"], parsed["label"]


def _files(glob: str) -> list[str]:
    import tensorflow as tf

    files = sorted(tf.io.gfile.glob(glob))
    if not files:
        raise SystemExit(f"loop_reference: {glob}: no file")
    return files


def read_rate(glob: str) -> dict:
    """Plain read + parse of every record once: records/s (the end-to-end case's reference)."""
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(_files(glob), num_parallel_reads=tf.data.AUTOTUNE).batch(256).map(
        _parse_mlp, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    started, cpu, count = time.perf_counter(), time.process_time(), 0
    for x, _ in dataset:
        count += int(x.shape[0])
    seconds = time.perf_counter() - started
    return {"records": count, "seconds": round(seconds, 3), "records_per_second": round(count / seconds, 1),
            "records_per_cpu_second": round(count / max(time.process_time() - cpu, 1e-9), 1)}


def mlp_setup(args):
    import keras
    import tensorflow as tf

    def data():
        records = tf.data.TFRecordDataset(_files(args.train), num_parallel_reads=tf.data.AUTOTUNE)
        return records.shuffle(2048, seed=args.seed).batch(256, drop_remainder=True).map(
            _parse_mlp, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    def model():
        keras.utils.set_random_seed(args.seed)
        inputs = keras.Input((32,), name="features")
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden))

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return data, model, loss, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")], 256, 1


def cnn_setup(args):
    import keras
    import tensorflow as tf

    from tfship.pipeline.config import load_config
    from tfship.pipeline.data.splits import load_split_arrays

    config = load_config(None)
    train = load_split_arrays(config.data, config.run.seed).train  # the arrays tfship trains on (data only)
    images, labels = train.images.astype("float32"), train.labels.astype("int64")

    def data():
        return tf.data.Dataset.from_tensor_slices((images, labels)).cache().shuffle(
            2048, seed=args.seed, reshuffle_each_iteration=True).batch(64, drop_remainder=True).prefetch(
            tf.data.AUTOTUNE)

    def model():
        keras.utils.set_random_seed(args.seed)
        inputs = keras.Input((8, 8, 1), name="image")
        hidden = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
        hidden = keras.layers.MaxPooling2D(2)(hidden)
        hidden = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(hidden)
        hidden = keras.layers.MaxPooling2D(2)(hidden)
        hidden = keras.layers.Dense(256, activation="relu")(keras.layers.Flatten()(hidden))
        hidden = keras.layers.Dropout(0.1)(hidden)
        return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden))

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return data, model, loss, [keras.metrics.SparseCategoricalAccuracy(name="accuracy")], 64, args.epochs


def rec_setup(args):
    import keras
    import tensorflow as tf

    from tfship.pipeline.config import DataSection
    from tfship.pipeline.training.multi_input import recommender

    try:  # the input specs the model factory takes (moved to pipeline.data with the new loop)
        from tfship.pipeline.data.input_spec import input_specs
    except ImportError:
        from tfship.pipeline.training.input_specs import input_specs

    length, table = args.history_length, args.user_rows
    features = {"user_id": tf.io.FixedLenFeature([], tf.int64), "item_id": tf.io.FixedLenFeature([], tf.int64),
                "history": tf.io.VarLenFeature(tf.int64), "dense": tf.io.FixedLenFeature([4], tf.float32),
                "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(batch):
        parsed = tf.io.parse_example(batch, features)
        history = tf.sparse.to_dense(parsed["history"])[:, :length]
        history = tf.pad(history, [[0, 0], [0, length - tf.shape(history)[1]]])
        inputs = {"user_id": parsed["user_id"], "item_id": parsed["item_id"], "history": history,
                  "dense": parsed["dense"]}
        return inputs, tf.cast(parsed["label"], tf.float32)

    def data():
        records = tf.data.TFRecordDataset(_files(args.train), num_parallel_reads=tf.data.AUTOTUNE)
        return records.shuffle(2048, seed=args.seed).repeat().batch(512, drop_remainder=True).map(
            parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    spec = {"user_id": {"dtype": "int64", "kind": "categorical", "num_ids": table},
            "item_id": {"dtype": "int64", "kind": "categorical", "num_ids": args.item_rows},
            "history": {"dtype": "int64", "kind": "sequence", "num_ids": args.item_rows, "length": length},
            "dense": {"dtype": "float32", "shape": [4]}, "label": {"dtype": "int64"}}
    specs = input_specs(DataSection(source="tfrecord", path=args.train, label="label", feature_spec=spec))

    def model():
        return recommender(specs, "binary", 2, embedding_dim=32, hidden_units=(64, 32), dropout=0.0, seed=args.seed)

    metrics = [keras.metrics.AUC(name="auc", num_thresholds=1000), keras.metrics.BinaryAccuracy(name="accuracy")]
    return data, model, keras.losses.BinaryCrossentropy(), metrics, 512, 1


SETUPS = {"mlp": mlp_setup, "cnn": cnn_setup, "rec": rec_setup}


def block_timer():
    """A keras Callback timing the K-step blocks of a fit: `on_train_batch_begin` (a block's start and its first
    step's index) and `on_epoch_end` (after the epoch's last step). No `on_train_batch_end`: Keras keeps its
    asynchronous dispatch."""
    import keras

    class BlockTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs: list[list[tuple[int, float]]] = []
            self.ends: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append([])

        def on_train_batch_begin(self, batch, logs=None):
            self.epochs[-1].append((int(batch), time.perf_counter()))

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())

    return BlockTimer()


def measured_blocks(epochs: list[list[tuple[int, float]]], ends: list[float], steps_per_epoch: int) -> dict:
    """Blocks after the fit's first: their steps and summed wall time (each block from its start to the next
    block's start, an epoch's last block to the epoch's end)."""
    steps = seconds = 0.0
    blocks = 0
    first = None
    for index, (starts, end) in enumerate(zip(epochs, ends, strict=True)):
        bounds = [*starts, (steps_per_epoch, end)]
        for (begin, began), (after, until) in zip(bounds, bounds[1:], strict=False):
            if index == 0 and first is None:
                first = {"steps": after - begin, "seconds": round(until - began, 4)}
                continue
            # a block that found the data's end (Keras reads to OutOfRange) ran no step: its time still counts
            steps, seconds, blocks = steps + (after - begin), seconds + (until - began), blocks + (after > begin)
    return {"steps": int(steps), "seconds": seconds, "blocks": blocks, "first_block": first}


def fit_rate(setup, spe: int, args) -> dict:
    """One `steps_per_execution`: one fit on a fresh model, timed block by block (see the module docstring)."""
    import keras

    data, build, loss, metrics, batch, epochs = setup
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss=loss, metrics=metrics,
                  jit_compile=args.jit, steps_per_execution=spe)
    timer = block_timer()
    dataset = data().take(args.steps) if args.case == "rec" else data()
    started, cpu = time.perf_counter(), time.process_time()
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[timer])
    fit_seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    total = int(model.optimizer.iterations.numpy())
    if total % epochs:
        raise SystemExit(f"loop_reference: {total} steps over {epochs} epochs: not the same steps each epoch")
    blocks = measured_blocks(timer.epochs, timer.ends, total // epochs)
    rate = blocks["steps"] * batch / blocks["seconds"] if blocks["steps"] else float("nan")
    return {"steps_per_execution": spe, "steps": total, "steps_measured": blocks["steps"],
            "blocks_measured": blocks["blocks"], "seconds_measured": round(blocks["seconds"], 3),
            "first_block": blocks["first_block"], "records_per_second": round(rate, 1),
            "fit_seconds": round(fit_seconds, 3),
            "records_per_cpu_second": round(total * batch / max(cpu_seconds, 1e-9), 1),
            "cold_records_per_second": round(total * batch / fit_seconds, 1),
            "timed": "blocks after the first (Keras callback at each block's start and each epoch's end)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train.loop_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=list(SETUPS), required=True)
    parser.add_argument("--train", default="", help="glob of the training shards (mlp, rec)")
    parser.add_argument("--spe", default="1,32,256", help="steps_per_execution values, comma-separated")
    parser.add_argument("--read", action="store_true", help="mlp: time the plain read + parse first")
    parser.add_argument("--epochs", type=int, default=1, help="cnn: epochs of the timed fit")
    parser.add_argument("--steps", type=int, default=100, help="rec: steps of the timed fit")
    parser.add_argument("--user-rows", type=int, default=5_000_000)
    parser.add_argument("--item-rows", type=int, default=5_000)
    parser.add_argument("--history-length", type=int, default=20)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--no-jit", dest="jit", action="store_false")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result: dict = {"case": args.case, "jit_compile": args.jit}
    if args.read:
        result["read"] = read_rate(args.train)
    setup = SETUPS[args.case](args)
    result["fits"] = [fit_rate(setup, int(k), args) for k in args.spe.split(",") if k.strip()]
    result["seconds_in_process"] = round(time.perf_counter() - started, 2)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
