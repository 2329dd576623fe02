"""tf.Example inputs and results of Classify, Regress and MultiInference: protobuf and REST JSON, no TensorFlow.

Requests (`tensorflow.serving.Input`, `input.proto`): `example_list` (one serialized `tensorflow.Example` per
example) or `example_list_with_context` (each example's bytes are the context's bytes followed by the
example's: protobuf merge semantics, so a feature in the example replaces the context's of that name, as
TF Serving's `InputToSerializedExampleTensor` builds them). REST bodies (`g3doc/api_rest.md`): `"examples"`
(a non-empty list of objects feature name -> value or list of values) and optional `"context"` (one such
object); a JSON string is a bytes value, `{"b64": "..."}` binary bytes, a whole number an int64, a number with
a fraction or exponent a float, `true` / `false` int64 1 / 0, following `util/json_tensor.cc`.

Answers: `ClassificationResponse` / `RegressionResponse` / `MultiInferenceResponse` with `model_spec` naming
the version and signature that served them, and REST `{"results": [[[label, score], ...], ...]}` (classify)
or `{"results": [value, ...]}` (regress).
"""

from __future__ import annotations

import binascii
import math
import time

import numpy as np

from tfship.core import protocol
from tfship.core.echo import clip
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane.inference import (
    Classification,
    ExampleMethod,
    ExamplesRequest,
    ExamplesResponse,
    ExampleTask,
    Regression,
)
from tfship.serving.dataplane.json_numbers import OutOfRangeNumber
from tfship.serving.dataplane.types import ModelRef
from tfship.serving.tfs.converters import model_ref
from tfship.serving.tfs.json_write import RawJson, decimal_texts
from tfship.serving.tfs.rest_json import b64_decode, debug_string, json_type

Example = protocol.message_class("tensorflow.Example")
Input = protocol.message_class("tensorflow.serving.Input")
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_NAME_CHARS = 100


def serialized_examples(input_proto) -> np.ndarray:
    """A `tensorflow.serving.Input` -> object array [n] of serialized `tensorflow.Example` bytes; n may be 0
    (the data plane refuses an empty input after the signature checks, in TF Serving's order).
    """
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        encoded = [example.SerializeToString() for example in input_proto.example_list.examples]
    elif kind == "example_list_with_context":
        both = input_proto.example_list_with_context
        context = both.context.SerializeToString()
        encoded = [context + example.SerializeToString() for example in both.examples]
    else:
        encoded = []
    array = np.empty(len(encoded), dtype=object)
    array[:] = encoded
    return array


def _deadline(time_remaining: float | None) -> float | None:
    return None if time_remaining is None else time.monotonic() + time_remaining


def _signature(spec) -> str:
    return spec.signature_name or "serving_default"


def classification_request(proto, time_remaining: float | None = None) -> ExamplesRequest:
    """`ClassificationRequest` -> `ExamplesRequest` with one classify task; raises as `model_ref`."""
    return ExamplesRequest(model_ref(proto.model_spec), (ExampleTask(ExampleMethod.CLASSIFY, _signature(
        proto.model_spec)),), serialized_examples(proto.input), _deadline(time_remaining), "classify")


def regression_request(proto, time_remaining: float | None = None) -> ExamplesRequest:
    """`RegressionRequest` -> `ExamplesRequest` with one regress task; raises as `model_ref`."""
    return ExamplesRequest(model_ref(proto.model_spec), (ExampleTask(ExampleMethod.REGRESS, _signature(
        proto.model_spec)),), serialized_examples(proto.input), _deadline(time_remaining), "regress")


def multi_inference_request(proto, time_remaining: float | None = None) -> ExamplesRequest:
    """`MultiInferenceRequest` -> `ExamplesRequest`: one task per `InferenceTask`, on the first task's model.

    Raises:
        InvalidRequestError: no task, a task naming no model or another model than the first.
        UnimplementedError: a task whose method_name is neither classify nor regress.
    """
    tasks, first = [], None
    for task in proto.tasks:
        spec = task.model_spec
        if not spec.name:
            raise InvalidRequestError("Found ModelSpec with an empty model name.")
        if first is None:
            first = spec
        elif spec.name != first.name:
            raise InvalidRequestError("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        tasks.append(ExampleTask(ExampleMethod.of_method_name(task.method_name), _signature(spec)))
    if first is None:
        raise InvalidRequestError("MultiInferenceRequest has no tasks: add one task per signature to run")
    return ExamplesRequest(model_ref(first), tuple(tasks), serialized_examples(proto.input),
                           _deadline(time_remaining), "multi_inference")


def _label(raw: bytes, row: int) -> str:
    try:
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidRequestError(f"class label of example {row} is not UTF-8 ({raw[:40]!r}); "
                                  "ClassificationResponse labels are proto strings") from None


def _fill_classification(proto_result, result: Classification) -> None:
    labels, scores = result.labels, result.scores
    shape = result.shape
    label_rows = labels.tolist() if labels is not None else None
    score_rows = scores.tolist() if scores is not None else None
    for row in range(shape[0]):
        classifications = proto_result.classifications.add()
        for column in range(shape[1]):
            entry = classifications.classes.add()
            if label_rows is not None:
                entry.label = _label(label_rows[row][column], row)
            if score_rows is not None:
                entry.score = score_rows[row][column]


def _fill_spec(spec, model_name: str, version: int, signature_name: str) -> None:
    spec.name = model_name
    spec.version.value = version
    spec.signature_name = signature_name


def classification_response(response: ExamplesResponse):
    """`ExamplesResponse` of one classify task -> `ClassificationResponse`."""
    proto = protocol.ClassificationResponse()
    (task_result,) = response.results
    _fill_spec(proto.model_spec, response.model_name, response.version, task_result.task.signature_name)
    assert isinstance(task_result.result, Classification)  # a classify task's result
    _fill_classification(proto.result, task_result.result)
    return proto


def regression_response(response: ExamplesResponse):
    """`ExamplesResponse` of one regress task -> `RegressionResponse`."""
    proto = protocol.RegressionResponse()
    (task_result,) = response.results
    _fill_spec(proto.model_spec, response.model_name, response.version, task_result.task.signature_name)
    assert isinstance(task_result.result, Regression)  # a regress task's result
    for value in task_result.result.values.tolist():
        proto.result.regressions.add().value = value
    return proto


def multi_inference_response(response: ExamplesResponse):
    """`ExamplesResponse` -> `MultiInferenceResponse`: one `InferenceResult` per task, in request order."""
    proto = protocol.MultiInferenceResponse()
    for task_result in response.results:
        entry = proto.results.add()
        _fill_spec(entry.model_spec, response.model_name, response.version, task_result.task.signature_name)
        if isinstance(task_result.result, Regression):
            for value in task_result.result.values.tolist():
                entry.regression_result.regressions.add().value = value
        else:
            _fill_classification(entry.classification_result, task_result.result)
    return proto


# ---------------------------------------------------------------- REST JSON

def _kind_error(name: str, feature) -> InvalidRequestError:
    kind = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}.get(feature.WhichOneof("kind"),
                                                                                      "UNKNOWN")
    return InvalidRequestError(f"Unexpected element type in feature: {name[:_NAME_CHARS]} expecting type: {kind}")


def _of_kind(feature, kind: str) -> bool:
    current = feature.WhichOneof("kind")
    return current is None or current == kind


def _add_value(value, name: str, feature) -> None:
    """Append one JSON value to `feature` (TF Serving's AddValueToFeature)."""
    if isinstance(value, bool):
        kind, item = "int64_list", int(value)
    elif isinstance(value, str):
        kind, item = "bytes_list", value.encode()
    elif isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        kind = "bytes_list"
        try:
            item = b64_decode(value["b64"])
        except (binascii.Error, ValueError) as err:
            raise InvalidRequestError(f"Feature: {name[:_NAME_CHARS]}: Unable to base64 decode") from err
    elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
        kind, item = "int64_list", value
    elif isinstance(value, int) and _INT64_MAX < value <= _UINT64_MAX:
        raise InvalidRequestError(f"Feature: {name[:_NAME_CHARS]} has uint64_t element. Only int64_t is supported.")
    elif isinstance(value, int | float):  # integers past 64 bits parse as doubles in rapidjson
        try:
            kind, item = "float_list", float(value)
            # float_list holds float32: 1e39 (or a literal past float64, parsed as OutOfRangeNumber) would become
            # an infinity the client never wrote; the `Infinity` token itself stays accepted, as in TF Serving
            past = isinstance(value, OutOfRangeNumber) or (math.isfinite(item) and abs(item) > _FLOAT32_MAX)
        except OverflowError:
            past = True
        if past:
            raise InvalidRequestError(f"Feature: {name[:_NAME_CHARS]} has a number past float range: "
                                      f"{clip(repr(value), 40)}")
    else:
        raise InvalidRequestError(f"Feature: {name[:_NAME_CHARS]} has element with unexpected JSON type: "
                                  f"{json_type(value)}")
    if not _of_kind(feature, kind):
        raise _kind_error(name, feature)
    getattr(feature, kind).value.append(item)


def example_from_json(value, example) -> None:
    """Fill `example` (a `tensorflow.Example`) from one JSON object (TF Serving's MakeExampleFromJsonObject).

    Raises:
        InvalidRequestError: not an object, a null / nested-list / non-b64 object value, values of mixed kinds.
    """
    if not isinstance(value, dict):
        raise InvalidRequestError(f"Example must be JSON object but got JSON {json_type(value)}")
    features = example.features.feature
    for name, content in value.items():
        feature = features[name]
        feature.Clear()
        for item in content if isinstance(content, list) else (content,):
            _add_value(item, name, feature)


def input_from_json(body: dict, verb: str):
    """A `:classify` / `:regress` body -> `tensorflow.serving.Input` (`examples`, optional `context`).

    Raises:
        InvalidRequestError: `examples` missing, not a list or empty (TF Serving's wording), or a bad example.
    """
    proto = Input()
    context = body.get("context")
    if context is not None:
        example_from_json(context, proto.example_list_with_context.context)
    examples = body.get("examples")
    if examples is None:
        raise InvalidRequestError(f"JSON Value: {debug_string(body)} When method is {verb}, key 'examples' is "
                                  "expected and was not found")
    if not isinstance(examples, list):
        raise InvalidRequestError(f"JSON Value: {debug_string(body)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise InvalidRequestError(f"JSON Value: {debug_string(body)} 'examples' value is an empty array")
    target = proto.example_list_with_context if context is not None else proto.example_list
    for value in examples:
        example_from_json(value, target.examples.add())
    return proto


def rest_request(body: dict, verb: str, ref: ModelRef, signature_name: str) -> ExamplesRequest:
    """A `:classify` / `:regress` JSON body for the model `ref` -> `ExamplesRequest`; raises as `input_from_json`."""
    method = ExampleMethod.CLASSIFY if verb == "classify" else ExampleMethod.REGRESS
    examples = serialized_examples(input_from_json(body, verb))
    return ExamplesRequest(ref, (ExampleTask(method, signature_name),), examples, None, verb)


def _float_json(values: np.ndarray) -> list:
    """float32 values (a list, nested as `values`) as TF Serving's WriteDecimal writes scores and regression
    values (`serving.tfs.json_write`: `3.5`, `4.0`, `1.43577434e+09`).
    """
    texts = decimal_texts(values.astype(np.float32))
    return np.vectorize(RawJson, otypes=[object])(texts).tolist() if texts.size else texts.tolist()


def rest_response(response: ExamplesResponse) -> dict:
    """`{"results": ...}`: per example `[[label, score], ...]` (classify; "" / 0 for a missing output) or one
    value (regress), as TF Serving's MakeJsonFromClassificationResult / MakeJsonFromRegressionResult.
    """
    (task_result,) = response.results
    result = task_result.result
    if isinstance(result, Regression):
        return {"results": _float_json(result.values)}
    shape = result.shape
    labels = ([[_label(v, r) for v in row] for r, row in enumerate(result.labels.tolist())]
              if result.labels is not None else [[""] * shape[1]] * shape[0])
    scores = _float_json(result.scores) if result.scores is not None else [[0.0] * shape[1]] * shape[0]
    return {"results": [[[label, score] for label, score in zip(label_row, score_row)]
                        for label_row, score_row in zip(labels, scores)]}
