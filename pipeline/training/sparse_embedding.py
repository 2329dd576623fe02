"""`SparseEmbedding`: a Keras `Embedding` whose lookup reads only the rows it needs.

Keras 3's `Embedding` looks rows up with `ops.take` on the table converted to a tensor, which reads the whole
variable (`ReadVariableOp`). The gradient is still `tf.IndexedSlices` and SGD applies it with a scatter, but
the read value is alive when the scatter writes, so TensorFlow copies the whole table first (copy on write):
measured here, a 5 M x 32 table took 217 ms per step against 4 ms for 50 k rows. `tf.gather` on the
resource variable itself (`ResourceGather`) reads only the batch's rows, and the step is 1.4 ms against
0.3 ms (`/work/notes/i34.md`; `make bench-recommender`). Same weights, config, mask (`mask_zero`) and
outputs as `keras.layers.Embedding`; registered as `tfship>SparseEmbedding`, so a `.keras` file holding it
loads once this module is imported (`tfship run --custom-objects tfship.pipeline.training.sparse_embedding`).
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfship")
class SparseEmbedding(keras.layers.Embedding):
    """`keras.layers.Embedding` with a row-wise lookup: ids int [B, ...] -> [B, ..., output_dim]."""

    def call(self, inputs):
        ids = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32)
        rows = tf.gather(self.embeddings.value, ids)  # ResourceGather: only the batch's rows are read
        return tf.cast(rows, self.compute_dtype) if rows.dtype != self.compute_dtype else rows
