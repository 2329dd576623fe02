"""Move a version label (`canary`, `stable`) in the model config servers poll, by evidence, atomically.

The labels live where TF Serving keeps them: `version_labels` in the ModelServerConfig text file
`<repository>/models.config` (a file, or an s3:// object), which servers read with `--model_config_file` and
re-read every `--model_config_file_poll_wait_seconds`. The model's `model_version_policy` is set to the labelled
versions, so both `canary` and `stable` are loaded. The file is replaced in one step (a rename locally, a single
PUT in a bucket), so a server never reads half of it.

Before `stable` moves, the candidate is compared with the version labelled `stable` now, TFX-style:
  * the golden set (the candidate's `assets.extra/tfship_golden.npz` inputs): both versions' outputs, with the
    largest difference per output and the agreement of their decisions (argmax) reported;
  * the task metric (accuracy) on held-out data (`--data` NPZ with `x`/`y`, or the pipeline config's held-out
    split): the candidate may be worse than stable by at most `max_metric_drop` (absolute, TFX's
    `change_threshold`). Otherwise the promotion is refused with the figures. `force` moves it anyway and is
    recorded.
Every promotion, forced or not, is appended to `<repository>/<model>/promotions.json`: who, when, which version,
which label, the previous holder and the evidence. Rolling back is promoting the previous version.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from tfship.core import protocol
from tfship.core.errors import ConfigError, StageError
from tfship.core.locations import BucketUrl, Location
from tfship.core.scratch import scratch_folder
from tfship.core.tasks import primary, task_metrics, worse_by
from tfship.pipeline.orchestration.shadow_evidence import ShadowEvidence
from tfship.serving.dataplane.model_config import check_model_name
from tfship.serving.runtimes import REGISTRY, RuntimeOptions
from tfship.serving.storage.filesystem import read_text, write_text
from tfship.serving.storage.mirror import MARKER, BucketMirror

LABELS = ("canary", "stable")
CONFIG_NAME = "models.config"
RECORD_NAME = "promotions.json"


class PromotionRefusedError(StageError):
    """The candidate is worse than the version labelled `stable` beyond the threshold (the figures say how)."""


@dataclass(frozen=True)
class Evidence:
    """What `stable`'s move was judged on. Metrics are fractions in [0, 1]; differences in output units."""

    stable_version: int
    golden_rows: int
    max_abs_diff: dict[str, float]
    decision_agreement: float | None
    metric: str
    candidate_metric: float | None
    stable_metric: float | None
    max_metric_drop: float
    rows: int
    task: str = "classification"

    @property
    def passed(self) -> bool:
        """The candidate is worse than stable on the task's metric (`core.tasks.worse_by`) by at most the drop."""
        if self.candidate_metric is None or self.stable_metric is None:
            return True
        return worse_by(self.task, self.candidate_metric, self.stable_metric) <= self.max_metric_drop

    def summary(self) -> str:
        metric = (f"{self.metric} {self.candidate_metric:.4f} vs stable v{self.stable_version} "
                  f"{self.stable_metric:.4f} on {self.rows} held-out rows (allowed drop {self.max_metric_drop})"
                  if self.candidate_metric is not None else "no held-out data: metric not compared")
        agree = "" if self.decision_agreement is None else f"; decisions agree on {self.decision_agreement:.1%}"
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in sorted(self.max_abs_diff.items()))
        return f"{metric}; golden set ({self.golden_rows} rows) max |diff|: {diffs}{agree}"


def _join(repository: Location, *parts: str) -> Location:
    out = repository
    for part in parts:
        out = out / part
    return out


def _read_config(path: Location) -> Any:
    try:
        text = read_text(path)
    except FileNotFoundError:
        return protocol.ModelServerConfig()
    try:
        return text_format.Parse(text, protocol.ModelServerConfig())
    except text_format.ParseError as err:
        raise ConfigError(f"{path}: not a ModelServerConfig in text format: {err}") from err


def _entry(config, repository: Location, model: str):
    for entry in config.model_config_list.config:
        if entry.name == model:
            return entry
    entry = config.model_config_list.config.add()
    base = _join(repository, model)
    entry.name, entry.base_path = model, str(base if isinstance(base, BucketUrl) else Path(base).resolve())
    entry.model_platform = "tensorflow"
    return entry


def _version_folder(repository: Location, model: str, version: int, scratch: Path, saved_model: bool = True) -> Path:
    """A local, verified copy of a published version (the folder itself for a local repository); `saved_model`:
    it must hold one (the offline evidence runs it; shadow evidence needs only the published marker).
    """
    if isinstance(repository, BucketUrl):
        mirror = BucketMirror(repository / model, scratch / str(version))
        if version not in mirror.complete_versions():
            raise ConfigError(f"{repository}/{model}/{version} is not a complete published version "
                              f"(no {MARKER})")
        return mirror.sync(lambda versions: {version} if version in versions else set()) / str(version)
    folder = Path(repository) / model / str(version)
    if not (folder / MARKER).is_file() or saved_model and not (folder / "saved_model.pb").is_file():
        raise ConfigError(f"{folder} is not a published version (needs saved_model.pb and {MARKER})")
    return folder


def _run(folder: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    runtime = REGISTRY.create("auto", folder, RuntimeOptions(use_gpu=False))
    runtime.load()
    try:
        return runtime.predict(inputs)
    finally:
        runtime.unload()


def _decisions(outputs: dict[str, np.ndarray]) -> np.ndarray | None:
    """Class decisions: an integer [N] output, else the argmax of the first float [N, C] one."""
    for value in outputs.values():
        if value.ndim == 1 and value.dtype.kind in "iu":
            return value
    for value in outputs.values():
        if value.ndim == 2 and value.dtype.kind == "f" and value.shape[1] > 1:
            return value.argmax(axis=1)
    return None


def _task_score(task: str, outputs: dict[str, np.ndarray], labels: np.ndarray) -> float | None:
    """The task's judged metric (`core.tasks`) of one version's outputs: accuracy of the class decisions, AUC of
    the one-column score output (binary), MAE of the float output shaped like the labels (regression).
    """
    if task == "classification":
        decided = _decisions(outputs)
        return None if decided is None else float(np.mean(decided == labels))
    rows = len(labels)
    for value in outputs.values():
        fits = value.shape in ((rows,), (rows, 1)) if task == "binary" else value.size == np.asarray(labels).size
        if value.dtype.kind == "f" and fits:
            return task_metrics(task, value, labels)[primary(task).name]
    return None


def gather_evidence(candidate: Path, stable: Path, stable_version: int, held_out: tuple | None,
                    max_metric_drop: float, task: str = "classification") -> Evidence:
    """Run both versions on the candidate's golden set and on `held_out` (x, y) and compare; `x` is one array
    (the single input) or a dict {input name: array}; the metric is `task`'s (`core.tasks.primary`).
    """
    from tfship.pipeline.orchestration.publish import read_golden_set

    inputs, _ = read_golden_set(candidate)
    new, old = _run(candidate, inputs), _run(stable, inputs)
    shared = sorted(set(new) & set(old))
    diffs = {k: float(np.max(np.abs(new[k].astype(np.float64) - old[k].astype(np.float64))))
             for k in shared if new[k].shape == old[k].shape and new[k].dtype.kind in "fiu"}
    a, b = _decisions(new), _decisions(old)
    agreement = float(np.mean(a == b)) if a is not None and b is not None and a.shape == b.shape else None
    rows = next(iter(inputs.values())).shape[0]
    cand_metric = stable_metric = None
    held_rows = 0
    if held_out is not None:
        x, y = held_out
        named = dict(x) if isinstance(x, dict) else {next(iter(inputs)): x}
        scores = [_task_score(task, _run(folder, named), y) for folder in (candidate, stable)]
        if all(score is not None for score in scores):
            cand_metric, stable_metric = scores
            held_rows = len(y)
    return Evidence(stable_version, rows, diffs, agreement, primary(task).name, cand_metric, stable_metric,
                    max_metric_drop, held_rows, task)


def promote(repository: Location, model: str, version: int, label: str, *, held_out: tuple | None = None,
            max_metric_drop: float = 0.01, force: bool = False, who: str | None = None,
            shadow: ShadowEvidence | None = None, task: str = "classification") -> dict[str, Any]:
    """Point `label` at `version` of `model` in `<repository>/models.config`; returns the promotion record.

    Raises:
        ConfigError: an unknown label, a bad model name, a version that is not a complete published version,
            or an unreadable config.
        PromotionRefusedError: with `shadow` (the live shadow report, `--evidence shadow`), the report misses
            a floor (the message has the figures and every reason); nothing moves unless `force`.
        PromotionRefusedError: `label` is `stable`, the candidate's metric is worse than stable's beyond
            `max_metric_drop`, and `force` is off (the message has the figures).
    """
    if label not in LABELS:
        raise ConfigError(f"--label {label!r}: choose from {list(LABELS)}")
    check_model_name(model)
    config_path = _join(repository, CONFIG_NAME)
    config = _read_config(config_path)
    entry = _entry(config, repository, model)
    labels = dict(entry.version_labels)
    previous = labels.get(label)
    evidence = None
    with scratch_folder("promote") as scratch:
        candidate = _version_folder(repository, model, version, scratch, saved_model=shadow is None)
        stable = labels.get("stable")
        if shadow is not None:
            evidence = shadow.record(version)
            if not evidence["passed"] and not force:
                raise PromotionRefusedError(f"promote: {model} v{version} not proven by its shadow: "
                                            f"{'; '.join(evidence['reasons'])}; {evidence['summary']}; nothing moved "
                                            "(--force to move it anyway)")
        elif label == "stable" and stable is not None and stable != version:
            evidence = gather_evidence(candidate, _version_folder(repository, model, stable, scratch), stable,
                                       held_out, max_metric_drop, task)
            if not evidence.passed and not force:
                raise PromotionRefusedError(f"promote: {model} v{version} is worse than stable v{stable}: "
                                            f"{evidence.summary()}; nothing moved (--force to move it anyway)")
    labels[label] = version
    entry.ClearField("version_labels")
    for name, number in sorted(labels.items()):
        entry.version_labels[name] = number
    entry.model_version_policy.specific.ClearField("versions")
    entry.model_version_policy.specific.versions.extend(sorted(set(labels.values())))
    write_text(config_path, text_format.MessageToString(config))
    record = {"at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "by": who or f"{getpass.getuser()}@{socket.gethostname()}", "model": model, "label": label,
              "version": version, "previous": previous, "forced": force,
              "evidence": evidence if evidence is None or isinstance(evidence, dict) else {
                  **evidence.__dict__, "passed": evidence.passed, "summary": evidence.summary()}}
    _append_record(_join(repository, model, RECORD_NAME), record)
    return record


def _append_record(path: Location, record: dict) -> None:
    try:
        history = json.loads(read_text(path))
    except FileNotFoundError:
        history = []
    history.append(record)
    write_text(path, json.dumps(history, indent=2) + "\n")


def history(repository: Location, model: str) -> list[dict]:
    """The promotions recorded for `model`, oldest first."""
    try:
        return json.loads(read_text(_join(repository, model, RECORD_NAME)))
    except FileNotFoundError:
        return []

