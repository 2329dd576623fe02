"""Grouped convolutions rewritten into ops every TensorFlow CPU build runs (protos only, no TensorFlow import).

Keras 3 on TensorFlow computes a grouped `Conv2D` (`groups > 1`: ConvNeXt's and MobileViT's depthwise
convolutions) as one `Conv2D` op whose filter has fewer input channels than its input, inside a
`tf.function(jit_compile=True)` (`_conv_xla`), because TensorFlow's CPU kernels do not all handle it.
`signatures.forward_only` removes that must-compile mark (a server without the XLA JIT cannot run it), and
the plain `Conv2D` then meets Grappler's remapper, which fuses it with the layer's `BiasAdd` into
`_FusedConv2D`. Without oneDNN (TensorFlow's default on CPUs other than recent Intel ones, e.g. AMD EPYC,
and on arm64) that kernel refuses: "Fused conv implementation does not support grouped convolutions for now".

So each grouped `Conv2D` in a function that was marked must-compile is replaced by the same computation in
ops with a kernel on every build, keeping its node name (its consumers read `<name>:output:0` unchanged):

* depthwise (filter `[kh, kw, 1, C_out]` over `C` input channels, `C_out = C · m`): a
  `DepthwiseConv2dNative` over the filter reshaped to `[kh, kw, C, m]` — output channel `c·m + j` is input
  channel `c` times multiplier `j` in both;
* other groups (`G = C / C_in_group`): `Split` of the input and of the filter into `G`, `G` `Conv2D`s and a
  `ConcatV2` of their outputs on the channel axis.

Shapes come from the `_output_shapes` attributes TensorFlow writes into a saved function. A convolution
whose channel counts are not known there, or in `NCHW`, is left as it was.
"""

from __future__ import annotations

CONV_ATTRS = ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations")


def _dims(shape) -> list[int] | None:
    if shape.unknown_rank:
        return None
    return [d.size for d in shape.dim]


def _shape_of(function, tensor: str) -> list[int] | None:
    """The static shape TensorFlow recorded for `tensor` (`node:output:i` or an argument name) in `function`."""
    parts = tensor.split(":")
    if len(parts) == 1:
        for index, arg in enumerate(function.signature.input_arg):
            if arg.name == tensor and index in function.arg_attr:
                shapes = function.arg_attr[index].attr.get("_output_shapes")
                return _dims(shapes.list.shape[0]) if shapes is not None and shapes.list.shape else None
        return None
    node = next((n for n in function.node_def if n.name == parts[0]), None)
    shapes = node.attr.get("_output_shapes") if node is not None else None
    index = int(parts[2]) if len(parts) == 3 else 0
    if shapes is None or len(shapes.list.shape) <= index:
        return None
    return _dims(shapes.list.shape[index])


def _const_int32(node, values: list[int]) -> None:
    node.op = "Const"
    node.attr["dtype"].type = 3  # DT_INT32
    node.attr["value"].tensor.dtype = 3
    node.attr["value"].tensor.tensor_shape.dim.add().size = len(values)
    node.attr["value"].tensor.int_val.extend(values)


def _scalar_int32(node, value: int) -> None:
    node.op = "Const"
    node.attr["dtype"].type = 3
    node.attr["value"].tensor.dtype = 3
    node.attr["value"].tensor.int_val.append(value)


def _copy_conv_attrs(source, target, op: str) -> None:
    target.op = op
    for key in CONV_ATTRS:
        if key in source.attr:
            target.attr[key].CopyFrom(source.attr[key])
    target.device = source.device


def _depthwise(function, conv, kernel_shape: list[int], channels: int) -> list:
    kh, kw, _, out = kernel_shape
    shape = function.node_def.add()
    shape.name = f"{conv.name}/grouped_as_depthwise/filter_shape"
    _const_int32(shape, [kh, kw, channels, out // channels])
    reshape = function.node_def.add()
    reshape.name = f"{conv.name}/grouped_as_depthwise/filter"
    reshape.op = "Reshape"
    reshape.input.extend([conv.input[1], f"{shape.name}:output:0"])
    reshape.attr["T"].CopyFrom(conv.attr["T"])
    reshape.attr["Tshape"].type = 3
    depthwise = type(conv)()
    depthwise.name = conv.name
    _copy_conv_attrs(conv, depthwise, "DepthwiseConv2dNative")
    depthwise.input.extend([conv.input[0], f"{reshape.name}:output:0", *[i for i in conv.input[2:] if i[0] == "^"]])
    return [depthwise]


def _split_concat(function, conv, groups: int) -> list:
    axis = function.node_def.add()
    axis.name = f"{conv.name}/grouped_split/axis"
    _scalar_int32(axis, 3)
    splits = []
    for what, tensor in (("input", conv.input[0]), ("filter", conv.input[1])):
        split = function.node_def.add()
        split.name = f"{conv.name}/grouped_split/{what}"
        split.op = "Split"
        split.input.extend([f"{axis.name}:output:0", tensor])
        split.attr["T"].CopyFrom(conv.attr["T"])
        split.attr["num_split"].i = groups
        splits.append(split.name)
    parts = []
    for group in range(groups):
        part = function.node_def.add()
        part.name = f"{conv.name}/grouped_split/conv_{group}"
        _copy_conv_attrs(conv, part, "Conv2D")
        part.input.extend([f"{splits[0]}:output:{group}", f"{splits[1]}:output:{group}"])
        parts.append(part.name)
    concat = type(conv)()
    concat.name = conv.name
    concat.op = "ConcatV2"
    concat.input.extend([f"{p}:output:0" for p in parts] + [f"{axis.name}:output:0"])
    concat.input.extend(i for i in conv.input[2:] if i[0] == "^")
    concat.attr["T"].CopyFrom(conv.attr["T"])
    concat.attr["N"].i = groups
    concat.attr["Tidx"].type = 3
    return [concat]


def _depthwise_fits(conv) -> bool:
    """DepthwiseConv2dNative needs equal H/W strides and no stride > 1 together with a dilation > 1."""
    strides = list(conv.attr["strides"].list.i) if "strides" in conv.attr else [1, 1, 1, 1]
    dilations = list(conv.attr["dilations"].list.i) if "dilations" in conv.attr else [1, 1, 1, 1]
    if strides[1] != strides[2]:
        return False
    return not (max(strides[1:3]) > 1 and max(dilations[1:3]) > 1)


def rewrite_grouped_convolutions(function) -> list[str]:
    """Replace each grouped NHWC `Conv2D` in `function` (a FunctionDef) in place; returns the rewritten node names."""
    rewritten = []
    for index, conv in enumerate(list(function.node_def)):
        if conv.op != "Conv2D" or len(conv.input) < 2:
            continue
        if "data_format" in conv.attr and conv.attr["data_format"].s not in (b"", b"NHWC"):
            continue
        inputs, kernel = _shape_of(function, conv.input[0]), _shape_of(function, conv.input[1])
        if not inputs or not kernel or len(inputs) != 4 or len(kernel) != 4 or min(kernel) <= 0:
            continue
        channels, per_group = inputs[3], kernel[2]
        if channels <= 0 or channels == per_group or channels % per_group or kernel[3] % (channels // per_group):
            continue
        if per_group == 1 and _depthwise_fits(conv):
            (replacement,) = _depthwise(function, conv, kernel, channels)
        else:
            (replacement,) = _split_concat(function, conv, channels // per_group)
        if "_output_shapes" in conv.attr:
            replacement.attr["_output_shapes"].CopyFrom(conv.attr["_output_shapes"])
        function.node_def[index].CopyFrom(replacement)
        rewritten.append(conv.name)
    return rewritten
