"""Model factories that take named input specs (`InputSpec`), not one input shape: `tabular` and `recommender`.

Both are Keras 3 functional models with one named input per spec (the exported signature's inputs) and a head per task
(`core.tasks`): classification logits float32 [B, C] (`logits`), binary a sigmoid probability float32
[B, 1] (`probability`), regression float32 [B, 1] (`prediction`).

* dense input [B, *shape] float32: flattened, then (`normalize_on` given: `model.normalize`) a
  `keras.layers.Normalization` adapted on the train split's sample of it, so serving takes raw values;
* categorical input [B] int64: an `Embedding(num_ids, embedding_dim)` row [B, embedding_dim]; a **string**
  input [B] (or a string sequence [B, length], "" = padding) first goes through a `keras.layers.StringLookup`
  over the spec's vocabulary inside the model (0 unknown, 1 + index; sequences: "" -> 0, unknown -> 1,
  2 + index), so serving takes the raw strings;
* sequence input [B, length] int64 (0 = padding): an `Embedding(num_ids, embedding_dim, mask_zero=True)`
  pooled over the non-padding ids, by masked mean (`MaskedMean`: 0 for an all-padding row) or by attention with a
  query (the recommender's candidate item: Keras' dot-product `Attention`, padding masked).

`policy` (`train.mixed_precision`) is the dtype policy of the built-in hidden layers; the head and the
normalization compute in float32.

Ids go through `SparseEmbedding` (`pipeline/training/sparse_embedding.py`): a gather on the table variable
itself, so a step reads only the batch's rows, its gradient is a `tf.IndexedSlices` of those rows, and a
plain SGD update applies it row by row (`ResourceScatterSub`): a step's cost does not grow with the table
(Adam's moment update is dense in Keras 3 and touches every row). Built-in layers otherwise, so a `.keras`
file reloads once that module is imported (it registers the layer).
"""

from __future__ import annotations

from collections.abc import Sequence

from tfship.core.tasks import primary

HEADS = {"classification": "logits", "binary": "probability", "regression": "prediction"}


def _inputs(specs):
    import keras

    ragged = [spec.feature for spec in specs if spec.ragged]
    if ragged:
        raise ValueError(f"data.feature_spec.{ragged[0]}.ragged = true: the model takes padded sequences; declare "
                         f"data.feature_spec.{ragged[0]}.length = N instead")
    return {spec.name: keras.Input(shape=spec.shape, name=spec.name, dtype=spec.dtype) for spec in specs}


def _embed(spec, tensor, dim: int, policy: str = "float32"):
    import keras

    from tfship.pipeline.training.sparse_embedding import SparseEmbedding

    if spec.dtype == "string":
        if not spec.vocabulary:
            raise ValueError(f"input {spec.name!r}: a string input needs its vocabulary (declared, or found by the "
                             "data scan)")
        sequence = spec.kind == "sequence"
        tensor = keras.layers.StringLookup(vocabulary=list(spec.vocabulary), num_oov_indices=1,
                                           mask_token="" if sequence else None, output_mode="int",
                                           name=f"{spec.name}_lookup")(tensor)
    table = SparseEmbedding(spec.num_ids, dim, mask_zero=spec.kind == "sequence", name=f"{spec.name}_embedding",
                            dtype=policy)
    return table(tensor)


def _dense(spec, tensor, normalize_on, policy: str = "float32"):
    """A dense input [B, *shape] as [B, F] (flattened), normalized when `normalize_on` holds its sample."""
    import keras
    import numpy as np

    if len(spec.shape) > 1:
        tensor = keras.layers.Flatten(name=f"{spec.name}_flat")(tensor)
    elif not spec.shape:
        tensor = keras.layers.Reshape((1,), name=f"{spec.name}_column")(tensor)
    if normalize_on is None:
        return tensor
    sample = np.asarray(normalize_on[spec.name], np.float32).reshape(len(normalize_on[spec.name]), -1)
    if not len(sample):
        raise ValueError(f"model.normalize = true: no train sample of input {spec.name!r} to adapt on")
    layer = keras.layers.Normalization(axis=-1, name=f"{spec.name}_normalize", dtype="float32")
    layer.adapt(sample)
    return layer(tensor)


def _masked_mean(name: str, policy: str = "float32"):
    from tfship.pipeline.training.sparse_embedding import MaskedMean

    return MaskedMean(name=name, dtype=policy)


def _head(hidden, task: str, num_classes: int):
    import keras

    primary(task)  # an unknown task raises ValueError naming the known ones
    if task == "classification":
        return keras.layers.Dense(num_classes, name="logits", dtype="float32")(hidden)
    if task == "binary":
        return keras.layers.Dense(1, activation="sigmoid", name="probability", dtype="float32")(hidden)
    return keras.layers.Dense(1, name="prediction", dtype="float32")(hidden)


def _tower(parts, hidden_units: Sequence[int], dropout: float, policy: str = "float32"):
    import keras

    hidden = keras.layers.Concatenate(name="features", dtype=policy)(parts) if len(parts) > 1 else parts[0]
    for index, units in enumerate(hidden_units):
        hidden = keras.layers.Dense(units, activation="relu", name=f"dense{index}", dtype=policy)(hidden)
    if dropout > 0:
        hidden = keras.layers.Dropout(dropout, name="dropout", dtype=policy)(hidden)
    return hidden


def tabular(specs, task: str = "classification", num_classes: int = 2, *, embedding_dim: int = 16,
            hidden_units: Sequence[int] = (64, 32), dropout: float = 0.0, seed: int = 0, name: str = "tabular",
            normalize_on: dict | None = None, policy: str = "float32"):
    """A model over any mix of dense, categorical and (padded) sequence inputs: each input encoded (dense
    flattened, ids embedded, sequences embedded and mean-pooled over non-padding ids), concatenated, an MLP,
    the task's head.

    Args:
        normalize_on: {input name: train sample [n, ...]}: normalize each dense input (adapted on it).
        policy: dtype policy of the hidden layers ("float32", "mixed_bfloat16", "mixed_float16").

    Raises:
        ValueError: an unknown task, a ragged sequence, a string input without vocabulary, or no inputs.
    """
    import keras

    if not specs:
        raise ValueError("tabular: no inputs (data.feature_spec declares none besides the label)")
    keras.utils.set_random_seed(seed)
    inputs = _inputs(specs)
    parts = []
    for spec in specs:
        tensor = inputs[spec.name]
        if spec.kind == "dense":
            parts.append(_dense(spec, tensor, normalize_on, policy))
        elif spec.kind == "categorical":
            parts.append(_embed(spec, tensor, embedding_dim, policy))
        else:
            parts.append(_masked_mean(f"{spec.name}_pool", policy)(_embed(spec, tensor, embedding_dim, policy)))
    return keras.Model(inputs, _head(_tower(parts, hidden_units, dropout, policy), task, num_classes), name=name)


def recommender(specs, task: str = "binary", num_classes: int = 2, *, user: str = "user_id", item: str = "item_id",
                history: str = "history", embedding_dim: int = 32, pooling: str = "attention",
                hidden_units: Sequence[int] = (64, 32), dropout: float = 0.0, seed: int = 0, name: str = "recommender",
                normalize_on: dict | None = None, policy: str = "float32"):
    """The seeds' recommender: user and candidate item ids through embedding tables, the user's recent item ids
    (a padded sequence) pooled by attention with the candidate item as query (or a masked mean), the dense
    features, the user.item dot product, an MLP and a binary head (probability that the user takes the item).

    Args:
        specs: the input specs; `user` and `item` categorical, `history` a padded sequence over the same ids
            as `item` (its own table), every other input dense or categorical (encoded as in `tabular`).
        pooling: "attention" (candidate-item query) or "mean".
        normalize_on, policy: as in `tabular` (dense inputs normalized; hidden layers' dtype policy).

    Raises:
        ValueError: a role input missing or of the wrong kind, an unknown pooling or task.
    """
    import keras

    by_name = {spec.name: spec for spec in specs}
    for role, kind in ((user, "categorical"), (item, "categorical"), (history, "sequence")):
        if role not in by_name or by_name[role].kind != kind:
            raise ValueError(f"recommender: needs a {kind} input {role!r}; inputs: "
                             f"{[(s.name, s.kind) for s in specs]}")
    if pooling not in ("attention", "mean"):
        raise ValueError(f"recommender: pooling = {pooling!r}; expected 'attention' or 'mean'")
    keras.utils.set_random_seed(seed)
    inputs = _inputs(specs)
    user_vector = _embed(by_name[user], inputs[user], embedding_dim, policy)
    item_vector = _embed(by_name[item], inputs[item], embedding_dim, policy)
    history_vectors = _embed(by_name[history], inputs[history], embedding_dim, policy)
    if pooling == "attention":
        query = keras.layers.Reshape((1, embedding_dim), name="item_query", dtype=policy)(item_vector)
        attended = keras.layers.Attention(name="history_attention", dtype=policy)([query, history_vectors])
        pooled = keras.layers.Flatten(name="history_pooled", dtype=policy)(attended)
    else:
        pooled = _masked_mean("history_pooled", policy)(history_vectors)
    parts = [user_vector, item_vector, pooled,
             keras.layers.Dot(axes=1, name="user_item_dot", dtype=policy)([user_vector, item_vector])]
    for spec in specs:
        if spec.name in (user, item, history):
            continue
        tensor = inputs[spec.name]
        if spec.kind == "categorical":
            parts.append(_embed(spec, tensor, embedding_dim, policy))
        elif spec.kind == "dense":
            parts.append(_dense(spec, tensor, normalize_on, policy))
        else:
            parts.append(_masked_mean(f"{spec.name}_pool", policy)(_embed(spec, tensor, embedding_dim, policy)))
    return keras.Model(inputs, _head(_tower(parts, hidden_units, dropout, policy), task, num_classes), name=name)


def task_loss(task: str):
    """The Keras loss of `task`'s head: sparse categorical cross-entropy from logits, binary cross-entropy of
    the probability, or mean squared error.
    """
    import keras

    primary(task)
    if task == "classification":
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return keras.losses.BinaryCrossentropy() if task == "binary" else keras.losses.MeanSquaredError()


def task_keras_metrics(task: str) -> list:
    """Keras metrics matching `core.tasks`: accuracy; AUC and accuracy; MAE and RMSE."""
    import keras

    primary(task)
    if task == "classification":
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if task == "binary":
        return [keras.metrics.AUC(name="auc", num_thresholds=1000), keras.metrics.BinaryAccuracy(name="accuracy")]
    return [keras.metrics.MeanAbsoluteError(name="mae"), keras.metrics.RootMeanSquaredError(name="rmse")]
