"""Classify, Regress and MultiInference over serialized `tf.Example`s: TF Serving's signature rules.

Follows `tensorflow_serving/servables/tensorflow/classifier.cc`, `regressor.cc` and `multi_inference.cc`:
a signature serves Classify when it has exactly one input, aliased `inputs`, and one or two outputs among
`classes` (string [batch, num_classes]) and `scores` (float32 [batch, num_classes]); it serves Regress
when it has one input `inputs` and one output `outputs` (float32 [batch] or [batch, 1]). The signature's
`method_name` is not checked unless the server runs with `--enable_signature_method_name_check`, so
predict signatures of that shape are served too. Every refusal is INVALID_ARGUMENT with TF Serving's
wording (signatures are described in one bounded line instead of a proto dump).

tfship adds one check before the model runs: the `inputs` tensor must be DT_STRING (it is fed the
serialized examples), so a float input is refused by name instead of failing inside the backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from tfship.core.contract import Signature
from tfship.core.dtypes import dtype_name
from tfship.core.echo import clip
from tfship.core.errors import InvalidRequestError, UnimplementedError
from tfship.serving.dataplane.types import ModelRef

EXAMPLES_INPUT = "inputs"  # TF's CLASSIFY_INPUTS / REGRESS_INPUTS
CLASSES_OUTPUT = "classes"  # CLASSIFY_OUTPUT_CLASSES
SCORES_OUTPUT = "scores"  # CLASSIFY_OUTPUT_SCORES
REGRESSION_OUTPUT = "outputs"  # REGRESS_OUTPUTS
_DESCRIBE_CHARS = 300


class ExampleMethod(enum.Enum):
    """What a task asks of a signature; the values are TF Serving's method names."""

    CLASSIFY = "tensorflow/serving/classify"
    REGRESS = "tensorflow/serving/regress"

    @classmethod
    def of_method_name(cls, method_name: str) -> ExampleMethod:
        """The method of a MultiInference task's `method_name`.

        Raises:
            UnimplementedError: any other method name (TF Serving: "Unsupported signature method_name").
        """
        try:
            return cls(method_name)
        except ValueError:
            raise UnimplementedError(f"Unsupported signature method_name: {method_name[:100]} (expected "
                                     f"{cls.CLASSIFY.value} or {cls.REGRESS.value})") from None


@dataclass(frozen=True)
class ExampleTask:
    """One signature to run over the request's examples (a MultiInference task; Classify/Regress are one)."""

    method: ExampleMethod
    signature_name: str = "serving_default"


@dataclass(frozen=True)
class ExamplesRequest:
    """Classify / Regress / MultiInference.

    Attributes:
        model: the servable; every task runs on this one version.
        tasks: the signatures to run, at least one, no signature twice.
        examples: object array [n] of serialized `tensorflow.Example` bytes, the context already merged in
            (`serving.tfs.examples`); n = 0 is refused after the signature checks ("Input is empty.").
        deadline: `time.monotonic()` seconds, None = none.
        api: the metrics label (`classify`, `regress`, `multi_inference`).
    """

    model: ModelRef
    tasks: tuple[ExampleTask, ...]
    examples: np.ndarray
    deadline: float | None = None
    api: str = "classify"


@dataclass(frozen=True)
class Classification:
    """Per example and class: `labels` object [n, c] bytes (None when the signature has no `classes`),
    `scores` float32 [n, c] (None when it has no `scores`).
    """

    labels: np.ndarray | None
    scores: np.ndarray | None

    @property
    def shape(self) -> tuple[int, ...]:
        """[n, c]: of `labels`, else of `scores` (a classify signature has classes or scores)."""
        present = self.labels if self.labels is not None else self.scores
        assert present is not None  # checked when the signature was judged for classify
        return present.shape


@dataclass(frozen=True)
class Regression:
    """One float32 value per example: `values` [n]."""

    values: np.ndarray


@dataclass(frozen=True)
class TaskResult:
    """The answer of one task: its signature name (as requested, `serving_default` when empty) and result."""

    task: ExampleTask
    result: Classification | Regression


@dataclass(frozen=True)
class ExamplesResponse:
    """The version that served every task, and one `TaskResult` per task in request order."""

    model_name: str
    version: int
    results: tuple[TaskResult, ...]


def describe_signature(signature: Signature) -> str:
    """One bounded line naming a signature's method, inputs and outputs (TF Serving prints the proto)."""
    inputs = ", ".join(f"{k}: {s.describe()}" for k, s in signature.inputs.items())
    outputs = ", ".join(f"{k}: {s.describe()}" for k, s in signature.outputs.items())
    text = f"{signature.name!r} (method_name {signature.method_name!r}; inputs {{{inputs}}}; outputs {{{outputs}}})"
    return text if len(text) <= _DESCRIBE_CHARS else text[:_DESCRIBE_CHARS - 3] + "..."


def output_aliases(signature: Signature, method: ExampleMethod, check_method_name: bool = False) -> tuple[str, ...]:
    """The output aliases `method` reads from `signature` (TF Serving's PreProcessClassification/Regression).

    Raises:
        InvalidRequestError: the signature does not have the shape `method` needs, or (with
            `check_method_name`) its method_name is another one.
    """
    kind = "classification" if method is ExampleMethod.CLASSIFY else "regression"
    if check_method_name and signature.method_name != method.value:
        raise InvalidRequestError(f"Expected {kind} signature method_name to be {method.value}. "
                                  f"Was: {signature.method_name[:100]}")
    if len(signature.inputs) != 1:
        raise InvalidRequestError(f"Expected one input Tensor. Signature was: {describe_signature(signature)}")
    outputs = signature.outputs
    if method is ExampleMethod.CLASSIFY and len(outputs) not in (1, 2):
        raise InvalidRequestError(f"Expected one or two output Tensors, found {len(outputs)}. Signature was: "
                                  f"{describe_signature(signature)}")
    if method is ExampleMethod.REGRESS and len(outputs) != 1:
        raise InvalidRequestError(f"Expected one output Tensor. Signature was: {describe_signature(signature)}")
    spec = signature.inputs.get(EXAMPLES_INPUT)
    if spec is None:
        raise InvalidRequestError(f"No {kind} inputs found in SignatureDef: {describe_signature(signature)}")
    # The input's declared dtype is not checked, as TF Serving's PreProcessRegression / PreProcessClassification
    # do not: its testdata saved_model_half_plus_three declares its serialized-example input DT_FLOAT, and the
    # REST API page's `:regress` example on it answers {"results": [3.5, 4.0]}. The graph judges the strings fed
    # (a real float input refuses them: INVALID_ARGUMENT from the backend).
    if method is ExampleMethod.REGRESS:
        if REGRESSION_OUTPUT not in outputs:
            raise InvalidRequestError(f"No regression outputs found in SignatureDef: {describe_signature(signature)}")
        return (REGRESSION_OUTPUT,)
    wanted = tuple(k for k in (CLASSES_OUTPUT, SCORES_OUTPUT) if k in outputs)
    if not wanted:
        raise InvalidRequestError(f'Expected classification signature outputs to contain at least one of "classes" '
                                  f'or "scores". Signature was: {describe_signature(signature)}')
    return wanted


def classification(outputs: dict[str, np.ndarray], rows: int) -> Classification:
    """Check and keep the `classes` / `scores` the model answered (TF Serving's PostProcessClassificationResult).

    Raises:
        InvalidRequestError: an output that is not rank 2, of the wrong dtype (string / float32), with another
            batch size than `rows`, or the two disagree on the number of classes.
    """
    labels, scores = outputs.get(CLASSES_OUTPUT), outputs.get(SCORES_OUTPUT)
    for name, array, dtype, tf_name in ((CLASSES_OUTPUT, labels, "string", "DT_STRING"),
                                        (SCORES_OUTPUT, scores, "float32", "DT_FLOAT")):
        if array is None:
            continue
        if array.ndim != 2:
            raise InvalidRequestError(f"Expected Tensor shape: [batch_size num_classes] but got {list(array.shape)} "
                                      f"(output {name!r})")
        if dtype_name(array.dtype) != dtype:
            raise InvalidRequestError(f"Expected {name} Tensor of {tf_name}. Got: {dtype_name(array.dtype)}")
        if array.shape[0] != rows:
            raise InvalidRequestError(f"Expected {name} output batch size of {rows}. Got: {array.shape[0]}")
    if labels is not None and scores is not None and labels.shape[1] != scores.shape[1]:
        raise InvalidRequestError(f"Tensors class and score should match in dim_size(1). Got {labels.shape[1]} vs. "
                                  f"{scores.shape[1]}")
    return Classification(labels, scores)


def regression(outputs: dict[str, np.ndarray], rows: int) -> Regression:
    """Check and flatten the `outputs` the model answered (TF Serving's PostProcessRegressionResult).

    Raises:
        InvalidRequestError: not [batch] or [batch, 1], another batch size than `rows`, or not float32.
    """
    array = outputs[REGRESSION_OUTPUT]
    if not (array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)):
        raise InvalidRequestError(f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but "
                                  f"got {list(array.shape)}")
    if array.shape[0] != rows:
        raise InvalidRequestError(f"Input batch size did not match output batch size: {rows} vs. {array.shape[0]}")
    if dtype_name(array.dtype) != "float32":
        raise InvalidRequestError(f"Expected output Tensor of DT_FLOAT.  Got: {dtype_name(array.dtype)}")
    return Regression(array.reshape(-1))


def check_tasks(tasks: tuple[ExampleTask, ...]) -> None:
    """At least one task and no signature twice (TF Serving: "Duplicate evaluation of signature").

    Raises:
        InvalidRequestError: as above.
    """
    if not tasks:
        raise InvalidRequestError("MultiInferenceRequest has no tasks: add one task per signature to run")
    seen: set[str] = set()
    for task in tasks:
        if task.signature_name in seen:
            raise InvalidRequestError(f"Duplicate evaluation of signature: {clip(task.signature_name)}")
        seen.add(task.signature_name)
