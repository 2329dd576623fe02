"""The op policy's attack corpus, built in the tests themselves: SavedModels whose signatures touch the host.

Each is a `tf.Module` saved with `tf.saved_model.save` (saving traces, it runs nothing), with `serving_default`
taking `x` float32 [None, 4] (or a string path) and returning `y`:

* `write`: `x @ w` and `tf.io.write_file(marker, ...)`;
* `read`: `tf.io.read_file(path)` of its string input `path`;
* `match`: `tf.io.matching_files(pattern)` of its input;
* `print_file`: `x @ w` and `tf.print(x, output_stream="file://<marker>")`;
* `table_const`: a hash table initialised in the signature from a file named by a constant (not an asset);
* `init_write`: a plain `x @ w` whose `__saved_model_init_op` (an initializer TF runs at load) writes the marker.

And the models that must pass: `plain` (`x @ w`), `print_stdout` (`tf.print` to stderr), `keras` (a Keras
`model.export()` SavedModel, input `features` [None, 8]) and `asset_table` (a table from a vocabulary asset).
"""

from __future__ import annotations

from pathlib import Path

ATTACKS = ("write", "read", "match", "print_file", "table_const", "init_write")
# The op each attack is refused for.
REFUSED_OP = {"write": "WriteFile", "read": "ReadFile", "match": "MatchingFiles", "print_file": "PrintV2",
              "table_const": "InitializeTableFromTextFileV2", "init_write": "WriteFile"}


def save_module(kind: str, folder: Path, marker: Path) -> Path:
    """Save the corpus model `kind` (module docstring) into `folder`; `marker` is the file the attacks write."""
    import tensorflow as tf

    x_spec = tf.TensorSpec([None, 4], tf.float32, name="x")
    path_spec = tf.TensorSpec([], tf.string, name="path")

    class Model(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), (4, 2)))

    model = Model()
    if kind in ("plain", "write", "print_file", "print_stdout"):
        def serve(x):
            if kind == "write":
                tf.io.write_file(str(marker), "written by the model")
            elif kind == "print_file":
                tf.print(x, output_stream=f"file://{marker}")
            elif kind == "print_stdout":
                tf.print(x)
            return {"y": x @ model.w}
        function = tf.function(serve, input_signature=[x_spec])
    elif kind in ("read", "match"):
        def serve_path(path):
            return {"y": tf.io.read_file(path) if kind == "read" else tf.strings.reduce_join(tf.io.matching_files(path))}
        function = tf.function(serve_path, input_signature=[path_spec])
    elif kind == "table_const":
        def serve_table(x):
            table = tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)
            init = tf.raw_ops.InitializeTableFromTextFileV2(table_handle=table, filename=tf.constant("/etc/hostname"),
                                                            key_index=-2, value_index=-1)
            with tf.control_dependencies([init]):
                return {"y": x @ model.w}
        function = tf.function(serve_table, input_signature=[x_spec])
    elif kind == "init_write":
        class Writer(tf.saved_model.experimental.TrackableResource):
            def _create_resource(self):
                return tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)

            def _initialize(self):
                tf.io.write_file(str(marker), "written at load")

        model.writer = Writer()

        def serve_init(x):
            return {"y": x @ model.w + tf.cast(tf.raw_ops.LookupTableSizeV2(table_handle=model.writer.resource_handle),
                                               tf.float32)}
        function = tf.function(serve_init, input_signature=[x_spec])
    else:
        raise ValueError(kind)
    model.serve = function
    tf.saved_model.save(model, str(folder), signatures={"serving_default": function})
    return folder


def save_keras(folder: Path) -> Path:
    """A plain Keras model (8 features -> 2 logits), exported with `model.export()` (Keras' own SavedModel)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,), name="features"), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2, name="logits")], name="plain")
    model.export(str(folder), verbose=False)
    return folder


def save_asset_table(folder: Path, vocabulary: Path) -> Path:
    """A table initialised from `vocabulary`, which `tf.saved_model.save` copies into `assets/`: allowed."""
    import tensorflow as tf

    vocabulary.write_text("a\nb\nc\n")

    class Model(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                str(vocabulary), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER), -1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="word")])
        def serve(self, word):
            return {"id": self.table.lookup(word)}

    model = Model()
    tf.saved_model.save(model, str(folder), signatures={"serving_default": model.serve})
    return folder
