"""Request validation against the signature contract (`core.contract.Signature`).

Validation happens in the data plane before any backend sees the request, so every backend refuses
bad requests with the same INVALID_ARGUMENT message. How much is checked depends on the backend:

* backends that feed tensors into the model by name (`Runtime.model_judges_shapes`: the SavedModel backend,
  and TFLite files without signature runners) get TF Serving's checks only: input names and dtypes. Shapes
  are the model's to judge, as in TF Serving (a `[3]` tensor fed to an input declared `[-1, 1]` of a
  half-plus-two answers `[3]` values); what the model refuses comes back from the backend as
  INVALID_ARGUMENT (`serving.runtimes.base.input_rejected`).
* the others (ONNX Runtime, LiteRT signature runners) also get rank, fixed dimensions and batch agreement checked, which
  their runtimes need; so does every request of the Open Inference Protocol (`InferenceRequest.check_shapes`),
  whose shapes are declared by the protocol.

TF Serving's --enable_signature_method_name_check for Classify/Regress lives with their rules
(`serving.dataplane.inference.output_aliases`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Collection, Mapping

import numpy as np

from tfship.core.contract import PREDICT_METHOD, Signature
from tfship.core.dtypes import dtype_name
from tfship.core.echo import clip, echo, echo_list
from tfship.core.errors import InvalidRequestError, ModelError, TfshipError, UnimplementedError
from tfship.serving.dataplane.memory import estimate_request_bytes
from tfship.serving.runtimes.base import ModelInputError, Rows

# Declared ranks from which a wrong rank is refused even where the model judges shapes (the SavedModel
# backend). TensorFlow's oneDNN kernels (on by default on x86) abort the whole process on a wrong-rank input to a
# convolution or a pooling op (rank 4/5: `Check failed ... MklDnnConvUtil` for a rank-2 tensor into a Conv2D)
# instead of refusing it. Turning oneDNN off is no way out: without it, TensorFlow cannot run the fused grouped
# convolutions of a ConvNeXt ("Fused conv implementation does not support grouped convolutions"). Ranks below
# keep TF Serving's leniency (a `[3]` tensor into half_plus_two's `[-1, 1]` input is answered).
KERNEL_RANK = 3
_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}  # the others: same names


def check_input_names(signature: Signature, names: Collection[str]) -> None:
    """Refuse input names that are not exactly `signature`'s, as TF Serving does before converting any tensor
    (predict_util.cc: `VerifyRequestInputsSize` comes before `TensorFromProto`): the gRPC decoders call this on the
    request's names before decoding a value, so 125,000 unexpected 1x8x8x1 inputs (a 37 MB request) are refused
    in milliseconds instead of after decoding all of them.

    Args:
        signature: the contract.
        names: the input names the request sent (a mapping's keys or a protobuf map).

    Raises:
        InvalidRequestError: a signature that takes no inputs (not callable by Predict), or missing or extra
            inputs; the message names them (client names cut, `core.echo`) and the expected specs.
    """
    if signature.method_name != PREDICT_METHOD and not signature.inputs:
        raise InvalidRequestError(f"signature {signature.name!r} takes no inputs and cannot be called by Predict")
    if len(names) == len(signature.inputs) and all(name in names for name in signature.inputs):
        return  # the common case: the declared names, no sets built
    sent = set(names)
    missing = sorted(set(signature.inputs) - sent)
    extra = sorted(sent - set(signature.inputs))
    if missing or extra:
        expected = ", ".join(f"{k}: {s.describe()}" for k, s in sorted(signature.inputs.items()))
        parts = (([f"missing input(s) {missing}"] if missing else [])
                 + ([f"unexpected input(s) {echo_list(extra)}"] if extra else []))
        raise InvalidRequestError(f"signature {signature.name!r}: {'; '.join(parts)}; expected inputs: {{{expected}}} "
                                  f"({_tfs_size_mismatch(signature, sent, missing, extra)})")


def describe_array(array: np.ndarray) -> str:
    """Human form of a received array, e.g. `float64[2,8,8]`."""
    return f"{dtype_name(array.dtype)}[{','.join(str(d) for d in array.shape)}]"


def validate_inputs(signature: Signature, inputs: Mapping[str, np.ndarray], shapes: bool = True,
                    fixed_dims: bool = True, ranks: bool = False) -> None:
    """Check names, dtypes and (with `shapes`) ranks, fixed dimensions and batch agreement of `inputs`.

    Args:
        signature: the contract.
        inputs: alias -> decoded array.
        shapes: False for backends whose model judges shapes: names and dtypes as TF Serving checks, the rank
            from `KERNEL_RANK` up, and (with `fixed_dims`) the fixed dimensions of an input sent at its declared
            rank.
        fixed_dims: with `shapes` False, refuse an input of the declared rank whose size differs from a fixed
            dimension (a `[-1, 20]` input sent as `[B, 30]`, which a mean pooling would silently answer). TF
            Serving feeds it to the graph; `--lenient-fixed-dimensions` (False here) does so too. A different
            rank below `KERNEL_RANK` stays the model's to judge either way (TF Serving's `[3]` into `[-1, 1]`),
            unless `ranks`.
        ranks: with `shapes` False, refuse any rank other than the declared one before the model runs, naming the
            input and its declared shape (a version tfship published, `Runtime.declares_ranks`: scalars sent where
            `[?,1]` is declared would otherwise reach TensorFlow and come back as `In[0] is not a matrix`).

    Raises:
        InvalidRequestError: missing or extra input, wrong dtype, wrong rank or a fixed dimension that
            differs; the message names the input, the expected spec and what was received.
    """
    check_input_names(signature, inputs)
    for index, (key, spec) in enumerate(sorted(signature.inputs.items())):
        array = inputs[key]
        if dtype_name(array.dtype) == spec.dtype and _shape_fits(spec.shape, array.shape):
            continue  # the common case: no message built
        received = describe_array(array)
        if dtype_name(array.dtype) != spec.dtype:
            raise InvalidRequestError(
                f"input {echo(key)} of signature {signature.name!r}: expected dtype {spec.dtype} "
                f"({spec.describe()}), received {received} (Expects arg[{index}] to be {tf_type_name(spec.dtype)} "
                f"but {tf_type_name(dtype_name(array.dtype))} is provided)")
        if spec.shape is None or (not shapes and not ranks and len(spec.shape) < KERNEL_RANK
                                  and array.ndim != len(spec.shape)):
            continue
        if array.ndim != len(spec.shape):
            raise InvalidRequestError(
                f"input {echo(key)} of signature {signature.name!r}: expected rank {len(spec.shape)} "
                f"(declared shape {spec.describe()}), received rank {array.ndim} ({received}); refused before "
                "the model runs")
        if not (shapes or fixed_dims):
            continue
        for axis, (want, got) in enumerate(zip(spec.shape, array.shape)):
            if want is not None and want != got:
                raise InvalidRequestError(
                    f"input {echo(key)} of signature {signature.name!r}: dimension {axis} must be {want} "
                    f"(declared shape {spec.describe()}), received {received}")
    if shapes:
        _check_batch(signature, inputs)


def nonconforming_input(signature: Signature, inputs: Mapping[str, np.ndarray]) -> str | None:
    """What the first of `inputs` that does not conform to `signature` is, or None when all conform.

    An input conforms when its dtype is the declared one and, where the rank is declared, its rank is the declared
    rank and every fixed dimension equals the declared size (`[2,2,2,8]` does not conform to `[?,8,8,1]`; `[3]`
    does not conform to `[?,1]`, which TF Serving still feeds to the graph). The data plane uses it to tell a
    client's fault from the model's when a backend fails: a graph that fails on a nonconforming input (oneDNN's
    `could not create a descriptor for a pooling forward propagation primitive` for a `[1,1,1,1]` image) was fed
    what the signature never promised to take (INVALID_ARGUMENT); a conforming input that fails is the model's
    (INTERNAL).

    Returns:
        e.g. `input 'image' declared float32[?,8,8,1], received float32[2,2,2,8]`.
    """
    for alias, array in inputs.items():
        spec = signature.inputs.get(alias)
        if spec is None:
            continue
        got = np.shape(array)
        dtype = dtype_name(np.asarray(array).dtype)
        fits = spec.shape is None or (len(spec.shape) == len(got) and all(
            want is None or want == size for want, size in zip(spec.shape, got)))
        if not fits or dtype != spec.dtype:
            return (f"input {alias!r} declared {spec.describe()}, received "
                    f"{dtype}[{','.join(str(d) for d in got)}]")
    return None


async def judged(call: Awaitable[dict], signature: Signature, inputs: Mapping[str, np.ndarray], backend: str) -> dict:
    """Await a backend's `call`; when it fails on an input that does not conform to `signature`
    (`nonconforming_input`), the fault is the client's: `InvalidRequestError` naming the input, the declared shape
    and what was sent, with the backend's reason. A conforming input that fails re-raises as is (INTERNAL with
    an incident), as do tfship's own errors (already classified); a backend's `ModelInputError` on a
    nonconforming input gets the declared shape and what was sent added. An op the backend cannot run
    (`UnimplementedError`: a `[2,2,2,8]` image into a `[?,8,8,1]` convolution asks TensorFlow without oneDNN
    for a grouped convolution it cannot fuse) is the client's fault on a nonconforming input, and stays
    UNIMPLEMENTED on a conforming one. So is a failure with the model's own status (`ModelError`): oneDNN's
    max-pooling kernel on some CPUs answers a `[1,8,8,2]` image into a `[?,8,8,1]` model with TensorFlow's
    AbortedError ("could not create a descriptor"), where others raise InvalidArgumentError; on a nonconforming
    input both are the client's fault, on a conforming one the model's status stands (TF Serving's).
    """
    try:
        return await call
    except Exception as err:
        fault = refault(err, signature, inputs, backend)
        if fault is None:
            raise
        raise fault from err


def refault(err: Exception, signature: Signature, inputs: Mapping[str, np.ndarray], backend: str) -> Exception | None:
    """`judged`'s verdict on a backend's failure `err`, for a caller that awaits the call itself (the data plane:
    no coroutine per request): the error to raise instead (from `err`), or None to re-raise `err` as it is.
    """
    if isinstance(err, TfshipError) and not isinstance(err, ModelInputError | UnimplementedError | ModelError):
        return None  # tfship's own errors are classified already
    problem = nonconforming_input(signature, inputs)
    if problem is None:
        return None
    if isinstance(err, ModelInputError):  # the backend refused a value: add the declared shape where it differs
        return ModelInputError(f"{err} ({problem})")
    return _not_conforming(backend, signature, problem, err)


def _not_conforming(backend: str, signature: Signature, problem: str, err: Exception) -> InvalidRequestError:
    return InvalidRequestError(f"the {backend} backend failed on an input that does not conform to signature "
                               f"{signature.name!r}: {problem}; send the declared shape and dtype "
                               f"({clip(str(err).strip())})")


def tf_type_name(dtype: str) -> str:
    """TensorFlow's DataTypeString for a contract dtype name (`float32` -> `float`), as its messages say it."""
    return _TF_TYPE_NAMES.get(dtype, dtype)


def _names(names) -> str:
    """Client-sent names joined as TF Serving joins them, each clipped, at most 8 (then `,...`)."""
    names = sorted(names)
    return ",".join(clip(n, 40) for n in names[:8]) + (",..." if len(names) > 8 else "")


def _tfs_size_mismatch(signature: Signature, inputs: Collection[str], missing: list, extra: list) -> str:
    """TF Serving's words for inputs that are not the signature's (predict_util.cc VerifyRequestInputsSize)."""
    return (f"input size does not match signature: {len(inputs)}!={len(signature.inputs)} len({{{_names(inputs)}}}) "
            f"!= len({{{_names(signature.inputs)}}}). Sent extra: {{{_names(extra)}}}. "
            f"Missing but required: {{{_names(missing)}}}.")


def _shape_fits(want: tuple[int | None, ...] | None, got: tuple[int, ...]) -> bool:
    if want is None:
        return True
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        if w is not None and w != g:
            return False
    return True


def _check_batch(signature: Signature, inputs: Mapping[str, np.ndarray]) -> None:
    batched = {k: a.shape[0] for k, a in inputs.items()
               if a.ndim > 0 and (shape := signature.inputs[k].shape) and shape[0] is None}
    if len(set(batched.values())) > 1:
        raise InvalidRequestError(f"signature {signature.name!r}: inputs disagree on batch size: {batched}")


def batch_size(signature: Signature, inputs: Mapping[str, np.ndarray]) -> int | None:
    """Batch size (dim 0) of a validated request, or None when no input has a batch dimension."""
    for key, array in inputs.items():
        spec = signature.inputs.get(key)
        if spec and spec.shape and spec.shape[0] is None and array.ndim > 0:
            return int(array.shape[0])
    return None


class RequestChecks:
    """`validate_inputs`, the request's `Rows` and `estimate_request_bytes`, remembered by its layout.

    The three depend only on the signature and on each input's alias, dtype and shape, so a layout that
    passed once passes again: the data plane checks each new layout in full and later requests of the same
    layout with one dict lookup (the per-request path of issue 14). At most `max_entries` layouts are kept
    (the memo is emptied when full); entries hold their signature, so a recycled `id()` never matches.
    """

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self.lenient_fixed_dimensions = False  # --lenient-fixed-dimensions: `validate_inputs(fixed_dims=False)`
        self._known: dict[tuple, tuple[Signature, Rows, int]] = {}

    def check(self, signature: Signature, inputs: Mapping[str, np.ndarray],
              shapes: bool = True, fixed_dims: bool = True, ranks: bool = False) -> tuple[Rows, int]:
        """(rows, bytes held) of a valid request: its `Rows` (`batch` is `batch_size`, counted here once per
        request and passed on to the runtime) and `estimate_request_bytes`.

        `shapes`, `fixed_dims`, `ranks`: as `validate_inputs` (part of the remembered layout); `fixed_dims` and
        `ranks` are off with `lenient_fixed_dimensions` (TF Serving's leniency).

        Raises:
            InvalidRequestError: as `validate_inputs` (never remembered).
        """
        fixed_dims = fixed_dims and not self.lenient_fixed_dimensions
        ranks = ranks and not self.lenient_fixed_dimensions
        key = (id(signature), shapes, fixed_dims, ranks,
               *[(alias, array.dtype, array.shape) for alias, array in inputs.items()])
        known = self._known.get(key)
        if known is not None and known[0] is signature:
            return known[1], known[2]
        validate_inputs(signature, inputs, shapes, fixed_dims, ranks)
        rows = Rows.of(inputs, batch_size(signature, inputs))
        held = estimate_request_bytes(signature, inputs, rows.batch)
        if len(self._known) >= self.max_entries:
            self._known.clear()
        self._known[key] = (signature, rows, held)
        return rows, held
