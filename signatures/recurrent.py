"""TFLite recipes for recurrent Keras layers (LSTM, GRU, SimpleRNN, any `keras.layers.RNN`).

Keras 3 runs a recurrent layer as a `tf.while_loop` over a `TensorList`. With a dynamic batch dimension the
TFLite converter cannot lower those TensorList ops to builtins ("Lowering tensor list ops is failed") and
asks for Flex, which LiteRT (`ai_edge_litert`) cannot run. Known recipes, tried in this order by the
convert stage (`pipeline.conversion.convert`), each recorded in `convert.json` as the variant's `recipe`:

1. `default`: the SavedModel as exported (works when the graph has no recurrent loop).
2. `unrolled`: the same weights in a clone whose recurrent layers have `unroll=True` (Keras' own switch):
   a fixed number of time steps becomes straight-line ops, the batch stays dynamic, the signature is the
   same. Needs a static time dimension. Written here as a second SavedModel (`unrolled_source`), used only
   as the TFLite converter's input; the parity gate compares the TFLite file with the published SavedModel.
3. `fixed_batch` (tried inside the conversion worker, `tflite.worker`, when the default fails on TensorList
   lowering): the signature traced at batch 1, so the converter knows every shape. A batch-1 file cannot serve
   batched requests, so it is only reported (the reason says whether it converts) and never kept.

TFLite's fused-LSTM path (`UnidirectionalSequenceLSTM`) is taken by the converter only for functions that
carry TF2 Keras' `experimental_implements` LSTM annotation; Keras 3 layers carry none, so it is named in
the reason, not attempted.
"""

from __future__ import annotations

from pathlib import Path


def recurrent_layers(model) -> dict[str, int | None]:
    """{layer name: time steps (None when dynamic)} for every `keras.layers.RNN` in `model` (LSTM, GRU, ...).

    The steps are read from the sequence the layer is called on: a masked layer (after
    `Embedding(mask_zero=True)`) has `[sequence, mask]` as its `input`, and the sequence is the first.
    """
    import keras

    found = {}
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.RNN):
            try:
                given = layer.input
            except (AttributeError, ValueError):  # never called in a functional graph
                given = None
            first = keras.tree.flatten(given)[0] if given is not None else None
            shape = tuple(getattr(first, "shape", None) or getattr(layer, "input_shape", None) or (None, None))
            found[layer.name] = shape[1] if len(shape) > 1 else None
    return found


def unrolled_copy(model):
    """A clone of `model` with `unroll=True` on every recurrent layer and the same weights, or None when
    `model` has no recurrent layer.

    Raises:
        ValueError: a recurrent layer has a dynamic time dimension (unrolling needs a fixed number of
            steps), naming it; or the clone cannot be built (the cause is kept).
    """
    import keras

    layers = recurrent_layers(model)
    if not layers:
        return None
    dynamic = [name for name, steps in layers.items() if steps is None]
    if dynamic:
        raise ValueError(f"recurrent layer(s) {dynamic} have a dynamic time dimension; unrolling needs fixed steps")

    def rebuild(layer):
        if isinstance(layer, keras.layers.RNN):
            return layer.__class__.from_config({**layer.get_config(), "unroll": True})
        return layer.__class__.from_config(layer.get_config())

    clone = keras.models.clone_model(model, clone_function=rebuild)
    clone.set_weights(model.get_weights())
    return clone


def write_unrolled_source(model, contract, folder: Path, build_module=None) -> dict:
    """Export `model`'s unrolled copy with `contract`'s signature to `folder` (for the TFLite converter only).

    `build_module(clone)` makes the `tf.Module` to save (default `keras_export.build_keras_module(clone,
    contract)`), so the copy has exactly the signature the published SavedModel has.

    Returns:
        A JSON-ready record: `{"recurrent_layers": {...}, "unrolled_source": str | None, "reason": str}`;
        no folder is written (and an old one is removed) when the model has no recurrent layer or cannot be
        unrolled (the reason says why).
    """
    import shutil

    from tfship.signatures.export import export_saved_model
    from tfship.signatures.keras_export import build_keras_module

    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    layers = recurrent_layers(model)
    if not layers:
        return {"recurrent_layers": {}, "unrolled_source": None, "reason": ""}
    try:
        clone = unrolled_copy(model)
        module = build_module(clone) if build_module else build_keras_module(clone, contract)
        export_saved_model(module, contract, folder)
    except Exception as err:  # noqa: BLE001 - Keras config round-trips and tracing raise many types
        return {"recurrent_layers": layers, "unrolled_source": None,
                "reason": f"no unrolled copy: {type(err).__name__}: {err}"}
    return {"recurrent_layers": layers, "unrolled_source": str(folder), "reason": ""}
