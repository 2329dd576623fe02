"""The train stage: train (or resume) the config's model, save `model.keras` and `train.json`."""

from __future__ import annotations

from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.data.splits import DatasetSplits
from tfship.pipeline.orchestration.records import TRAIN, TrainRecord
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.pipeline.training.train import TrainInputs, TrainResult, train_model


def train_step_stage(config: PipelineConfig, run: RunFolder, splits: DatasetSplits, progress=None,
                     resume: bool = False) -> TrainResult:
    """Train (or resume from `checkpoints/`), save `model.keras` and `train.json`; events go to
    `tensorboard/`, event lines to `logs/train.log` (see train_model for the errors raised).
    """
    log_file = run.root / "logs" / "train.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        with log_file.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        if progress is not None:
            progress.console.print(line, highlight=False, markup=False)

    result = train_model(TrainInputs(config, splits, run.checkpoints, run.root / "tensorboard", resume, log), progress)
    result.model.save(run.root / "model.keras")
    TRAIN.save(run, TrainRecord.from_result(result))
    return result
