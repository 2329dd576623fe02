"""What a finished training run reports: the test split's figures and train.json's details (`TrainResult`)."""

from __future__ import annotations

from dataclasses import asdict

from tfship.pipeline.training import inputs as data_inputs
from tfship.pipeline.training.train_records import PARTIAL_BATCH, TrainResult


def summarise(loop, steps, choice, blocks, history, start: int, seconds: float, stopped_early: bool,
              checkpoint_path) -> TrainResult:
    """The `TrainResult` of a `train._Loop` run: the model without recompute wrappers, the history, and train.json's
    details (XLA choice, optimizer, strategy, steps per execution, checkpoints saved: a count and the last one,
    step kind, frozen layers, sparse gradients, debug switches, input figures, the task and its test figures).

    `details["test_metrics"]` holds every test figure of the task (`train_step.task_figures`); `test_<metric>`
    the task's primary one (accuracy, auc or mae); `TrainResult.test_accuracy` is the accuracy where the task
    has one (None for regression).
    """
    from tfship.core.tasks import primary
    from tfship.pipeline.training.model import without_recompute

    train, splits = loop.train, loop.inputs.splits
    step = int(loop.step.numpy())
    test = data_inputs.evaluate(steps, splits.test, loop.task)
    metric = primary(loop.task).name
    specs = getattr(splits, "specs", ()) or ()
    details = {"xla": asdict(choice), "optimizer": train.optimizer, "schedule": train.schedule,
               "mixed_precision": train.mixed_precision, "strategy": loop.runtime.kind,
               "replicas": loop.runtime.replicas, "global_batch": loop.batch,
               "accumulation_steps": train.accumulation_steps,
               "optimizer_updates": int(loop.optimizer.iterations.numpy()),
               "deterministic": train.deterministic, "trainer": "tape_loop",
               "stopped_early": stopped_early, "resumed_from_step": start if loop.inputs.resume else None,
               "steps_per_second": round((step - start) / max(seconds, 1e-9), 2),
               "steps_per_execution": blocks.summary(), "checkpoints": dict(loop.saved),
               "notes": list(loop.notes), "step_kind": {"kind": steps.kind.name, "last": blocks.kind_metrics},
               "frozen": loop.frozen_summary(), "sparse_gradients": steps.sparse_gradients,
               "sparse_update_ops": steps.sparse_update_ops() if not train.run_eagerly else [],
               "debug": {"check_numerics": train.check_numerics, "assert_inputs": train.assert_inputs,
                         "run_eagerly": train.run_eagerly},
               "input": loop.meter.summary() | data_inputs.skipped_records(splits),
               "task": loop.task, "metric": metric, f"test_{metric}": test[metric], "test_metrics": test,
               "model_kind": loop.inputs.config.model.kind,
               "inputs": [s.name for s in specs] or [splits.input_name], "partial_batch": PARTIAL_BATCH}
    if getattr(splits, "stream", None):  # class names, counts and the scan, kept in the run folder (train.json)
        details["data"] = splits.summary()
    details["recompute"] = list(loop.inputs.config.model.recompute)
    return TrainResult(without_recompute(loop.model), tuple(history), steps.traces, test.get("accuracy"),
                       checkpoint_path, seconds, step, choice.jit_compile, details)
