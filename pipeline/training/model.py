"""Model factories: built-in `cnn`, `mlp` and `text` Keras 3 functional models, or a user factory.

Built-in layers take the configured dtype policy (`mixed_bfloat16`, `mixed_float16`: float32
variables, low-precision compute); the `logits` layer always computes in float32, so the trained
model hands float32 outputs to export. Optional preprocessing (a `Normalization` layer adapted on
the train split) is part of the model and so of the exported signature. Layers named in
`model.recompute` are wrapped in a `Recompute` layer whose training call goes through
`tf.recompute_grad` (activations recomputed in the backward pass instead of kept); the model
handed to export is a plain copy without the wrappers (`without_recompute`).
"""

from __future__ import annotations

import numpy as np

from tfship.core.errors import ConfigError
from tfship.core.imports import import_function
from tfship.pipeline.config import ModelSection

NUM_DIGIT_CLASSES = 10


def _cnn_body(config: ModelSection, hidden, input_shape, policy):
    import keras

    size = min(input_shape[0], input_shape[1])
    for index, filters in enumerate(config.filters):
        hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{index}",
                                     dtype=policy)(hidden)
        if size >= 4:
            hidden = keras.layers.MaxPooling2D(2, name=f"pool{index}", dtype=policy)(hidden)
            size //= 2
    hidden = keras.layers.Flatten(name="flatten", dtype=policy)(hidden)
    return keras.layers.Dense(config.dense_units, activation="relu", name="hidden", dtype=policy)(hidden)


def _mlp_body(config: ModelSection, hidden, policy):
    import keras

    if len(hidden.shape) > 2:
        hidden = keras.layers.Flatten(name="flatten", dtype=policy)(hidden)
    for index, units in enumerate(config.hidden_units):
        hidden = keras.layers.Dense(units, activation="relu", name=f"dense{index}", dtype=policy)(hidden)
    return hidden


def _text_body(config: ModelSection, hidden, policy):
    import keras

    # SparseEmbedding reads only the batch's rows; MaskedMean stays finite (value and gradient) on an
    # all-padding row, where Keras' GlobalAveragePooling1D divides by a mask count of 0.
    from tfship.pipeline.training.sparse_embedding import MaskedMean, SparseEmbedding

    hidden = SparseEmbedding(config.vocab_size, config.embedding_dim, mask_zero=True, name="embedding",
                             dtype=policy)(hidden)
    pooling = MaskedMean if config.pooling == "mean" else keras.layers.GlobalMaxPooling1D
    hidden = pooling(name="pool", dtype=policy)(hidden)
    return keras.layers.Dense(config.dense_units, activation="relu", name="hidden", dtype=policy)(hidden)


def build_model(config: ModelSection, input_shape: tuple[int, ...], num_classes: int, seed: int, *,
                input_name: str = "image", input_dtype: str = "float32", train_inputs: np.ndarray | None = None,
                precision: str = "float32", task: str = "classification"):
    """Build the configured model: input `input_dtype` [B, *input_shape] -> the head of `task`: classification
    logits float32 [B, num_classes] (`logits`), binary a sigmoid probability float32 [B, 1] (`probability`),
    regression float32 [B, 1] (`prediction`).

    Args:
        config: the [model] table.
        input_shape: per-sample input shape (digits: (8, 8, 1); text: (sequence_length,)).
        num_classes: classifier width.
        seed: weight-initialisation seed.
        input_name: name of the model input (and of the exported signature input).
        input_dtype: "float32" for features and images, "int32"/"int64" for token ids.
        train_inputs: the train split, used to adapt the Normalization layer when `normalize`.
        precision: Keras dtype policy for built-in layers ("float32", "mixed_bfloat16", "mixed_float16").

    Raises:
        ConfigError: a factory that cannot be imported or does not return a keras.Model, a
            `recompute` name that is no layer of the model, or `normalize` without training data.
    """
    import keras

    keras.utils.set_random_seed(seed)
    if config.factory:
        return _call_factory(config, input_shape, num_classes, task)
    model = _build_builtin(config, input_shape, num_classes, input_name, input_dtype, train_inputs, precision, task)
    return with_recompute(model, config.recompute)


def with_recompute(model, recompute):
    """`model` with the layers named in `recompute` (`model.recompute`) wrapped in `Recompute` (same weights).

    Raises:
        ConfigError: a name that is no layer of the model.
    """
    import keras

    if not recompute:
        return model
    recompute = tuple(recompute)
    names = [layer.name for layer in model.layers]
    missing = sorted(set(recompute) - set(names))
    if missing:
        raise ConfigError(f"model.recompute: no layer named {missing}; layers: {names}")
    wrapper = _recompute_class()

    def clone(layer):
        return wrapper(layer.__class__.from_config(layer.get_config())) if layer.name in recompute else \
            layer.__class__.from_config(layer.get_config())

    wrapped = keras.models.clone_model(model, clone_function=clone)
    _copy_state(model, wrapped)
    return wrapped


def _copy_state(source, target) -> None:
    """Copy weights and the dropout RNG states (not weights in Keras) layer by layer, so a clone
    trains exactly like its source.
    """
    target.set_weights(source.get_weights())
    for a, b in zip(source.layers, target.layers):
        a, b = getattr(a, "inner", a), getattr(b, "inner", b)
        if getattr(a, "seed_generator", None) is not None and getattr(b, "seed_generator", None) is not None:
            b.seed_generator.state.assign(a.seed_generator.state.value)


def without_recompute(model):
    """A copy of `model` with every `Recompute` wrapper replaced by its inner layer (same weights,
    same layer names): the model export sees. Models without wrappers are returned as they are.
    """
    import keras

    wrapper = _recompute_class()
    if not any(isinstance(layer, wrapper) for layer in model.layers):
        return model

    def clone(layer):
        inner = layer.inner if isinstance(layer, wrapper) else layer
        return inner.__class__.from_config(inner.get_config())

    plain = keras.models.clone_model(model, clone_function=clone)
    _copy_state(model, plain)
    return plain


_RECOMPUTE = []


def _recompute_class():
    """The `Recompute` layer class (defined on first use so importing this module needs no Keras)."""
    if _RECOMPUTE:
        return _RECOMPUTE[0]
    import keras
    import tensorflow as tf

    class Recompute(keras.layers.Layer):
        """Wraps one layer; in training its forward pass is recomputed in the backward pass
        (`tf.recompute_grad`), in inference it is the inner layer unchanged. Takes the inner layer's name.
        """

        def __init__(self, inner, **kwargs):
            kwargs.setdefault("name", inner.name)
            kwargs.setdefault("dtype", inner.dtype_policy)
            super().__init__(**kwargs)
            self.inner = inner

        def build(self, input_shape):
            self.inner.build(input_shape)

        def call(self, inputs, training=None):
            if not training:
                return self.inner(inputs)
            return tf.recompute_grad(lambda x: self.inner(x))(inputs)

        def compute_output_shape(self, input_shape):
            return self.inner.compute_output_shape(input_shape)

    _RECOMPUTE.append(Recompute)
    return Recompute


def _build_builtin(config, input_shape, num_classes, input_name, input_dtype, train_inputs, precision,
                   task="classification"):
    import keras

    inputs = keras.Input(shape=input_shape, name=input_name, dtype=input_dtype)
    hidden = inputs
    if config.normalize:
        if config.kind == "text":
            raise ConfigError("model.normalize = true: model.kind = 'text' takes token ids, which are not "
                              "quantities to normalize")
        if train_inputs is None:
            raise ConfigError("model.normalize = true: needs the train split's inputs to adapt on")
        normalize = keras.layers.Normalization(axis=-1, name="normalize", dtype="float32")
        normalize.adapt(np.asarray(train_inputs, np.float32))
        hidden = normalize(hidden)
    if config.kind == "cnn":
        if len(input_shape) != 3:
            raise ConfigError(f"model.kind = 'cnn' needs [height, width, channels] inputs; got shape {input_shape}")
        hidden = _cnn_body(config, hidden, input_shape, precision)
    elif config.kind == "mlp":
        hidden = _mlp_body(config, hidden, precision)
    else:
        if len(input_shape) != 1:
            raise ConfigError(f"model.kind = 'text' needs token ids [sequence_length]; got shape {input_shape}")
        hidden = _text_body(config, hidden, precision)
    if config.dropout > 0:
        hidden = keras.layers.Dropout(config.dropout, name="dropout", dtype=precision)(hidden)
    from tfship.pipeline.training.multi_input import _head

    return keras.Model(inputs, _head(hidden, task, num_classes), name=f"tfship_{config.kind}")


def _accepts(function, name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _call_factory(config: ModelSection, input_shape: tuple[int, ...] | None, num_classes: int,
                  task: str = "classification", specs=None):
    """Call `model.factory`: one input as f(input_shape=, num_classes=, **factory_args) (plus task= when the
    function accepts it); named inputs as f(specs=, task=, num_classes=, **factory_args).
    """
    import keras

    assert config.factory is not None  # called for a config naming model.factory only
    function = import_function(config.factory, f"model.factory = {config.factory!r}")
    if specs is not None:
        model = function(specs=tuple(specs), task=task, num_classes=num_classes, **config.factory_args)
    else:
        assert input_shape is not None  # one input: the caller passes its shape
        extra = {"task": task} if _accepts(function, "task") and "task" not in config.factory_args else {}
        model = function(input_shape=tuple(input_shape), num_classes=num_classes, **extra, **config.factory_args)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model.factory = {config.factory!r} returned {type(model).__name__}, not a keras.Model")
    return model


def build_task_model(config, splits):
    """The model of a whole `PipelineConfig` over `splits` (`pipeline.data.splits.load_splits`), any kind and task.

    * cnn, mlp, text, a one-input factory: input `splits.input_name`, shape and dtype of the train split's
      sample [B, ...]; tabular, recommender, a factory over named data: one input per `splits.specs`
      (float32 [B, *shape], int64 ids, raw strings [B] looked up by a `StringLookup` inside the model);
    * head per task: classification `logits` float32 [B, len(class_names)]; binary `probability` sigmoid
      float32 [B, 1]; regression `prediction` float32 [B, 1];
    * `train.mixed_precision` is the dtype policy of the built-in layers (heads float32), `model.normalize` a
      `Normalization` adapted on the train sample (cnn, mlp: the input; tabular, recommender: each dense
      input), `model.recompute` wraps the named layers (`Recompute`), `run.seed` seeds the weights;
    * `model.factory`: f(input_shape=, num_classes=, **factory_args) for one input (task= too when it
      accepts it), f(specs=, task=, num_classes=, **factory_args) for named inputs (`model.kind = "tabular"`
      or "recommender" with a factory: the data is read as named inputs and the factory builds the model);
      `num_classes` is the class count for classification, 1 otherwise.

    Raises:
        ConfigError: a setting that means nothing for the kind (normalize on a text model or a factory), a
            factory that does not return a keras.Model, a `recompute` name that is no layer, a shape the kind
            cannot take. ValueError: a recommender without its role inputs.
    """
    import keras

    from tfship.pipeline.training import multi_input

    model, task, seed = config.model, splits.task, config.run.seed
    precision = config.train.mixed_precision
    num_classes = len(splits.class_names) if task == "classification" else 1
    if model.normalize and model.factory:
        raise ConfigError(f"model.normalize = true: model.factory = {model.factory!r} builds its own layers; "
                          "normalize inside the factory")
    keras.utils.set_random_seed(seed)
    if splits.specs:
        if model.factory:
            return with_recompute(_call_factory(model, None, num_classes, task, splits.specs), model.recompute)
        if model.kind not in ("tabular", "recommender"):
            raise ConfigError(f"model.kind = {model.kind!r}: takes one input; the data has named inputs "
                              f"{[s.name for s in splits.specs]}: use model.kind = 'tabular'")
        sample = splits.train.images if model.normalize else None
        build = multi_input.tabular if model.kind == "tabular" else multi_input.recommender
        kwargs = {"hidden_units": model.hidden_units, "dropout": model.dropout, "seed": seed,
                  "embedding_dim": model.embedding_dim, "normalize_on": sample, "policy": precision}
        return with_recompute(build(splits.specs, task, num_classes, **kwargs), model.recompute)
    if model.kind in ("tabular", "recommender"):
        raise ConfigError(f"model.kind = {model.kind!r}: the data has no named inputs")
    sample = np.asarray(splits.train.images)
    return build_model(model, tuple(sample.shape[1:]), num_classes, seed, input_name=splits.input_name,
                       input_dtype=str(sample.dtype), train_inputs=sample if model.normalize else None,
                       precision=precision, task=task)
