"""Stop requests and the watchdog of multi-worker training: no silent hang, signals at every moment.

TensorFlow blocks inside C++ while it waits for peers (the rendezvous when the strategy is built, every
collective of a step), and Python runs signal handlers only between bytecodes of the main thread. So under
`multi_worker` the training loop runs in a worker thread (`supervised`), and the main thread stays free:

* it handles SIGINT and SIGTERM at any moment (`StopRequest`): while connecting they end the run at once;
  while training the loop checkpoints at the next step boundary, agreed with every worker, and stops; a second
  signal, or no step finishing within `timeout_s` after the first, ends the run at once;
* while the loop waits (`Watch.phase`: connecting, comparing fingerprints, creating variables, a step), it
  probes the peers' ports every second (`cluster.describe_unreachable`) and prints every `REPORT_EVERY_S`
  seconds what it waits for; it gives up with one line naming the missing tasks and addresses after
  `timeout_s` connecting, or after a peer has not answered for `timeout_s` (a step may be slow for local
  reasons, the first one traces the graph, so a slow step whose peers all answer is reported, not ended).

A run that ends this way raises `StageError` in the main thread (so the train stage's failed record is written);
the thread itself may still be blocked in TensorFlow, so the `tfship train` command ends the process with
`os._exit` after printing the error (see `pipeline.cli.commands`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tfship.core.errors import StageError
from tfship.pipeline.training.cluster import Cluster, describe_unreachable

T = TypeVar("T")
REPORT_EVERY_S = 5.0
POLL_S = 0.5
AFTER_STEP = ("after_step", "checkpoint")
PROBE_AFTER_S = 2.0  # a phase shorter than this is not waiting for anyone
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 1.0


class StopRequest:
    """Set by SIGINT / SIGTERM (handlers installed by `handling_signals` in the main thread); read by the loop.

    Attributes:
        signal_name: `SIGTERM` / `SIGINT` of the first signal, None before any.
        count: signals received so far.
    """

    def __init__(self, interrupt_on_second: bool = False) -> None:
        self.event = threading.Event()
        self.signal_name: str | None = None
        self.count = 0
        self.at = 0.0
        self.interrupt_on_second = interrupt_on_second

    def __call__(self, signum, _frame=None) -> None:
        """The handler: the first signal asks for a checkpoint and a stop; with `interrupt_on_second` (training in
        the main thread) a second one raises KeyboardInterrupt there, stopping at once.
        """
        self.count += 1
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self.at = time.monotonic()
        self.event.set()
        if self.count > 1 and self.interrupt_on_second:
            raise KeyboardInterrupt

    @property
    def requested(self) -> bool:
        return self.event.is_set()


class handling_signals:
    """Context manager: route SIGINT and SIGTERM to `stop` while training (main thread only), then restore."""

    def __init__(self, stop: StopRequest):
        self.stop, self.saved = stop, {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self.stop)
        return self.stop

    def __exit__(self, *exc) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


class Watch:
    """What the training thread is doing, for the watchdog: `phase` and since when (monotonic seconds)."""

    def __init__(self) -> None:
        self.phase, self.since, self.step = "connecting", time.monotonic(), 0

    def beat(self, phase: str, step: int | None = None) -> None:
        """The thread entered `phase` (`connecting`, `agreeing`, `building`, `step`, `checkpoint`, ...)."""
        self.phase, self.since = phase, time.monotonic()
        if step is not None:
            self.step = step


WAITING_PHASES = {"connecting": "connecting to the cluster", "agreeing": "comparing fingerprints with the workers",
                  "building": "creating the variables (broadcast from the chief)", "step": "in step",
                  "after_step": "checking with the workers after step", "checkpoint": "saving a checkpoint after step"}


def supervised(work: Callable[[], T], cluster: Cluster, watch: Watch, stop: StopRequest, timeout_s: float,
               say: Callable[[str], None]) -> T:
    """Run `work()` in a daemon thread and watch it from this (the main) thread; see the module docstring.

    Returns:
        What `work` returned.

    Raises:
        StageError: what `work` raised (re-raised), a signal while connecting, a second signal, no step finishing
            within `timeout_s` after a signal, or `timeout_s` without progress while waiting for peers (naming
            the peers that do not answer, with their addresses).
    """
    outcome: dict[str, Any] = {}  # "value": what work() returned, or "error": what it raised

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
            outcome["error"] = err

    thread = threading.Thread(target=target, name="tfship-train", daemon=True)
    thread.start()
    reported = probed = time.monotonic()
    unreachable_since, missing, rearmed = None, [], False
    while True:
        thread.join(POLL_S)
        if not thread.is_alive():
            if "error" in outcome:
                raise outcome["error"]
            return outcome["value"]
        now = time.monotonic()
        phase, waited = watch.phase, now - watch.since
        if phase != "connecting" and not rearmed:
            rearmed = True
            _rearm(stop)
        if stop.requested:
            _check_stop(stop, watch, now, timeout_s)
        if phase not in WAITING_PHASES or waited < PROBE_AFTER_S:
            unreachable_since, missing = None, []
            continue
        if now - probed >= PROBE_EVERY_S:
            probed = now
            missing = describe_unreachable(cluster.peers, timeout_s=PROBE_TIMEOUT_S)
            unreachable_since = (unreachable_since or now) if missing else None
        where = f" {watch.step + 1}" if phase == "step" else f" {watch.step}" if phase in AFTER_STEP else ""
        # Connecting has one deadline; a step may be slow for local reasons (the first one traces the graph), so
        # it is given up only while a peer does not answer.
        stalled = waited if phase == "connecting" else (now - unreachable_since if unreachable_since else 0.0)
        if stalled > timeout_s:
            who = "; ".join(missing) if missing else (
                "every peer's port answers, so a peer is stuck or its TF_CONFIG differs from ours "
                f"({cluster.me.name} at {cluster.me.address})")
            raise StageError(f"train: gave up after {timeout_s:g} s (train.cluster_timeout_s) "
                             f"{WAITING_PHASES[phase]}{where}; waiting for: {who}")
        if waited > REPORT_EVERY_S and now - reported >= REPORT_EVERY_S:
            reported = now
            who = ", ".join(missing) if missing else "the peers (every peer's port answers)"
            say(f"{cluster.me.name}: {WAITING_PHASES[phase]}{where} for {waited:.0f} s; waiting for {who}"
                + (f" (giving up after {timeout_s:g} s unreachable)" if missing else ""))


def _rearm(stop: StopRequest) -> None:
    """Take SIGTERM and SIGINT back once the strategy is built: TensorFlow's coordination service installs its
    own C-level SIGTERM handler then (the preemption notifier behind PreemptionCheckpointHandler), which would
    swallow the signal.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)


def _check_stop(stop: StopRequest, watch: Watch, now: float, timeout_s: float) -> None:
    if watch.phase in ("connecting", "agreeing", "building"):
        raise StageError(f"train: stopped by {stop.signal_name} while {WAITING_PHASES[watch.phase]}; nothing "
                         "trained, no checkpoint written")
    if stop.count > 1:
        raise StageError(f"train: stopped by a second {stop.signal_name} at step {watch.step}; no checkpoint "
                         "written for this stop (the last periodic one stays)")
    if now - stop.at > timeout_s:
        raise StageError(f"train: stopped by {stop.signal_name}: no step finished within {timeout_s:g} s "
                         f"(train.cluster_timeout_s) after it, at step {watch.step}; no checkpoint written")
