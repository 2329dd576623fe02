"""Backward-node audit: prove a SavedModel holds an inference graph and model weights only.

The audit parses `saved_model.pb` (no TensorFlow session is needed to read it) and walks the
top-level graph and every function in its library, following function-call attributes
(`PartitionedCall`, `StatefulPartitionedCall`, `If`, `While`, ...) from each serving signature.

It fails on:
* gradient and backprop ops anywhere (`*Grad`, `*GradV2`, `SymbolicGradient`, `*Backprop*`),
  registered gradient functions, and calls into gradient functions (`__backward_*`, `gradients`);
* optimizer ops anywhere (`Apply*`, `ResourceApply*`, `ResourceSparseApply*`, `SparseApply*`);
* variable writes (`AssignVariableOp`, `AssignAddVariableOp`, `AssignSubVariableOp`, scatter
  updates) outside the checkpoint restore functions and the top-level variable initializers that
  every TF2 SavedModel carries for TF1-style loaders such as TensorFlow Serving;
* random ops and batch normalisation in training mode inside the serving functions;
* saved variables that are not model weights (optimizer slots, step counters, seed states);
* batch statistics (`Mean` ops) inside a BatchNormalization layer's scope in the serving functions;
* ops that touch the host (files, Python, the process, the network), by the one op policy (`core.op_policy`,
  every MetaGraph and every function, reachable or not), unless `allow_ops` names them;
* functions marked must-compile (`_XlaMustCompile`, from `tf.function(jit_compile=True)`) that the serving
  signatures reach: a server without the XLA JIT (TensorFlow Serving's default) cannot run them.

Only functions something reaches are judged: the serving signatures, the checkpoint saver and the object
graph's concrete functions (what `tf.saved_model.load` restores). A function nothing calls (a custom
gradient's backward function left in the library) can never run; it is listed in `unreachable_functions`,
not judged. Given the model's layers (`signatures.layers.keras_layers`), every violation inside a serving
function names the Keras layer whose scope holds the op, and says why that layer kind leaks training
behaviour; without them (a re-exported SavedModel) it names the op's name scope, which Keras opens per layer.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tfship.core.errors import AuditError, ContractError
from tfship.core.op_policy import PolicyReport, check_saved_model
from tfship.core.saved_model import serving_meta_graph
from tfship.signatures.forward_only import MUST_COMPILE, must_compile, object_graph_functions
from tfship.signatures.layers import LayerInfo, explain, layer_for_op
from tfship.signatures.reachable import called_functions, reachable_functions

GRADIENT_OP = re.compile(r"(Grad|GradV2|GradGrad)$|^SymbolicGradient$|Backprop")
OPTIMIZER_OP = re.compile(r"^(Resource)?(Sparse)?Apply[A-Z]")
ASSIGN_OP = re.compile(r"^(AssignVariableOp|AssignAddVariableOp|AssignSubVariableOp|Assign|AssignAdd|AssignSub"
                       r"|ResourceScatter\w+|ScatterNd\w*Update|ResourceStridedSliceAssign)$")
RANDOM_OP = re.compile(r"^(RandomUniform|RandomUniformInt|RandomStandardNormal|TruncatedNormal|RandomShuffle"
                       r"|Multinomial|RandomGamma|RandomPoisson\w*|Stateless\w*Random\w*|StatelessTruncatedNormal\w*"
                       r"|RngReadAndSkip|RngSkip|StatefulUniform\w*|StatefulStandardNormal\w*"
                       r"|StatefulTruncatedNormal|StatefulRandomBinomial|Dropout)$")
GRADIENT_FUNCTION = re.compile(r"(^|_)__backward_|gradients?[_/]|_grad_", re.IGNORECASE)
NON_WEIGHT_VARIABLE = re.compile(r"(^|/)(iteration|iterations|learning_rate|step|global_step|counter|seed_generator"
                                 r"\w*|optimizer\w*|momentum|velocity|m|v|loss_scale\w*)(/|$|:)",
                                 re.IGNORECASE)


@dataclass(frozen=True)
class AuditReport:
    """What the audit saw. `violations` empty means the SavedModel passed.

    op_histogram: op type -> count over the functions the serving signatures reach.
    variables: one dict per saved variable: name, dtype (enum number), shape, trainable.
    unreachable_functions: library functions nothing reaches (not judged).
    """

    saved_model_dir: str
    signatures: tuple[str, ...]
    serving_functions: tuple[str, ...]
    op_histogram: dict[str, int]
    variables: tuple[dict[str, Any], ...]
    violations: tuple[str, ...] = field(default_factory=tuple)
    unreachable_functions: tuple[str, ...] = field(default_factory=tuple)
    op_policy: PolicyReport | None = None

    @property
    def passed(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        """JSON form for the manifest."""
        return {"passed": self.passed, "signatures": list(self.signatures),
                "serving_functions": list(self.serving_functions), "op_histogram": self.op_histogram,
                "variables": list(self.variables), "violations": list(self.violations),
                "unreachable_functions": list(self.unreachable_functions),
                "op_policy": self.op_policy.to_json() if self.op_policy is not None else None}


def _tensor_node(tensor_name: str) -> str:
    return tensor_name.split(":")[0].lstrip("^")


def _load_meta_graph(saved_model_dir: Path):
    try:
        return serving_meta_graph(saved_model_dir)
    except ContractError as err:
        raise AuditError(str(err)) from err


def _blame(node, layers: dict[str, LayerInfo] | None, op_kind: str) -> str:
    """`: <why, naming the Keras layer>`, or without `layers` `: in name scope '<scope>'` (Keras opens one per
    layer call), or "" for an op outside any scope.
    """
    layer = layer_for_op(node.name, layers) if layers else None
    if layer is not None:
        return f": {explain(op_kind, layer)}"
    scope = node.name.rsplit("/", 1)[0] if "/" in node.name and not layers else ""
    return f": in name scope '{scope}'" if scope else ""


def _check_nodes(where: str, nodes, strict_serving: bool, allow_assign: bool,
                 layers: dict[str, LayerInfo] | None = None, library: dict | None = None) -> list[str]:
    problems = []
    for node in nodes:
        op = node.op
        layer = layer_for_op(node.name, layers) if (layers and strict_serving) else None
        if layer is not None and layer.kind == "batch_normalization" and op in ("Mean", "SquaredDifference"):
            problems.append(f"{where}: batch statistics {op} ('{node.name}'): {explain('batch statistics', layer)}")
        if GRADIENT_OP.search(op):
            problems.append(f"{where}: gradient op {op} ('{node.name}')" + _blame(node, layers, "gradient op"))
        elif OPTIMIZER_OP.search(op):
            problems.append(f"{where}: optimizer op {op} ('{node.name}')")
        elif ASSIGN_OP.search(op) and not allow_assign:
            problems.append(f"{where}: variable write {op} ('{node.name}')"
                            + (_blame(node, layers, "variable write") if strict_serving else ""))
        elif strict_serving and RANDOM_OP.search(op):
            blame = _blame(node, layers, "random op")
            problems.append(f"{where}: random op {op} ('{node.name}')" + (blame or ": an augmentation, dropout "
                            "or noise layer is active in the serving graph"))
        elif strict_serving and op.startswith("FusedBatchNorm") and node.attr["is_training"].b:
            problems.append(f"{where}: {op} with is_training=true ('{node.name}'): batch normalisation uses "
                            "batch statistics at serving time" + _blame(node, layers, "batch statistics"))
        for called in called_functions(node, library or {}):
            if GRADIENT_FUNCTION.search(called):
                problems.append(f"{where}: call into gradient function '{called}' ('{node.name}')"
                                + _blame(node, layers, "gradient call"))
            if strict_serving and must_compile(node.attr):
                problems.append(f"{where}: call into must-compile function '{called}' ('{node.name}', "
                                f"{MUST_COMPILE}=true, from tf.function(jit_compile=True)): needs the XLA JIT, "
                                "which TensorFlow Serving lacks by default" + _blame(node, layers, "XLA call"))
    return problems


def _top_level_nodes_judged(graph, nodes_by_name: dict[str, Any]) -> list[Any]:
    """The top-level graph's nodes less the variable initializers (`<var>/Assign` of a `VarHandleOp`) that
    every TF2 SavedModel carries for TF1-style loaders such as TensorFlow Serving.
    """
    return [n for n in graph.graph_def.node
            if not (n.op == "AssignVariableOp" and n.name.endswith("/Assign")
                    and n.input and nodes_by_name.get(_tensor_node(n.input[0]), n).op == "VarHandleOp")]


def _saved_variables(graph) -> tuple[dict[str, Any], ...]:
    """The object graph's variables: {name, dtype (DataType enum int), shape (list of ints), trainable}."""
    return tuple(
        {"name": n.variable.name, "dtype": int(n.variable.dtype),
         "shape": [d.size for d in n.variable.shape.dim], "trainable": bool(n.variable.trainable)}
        for n in graph.object_graph_def.nodes if n.WhichOneof("kind") == "variable")


def _variable_violations(variables: Iterable[dict[str, Any]], expected_variables: Iterable[str] | None) -> list[str]:
    """Saved variables that are not model weights: outside `expected_variables` when given, else named like
    optimizer or training state (`NON_WEIGHT_VARIABLE`).
    """
    expected = set(expected_variables) if expected_variables is not None else None
    violations = []
    for variable in variables:
        name = variable["name"]
        if expected is not None and name not in expected:
            violations.append(f"variable '{name}' is not a model weight")
        elif expected is None and NON_WEIGHT_VARIABLE.search(name):
            violations.append(f"variable '{name}' looks like optimizer or training state")
    return violations


def audit_saved_model(saved_model_dir: Path, expected_variables: Iterable[str] | None = None,
                      layers: dict[str, LayerInfo] | None = None, allow_ops: Iterable[str] = ()) -> AuditReport:
    """Audit a SavedModel for gradient, optimizer and training-only content.

    Args:
        saved_model_dir: folder holding `saved_model.pb`.
        expected_variables: model weight names (Keras `variable.path`); when given, every saved
            variable must be one of them.
        layers: the exported model's layers (`signatures.layers.keras_layers(model)`); when given,
            violations in serving functions name the Keras layer responsible.
        allow_ops: op names the op policy allows (`export.allow_ops`); recorded under `op_policy`.

    Returns:
        An `AuditReport`; call `raise_if_failed` to turn violations into an error.

    Raises:
        AuditError: when `saved_model.pb` cannot be read.
    """
    graph = _load_meta_graph(Path(saved_model_dir))
    policy = check_saved_model(Path(saved_model_dir), allow_ops)
    library = {f.signature.name: f for f in graph.graph_def.library.function}
    nodes_by_name = {n.name: n for n in graph.graph_def.node}
    signatures = sorted(k for k in graph.signature_def if not k.startswith("__"))
    serving_roots = [nodes_by_name[_tensor_node(info.name)] for key in signatures
                     for info in graph.signature_def[key].outputs.values()
                     if _tensor_node(info.name) in nodes_by_name]
    serving = reachable_functions(serving_roots, library)
    saver_nodes = [nodes_by_name[_tensor_node(name)] for name in
                   (graph.saver_def.restore_op_name, graph.saver_def.save_tensor_name)
                   if name and _tensor_node(name) in nodes_by_name]
    saver = set(reachable_functions(saver_nodes, library)) - set(serving)
    judged = set(reachable_functions(graph.graph_def.node, library, object_graph_functions(graph)))

    violations = [f"library: gradient function registered for '{g.function_name}' -> '{g.gradient_func}'"
                  for g in graph.graph_def.library.gradient]
    violations += _check_nodes("graph", _top_level_nodes_judged(graph, nodes_by_name), strict_serving=False,
                               allow_assign=False)
    histogram: Counter[str] = Counter()
    for name, function in library.items():
        if name not in judged:
            continue
        if name in serving:
            histogram.update(node.op for node in function.node_def)
            if must_compile(function.attr):
                violations.append(f"function {name}: marked must-compile ({MUST_COMPILE}=true, from "
                                  "tf.function(jit_compile=True)): needs the XLA JIT, which TensorFlow Serving "
                                  "lacks by default")
        violations += _check_nodes(f"function {name}", function.node_def, strict_serving=name in serving,
                                   allow_assign=name in saver, layers=layers, library=library)
    variables = _saved_variables(graph)
    violations += _variable_violations(variables, expected_variables)
    violations += policy.violations
    if not serving:
        violations.append(f"no function is reachable from the serving signatures {signatures}")
    return AuditReport(str(saved_model_dir), tuple(signatures), tuple(serving), dict(sorted(histogram.items())),
                       variables, tuple(dict.fromkeys(violations)), tuple(sorted(set(library) - judged)), policy)


def raise_if_failed(report: AuditReport) -> AuditReport:
    """Return the report unchanged when it passed.

    Raises:
        AuditError: listing every violation (at most 20 shown, with the total count).
    """
    if report.passed:
        return report
    shown = "; ".join(report.violations[:20])
    more = f" (+{len(report.violations) - 20} more)" if len(report.violations) > 20 else ""
    raise AuditError(f"audit of {report.saved_model_dir} failed: {len(report.violations)} violation(s): "
                     f"{shown}{more}")
