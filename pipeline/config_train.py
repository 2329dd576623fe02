"""The `[train]` and `[train.step]` tables of the pipeline config (`pipeline.config.PipelineConfig.train`): the one
training loop's settings (`pipeline.training.train`) and the step kind's (`pipeline.training.step_kinds`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tfship.pipeline.config_section import LocalPath
from tfship.pipeline.config_section import Section as _Section


class StepSection(_Section):
    """What the train step computes (`pipeline.step_kinds`; docs/training.md, one section per kind)."""

    kind: Literal["standard", "multi_loss", "gradient_penalty", "distillation", "adversarial", "custom_loss",
                  "factory"] = Field(default="standard", description="Step kind: the loss and the tape work of one "
                                     "step.")
    factory: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                                description="factory: `module:function(settings) -> step kind` (your own tape step).")
    losses: dict[Literal["cross_entropy", "label_smoothing", "logit_l2", "confidence_penalty"], float] = Field(
        default={"cross_entropy": 1.0}, description="multi_loss: {loss name: weight}, all from one forward pass.")
    label_smoothing: float = Field(default=0.1, ge=0.0, lt=1.0, description="multi_loss: smoothing of "
                                   "`label_smoothing`.")
    penalty_weight: float = Field(default=0.1, ge=0.0, description="gradient_penalty: weight of mean ||dCE/dx||^2.")
    teacher: LocalPath | None = Field(default=None, description="distillation: the teacher, a .keras file (frozen).")
    temperature: float = Field(default=2.0, gt=0.0, description="distillation: softmax temperature.")
    alpha: float = Field(default=0.5, ge=0.0, le=1.0, description="distillation: weight of the hard-label "
                         "cross-entropy.")
    epsilon: float = Field(default=0.05, gt=0.0, description="adversarial: FGSM step in input units.")
    adversarial_weight: float = Field(default=0.5, ge=0.0, le=1.0, description="adversarial: weight of the FGSM loss.")
    loss: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                             description="custom_loss: `module:function(y_true, y_pred, model) -> scalar`.")


class TrainSection(_Section):
    """The custom training loop (`pipeline.training.train`)."""

    step: StepSection = Field(default=StepSection(), description="The step kind and its settings ([train.step]).")
    freeze: tuple[str, ...] = Field(default=(), description="Layer names or fnmatch patterns not trained (trainable = "
                                    "False: no gradient, no optimizer slots; BatchNormalization in inference mode).")
    check_numerics: bool = Field(default=False, description="Debug: tf.debugging.enable_check_numerics while training "
                                 "(the first op giving NaN/Inf is named with its stack; step runs without XLA).")
    assert_inputs: bool = Field(default=False, description="Debug: tf.debugging.assert_* on every training batch "
                                "(finite inputs, shape, labels in [0, classes)).")

    epochs: int = Field(default=15, ge=1, le=10000, description="Passes over the training split.")
    learning_rate: float = Field(default=3e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(default="adam", description="Optimizer (sgd uses momentum).")
    weight_decay: float = Field(default=1e-4, ge=0.0, description="AdamW decoupled weight decay.")
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    schedule: Literal["constant", "cosine"] = Field(default="constant", description="Learning-rate schedule after "
                                                    "warm-up.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up from 0 over this many optimizer steps.")
    clip_global_norm: float | None = Field(default=5.0, ge=0.0, description="Clip gradients to this global norm; 0: "
                                           "off (clipping densifies sparse embedding gradients).")
    accumulation_steps: int = Field(default=1, ge=1, le=1024, description="Average gradients over N steps per update.")
    mixed_precision: Literal["float32", "mixed_bfloat16", "mixed_float16"] = Field(
        default="float32", description="Keras dtype policy of the built-in layers; float16 adds a LossScaleOptimizer.")
    jit_compile: bool | Literal["auto"] = Field(
        default="auto", description="XLA for the train step: auto times a few steps both ways and keeps the faster.")
    xla_probe_steps: int = Field(default=5, ge=1, le=1000, description="Timed steps per variant for jit_compile=auto.")
    early_stopping_patience: int | None = Field(default=None, ge=1, description="Stop after N epochs without "
                                                "improvement.")
    early_stopping_metric: Literal["validation_accuracy", "validation_loss", "validation_metric"] = Field(
        default="validation_accuracy", description="Metric watched by early stopping; validation_metric: the task's "
        "own (accuracy, AUC, or MAE for regression, lower is better).")
    early_stopping_min_delta: float = Field(default=0.0, ge=0.0, description="Smallest change that counts as "
                                            "improvement.")
    deterministic: bool = Field(default=False, description="Seeds + tf.config.experimental.enable_op_determinism.")
    run_eagerly: bool = Field(default=False, description="Debug: tf.config.run_functions_eagerly(True) while training.")
    checkpoint_every_steps: int = Field(default=0, ge=0, description="CheckpointManager period in steps; 0: at the "
                                        "end.")
    checkpoint_every_s: float = Field(default=0.0, ge=0.0, description="Also save a checkpoint when this many seconds "
                                      "passed since the last one (at the end of the K-step block under way); 0: off.")
    steps_per_execution: Annotated[int, Field(ge=1, le=100_000)] | Literal["auto"] = Field(
        default="auto", description="Train steps per call of the compiled block (one trip to the host per block: loss, "
        "figures and flags are read once per K steps); auto: as many as take about 0.1 s, re-measured each block.")
    keep_checkpoints: int = Field(default=3, ge=1, description="Checkpoints kept by the CheckpointManager.")
    tensorboard: bool = Field(default=True, description="Write TensorBoard events into <run>/tensorboard.")
    log_every_steps: int = Field(default=10, ge=1, description="TensorBoard scalar period in steps.")
    progress_every_s: float = Field(default=5.0, gt=0.0, description="Seconds between progress lines (step, epoch, "
                                    "loss, records/s, input-wait share, ETA) when stderr is not a terminal.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps (a cap under the "
                                  "epochs).")
    histogram_every_steps: int = Field(default=100, ge=1, description="TensorBoard weight-histogram period in steps.")
    strategy: Literal["default", "mirrored", "multi_worker"] = Field(
        default="default", description="tf.distribute strategy; multi_worker reads the cluster from TF_CONFIG.")
    cluster_timeout_s: float = Field(
        default=300.0, gt=0.0, le=86400.0, description="multi_worker: seconds to wait for peers (connecting, or a step "
        "or checkpoint stalled) before giving up naming the missing task and address; also bounds a SIGTERM stop.")
