"""The one op policy: a SavedModel is a program, and nothing tfship publishes or serves may touch the host.

Judged from `saved_model.pb` alone (no TensorFlow, nothing executed), over every MetaGraph (a re-export's source:
the one MetaGraph loaded): its top-level graph and every function of its library, reachable or not. Refused:

* file system: `ReadFile`, `WriteFile`, `MatchingFiles`, the file-reading and file-writing dataset ops (TFRecord,
  text line, fixed-length, CSV, LMDB, SQL, save / load / snapshot, `DatasetToTFRecord`), every TF1 reader op
  (`*Reader*`), `ImmutableConst` (maps a file), `LoadAndRemapMatrix` / `GenerateVocabRemapping` (read checkpoints
  and vocabularies), `RecordInput`, `FileSystemSetConfiguration`, the summary file writers (`CreateSummaryFileWriter`,
  `Write*Summary`, ...), a `CacheDataset` caching to a file, `PrintV2` whose `output_stream` is a `file://` path,
  debug ops with `debug_urls`, `DecodeProtoV2` / `EncodeProto` reading descriptors from a file;
* checkpoint ops (`SaveV2`, `RestoreV2`, `MergeV2Checkpoints`, `Save`, `Restore`, ...) outside the SavedModel's own
  saver: allowed only in the top-level nodes the `saver_def` (save tensor, restore op) depends on and in the
  functions those nodes call, only where no signature, init op or object-graph function reaches them, and only
  with a file prefix made from the saver's own file name tensor (`saver_def.filename_tensor_name`, which the
  loader feeds with the version's `variables/` path), so the saver reads and writes no other checkpoint (a
  top-level node nothing reaches is allowed too: a TF1 MetaGraph keeps the savers of the MetaGraphs saved before
  it, `save/...` beside its own `save_1/...`, and no loader runs them; a library function nothing reaches is not);
* Python and the process: `PyFunc`, `PyFuncStateless`, `EagerPyFunc`, `Abort`; the network: tf.data service and
  RPC ops;
* tables initialised from a file (`InitializeTableFromTextFile[V2]`) unless the file name comes from an asset of
  the version (traced through the graph, variables and function calls), and assets whose file is outside the
  version's `assets/` folder (absolute, `..`, or a link leading out).

An operator may allow ops by name (`export.allow_ops`, the server's `--allow-ops`): a finding on an allowed op is
reported under `allowed`, not refused. Every finding names the op, the node, the function (or `graph`) and what
reaches it: the signatures, `__saved_model_init_op`, TF1 init collections, `saver`, `object graph`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tfship.core.errors import OpPolicyError
from tfship.core.graph_walk import SAVER, GraphTrace, assets_of, meta_graph_reach, node_name
from tfship.core.saved_model import read_saved_model, select_meta_graph

FILE_SYSTEM = "touches the host's file system"
HOST_OPS: dict[str, str] = {
    **dict.fromkeys((
        "ReadFile", "WriteFile", "MatchingFiles", "MatchingFilesDataset", "ExperimentalMatchingFilesDataset",
        "FileSystemSetConfiguration", "ImmutableConst", "LoadAndRemapMatrix", "GenerateVocabRemapping", "RecordInput",
        "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset", "LMDBDataset",
        "ExperimentalLMDBDataset", "SqlDataset", "ExperimentalSqlDataset", "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord", "SaveDataset", "SaveDatasetV2", "LoadDataset", "SnapshotDataset",
        "SnapshotDatasetV2", "SnapshotDatasetReader", "SnapshotNestedDatasetReader", "SnapshotChunkDataset",
        "ListSnapshotChunksDataset", "DistributedSave", "CreateSummaryFileWriter", "CreateSummaryDbWriter",
        "WriteSummary", "WriteAudioSummary", "WriteGraphSummary", "WriteHistogramSummary", "WriteImageSummary",
        "WriteRawProtoSummary", "WriteScalarSummary", "ImportEvent", "FlushSummaryWriter", "CloseSummaryWriter",
        "StatsAggregatorSetSummaryWriter"), FILE_SYSTEM),
    **dict.fromkeys(("PyFunc", "PyFuncStateless", "EagerPyFunc"), "runs Python code in the server process"),
    "Abort": "ends the server process",
    **dict.fromkeys(("DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4",
                     "RegisterDataset", "RegisterDatasetV2", "Rpc", "TryRpc", "RpcClient", "RpcCall", "RpcServer",
                     "RpcServerStart", "RpcServerRegister"), "opens network connections"),
}
READER_OP = re.compile(r"Reader")  # TF1 queue readers: WholeFileReader(V2), TFRecordReader, ReaderReadV2, ...
SAVER_OPS = frozenset(("SaveV2", "RestoreV2", "MergeV2Checkpoints", "Save", "SaveSlices", "Restore", "RestoreSlice"))
TABLE_FILE_OPS = frozenset(("InitializeTableFromTextFile", "InitializeTableFromTextFileV2"))
DEBUG_OP = re.compile(r"^Debug(Identity|NanCount|NumericSummary)")


@dataclass(frozen=True)
class OpFinding:
    """One op the policy judged: where it is, why it touches the host, and what reaches it."""

    op: str
    node: str
    where: str  # "graph" or "function <name>"
    reason: str
    reached_by: tuple[str, ...]
    tags: tuple[str, ...] = ("serve",)

    def describe(self) -> str:
        reached = ", ".join(self.reached_by[:5]) + (f" and {len(self.reached_by) - 5} more"
                                                    if len(self.reached_by) > 5 else "")
        tags = "" if self.tags == ("serve",) else f" of MetaGraph {list(self.tags)}"
        return (f"op {self.op} ('{self.node[:120]}') in {self.where[:160]}{tags} {self.reason}; reached by "
                f"{reached or 'nothing (still refused: it is in the file)'}")


@dataclass(frozen=True)
class PolicyReport:
    """The policy's verdict on one SavedModel; `passed` when nothing is refused."""

    saved_model_dir: str
    refused: tuple[OpFinding, ...] = ()
    allowed: tuple[OpFinding, ...] = ()
    allow_ops: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # asset files outside the version

    @property
    def passed(self) -> bool:
        return not self.refused and not self.problems

    @property
    def violations(self) -> list[str]:
        return [f"op policy: {f.describe()}" for f in self.refused] + [f"op policy: {p}" for p in self.problems]

    def side_effects(self, signature: str) -> list[OpFinding]:
        """The findings (refused and allowed) that `signature` reaches."""
        return [f for f in (*self.refused, *self.allowed) if signature in f.reached_by]

    def summary(self, shown: int = 3) -> str:
        """One line: the first `shown` violations and how many more."""
        items = self.violations
        more = f" (+{len(items) - shown} more)" if len(items) > shown else ""
        return "; ".join(v.removeprefix("op policy: ") for v in items[:shown]) + more

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "allow_ops": list(self.allow_ops), "violations": self.violations,
                "allowed": [f.describe() for f in self.allowed]}


def _attr_reason(node) -> str | None:
    """Why an op that is harmless by type touches the host through one of its attributes, or None."""
    attr = node.attr
    if node.op == "PrintV2" and "output_stream" in attr:
        stream = attr["output_stream"].s.decode(errors="replace")
        return f"prints to the file {stream[:200]!r}" if stream.startswith("file://") else None
    if DEBUG_OP.match(node.op) and "debug_urls" in attr and attr["debug_urls"].list.s:
        urls = [url.decode(errors="replace")[:100] for url in attr["debug_urls"].list.s]
        return f"sends tensors to debug URLs {urls[:3]}"
    if node.op in ("DecodeProtoV2", "EncodeProto") and "descriptor_source" in attr:
        source = attr["descriptor_source"].s.decode(errors="replace")
        if source not in ("", "local://") and not source.startswith("bytes://"):
            return f"reads proto descriptors from the file {source[:200]!r}"
    return None


def _through_link(folder: Path, parts: tuple[str, ...]) -> bool:
    """Whether `folder/<parts>` is, or passes through, a symbolic link (dangling ones included)."""
    step = folder
    for part in parts:
        step = step / part
        if step.is_symlink():
            return True
    return False


def _asset_problems(meta_graph, version_dir: Path | None) -> list[str]:
    """Assets whose file is not inside the version's `assets/` folder."""
    problems = []
    assets = Path(version_dir) / "assets" if version_dir is not None else None
    for _, name in assets_of(meta_graph):
        parts = PurePosixPath(name).parts
        if not name or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
            problems.append(f"asset {name[:200]!r} is not a file inside the version's assets/ folder")
        elif assets is not None and _through_link(assets, parts):
            problems.append(f"asset {name[:200]!r} is (or passes through) a link: the file it names may be anywhere "
                            "on the host; copy the file into the version's assets/ folder")
    return problems


def _judge(node, graph: GraphTrace, scope: str | None, in_saver: bool, reached: tuple[str, ...]) -> str | None:
    """Why `node` touches the host, or None when it does not (or is where the policy allows it)."""
    op = node.op
    if op in HOST_OPS:
        return HOST_OPS[op]
    if READER_OP.search(op):
        return f"{FILE_SYSTEM} (a TF1 reader)"
    if op in SAVER_OPS:
        outside = [r for r in reached if r != SAVER]
        if outside or not (in_saver or scope is None):
            return f"{FILE_SYSTEM} (a checkpoint op outside the SavedModel's saver)"
        data = [i for i in node.input if not i.startswith("^")]
        if in_saver and not (graph.saver_file and data and graph.depends_on(scope, data[0], graph.saver_file)):
            return (f"{FILE_SYSTEM} (a checkpoint op of the saver whose file prefix is not made from the saver's file "
                    f"name '{graph.saver_file[:100]}': it would read or write another checkpoint)")
        return None  # the saver's own, or (top-level, reached by nothing) a TF1 graph's earlier saver no one runs
    if op in TABLE_FILE_OPS:
        data = [i for i in node.input if not i.startswith("^")]
        bad = graph.sources(scope, data[1]) if len(data) > 1 else ["no file name"]
        return f"initialises a table from a file that is not an asset of the version (from {bad})" if bad else None
    if op in ("CacheDataset", "CacheDatasetV2"):
        data = [i for i in node.input if not i.startswith("^")]
        source = graph.scope_nodes(scope).get(node_name(data[1])) if len(data) > 1 else None
        if source is not None and source.op == "Const" and list(source.attr["value"].tensor.string_val) == [b""]:
            return None  # caches in memory
        return f"{FILE_SYSTEM} (caches a dataset to a file)"
    return _attr_reason(node)


def _meta_graph_findings(meta_graph, version_dir: Path | None) -> tuple[list[OpFinding], list[str]]:
    reach = meta_graph_reach(meta_graph)
    graph = GraphTrace(meta_graph)
    tags = tuple(sorted(meta_graph.meta_info_def.tags))
    findings = []
    scopes = [(None, meta_graph.graph_def.node)] + [(name, f.node_def) for name, f in graph.library.items()]
    for scope, nodes in scopes:
        for node in nodes:
            reached = reach.nodes.get(node.name, ()) if scope is None else reach.functions.get(scope, ())
            reason = _judge(node, graph, scope, SAVER in reached, reached)
            if reason is not None:
                where = "graph" if scope is None else f"function {scope}"
                findings.append(OpFinding(node.op, node.name, where, reason,
                                          tuple(r for r in reached if r != SAVER) or reached, tags))
    return findings, _asset_problems(meta_graph, version_dir)


def check_saved_model(saved_model_dir: Path, allow_ops: Iterable[str] = (),
                      tags: tuple[str, ...] | None = None) -> PolicyReport:
    """Judge every MetaGraph of `<saved_model_dir>/saved_model.pb` by the op policy (module docstring).

    Args:
        saved_model_dir: the SavedModel (a version folder); its `assets/` are checked on disk too.
        allow_ops: op names the operator allows (`export.allow_ops`, `--allow-ops`).
        tags: judge only the MetaGraph with this tag-set (`core.saved_model.select_meta_graph`): a re-export's
            source, of which only that MetaGraph is ever loaded. None (servers, the audit): every MetaGraph.

    Returns:
        The `PolicyReport`; nothing is executed and TensorFlow is not imported.

    Raises:
        ContractError: `saved_model.pb` is missing or unreadable (`core.saved_model.read_saved_model`), or has no
            MetaGraph tagged `tags`.
    """
    allowed_names = tuple(sorted(set(allow_ops)))
    refused, allowed, problems = [], [], []
    saved_model = read_saved_model(saved_model_dir)
    chosen = saved_model.meta_graphs if tags is None else [select_meta_graph(saved_model, tags)]
    for meta_graph in chosen:
        findings, assets = _meta_graph_findings(meta_graph, Path(saved_model_dir))
        problems += assets
        for finding in findings:
            (allowed if finding.op in allowed_names else refused).append(finding)
    return PolicyReport(str(saved_model_dir), tuple(refused), tuple(allowed), allowed_names,
                        tuple(dict.fromkeys(problems)))


def raise_if_refused(report: PolicyReport, how_to_allow: str = "export.allow_ops or the server's --allow-ops"
                     ) -> PolicyReport:
    """Return the report when the policy passed it.

    Raises:
        OpPolicyError: one line naming the first violations (op, node, function, what reaches it) and the count.
    """
    if report.passed:
        return report
    raise OpPolicyError(f"{report.saved_model_dir}: refused by the op policy, {len(report.violations)} "
                        f"violation(s): {report.summary()} (an operator may allow an op by name: {how_to_allow})")


def parse_op_list(value: str | Iterable[str]) -> tuple[str, ...]:
    """`--allow-ops PrintV2,WriteFile` (or a list) as op names; refuses names that are not TensorFlow op names.

    Raises:
        ValueError: a name that is not an op name (`[A-Za-z_][A-Za-z0-9_]*`).
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(item.strip() for item in items if item.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_>]*", name):
            raise ValueError(f"{name[:100]!r} is not an op name")
    return names

