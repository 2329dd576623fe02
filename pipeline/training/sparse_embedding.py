"""`SparseEmbedding`: a Keras `Embedding` whose lookup reads only the rows it needs; `MaskedMean`: the mean of a
sequence's non-padding rows that stays finite (and its gradient too) when a row is all padding.

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


@keras.saving.register_keras_serializable(package="tfship")
class MaskedMean(keras.layers.Layer):
    """Mean over axis 1 of [B, T, D] rows where the mask is true -> [B, D]; an all-padding sequence gives 0.

    Keras' `GlobalAveragePooling1D` divides by the mask's count, 0 for an all-padding row: its gradient is
    NaN there and the NaN spreads into the embedding table and the next layer's kernel in one step
    (measured: a 3-input regression whose sequence was empty in 1 row of 64). Here the count is at least 1.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return tf.reduce_mean(inputs, axis=1)
        weights = tf.cast(mask, inputs.dtype)[..., None]
        count = tf.maximum(tf.reduce_sum(weights, axis=1), tf.ones([], inputs.dtype))
        return tf.reduce_sum(inputs * weights, axis=1) / count

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])
