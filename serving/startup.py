"""What a server start needs besides its ports: the models to serve (`--model-config-file` and its poll, or
`--repository` / `--model_base_path`), the batching wrapper, and the shadows (`--shadow`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tfship.core.errors import ConfigError, TfshipError
from tfship.serving.dataplane.manager import ModelManager
from tfship.serving.dataplane.model_config import (
    ModelConfig,
    check_model_name,
    from_repository,
    parse_model_server_config,
)
from tfship.serving.operations.metrics import Metrics
from tfship.serving.settings import ServerSettings
from tfship.serving.storage.filesystem import read_text

log = logging.getLogger(__name__)


def model_configs(settings: ServerSettings) -> list[ModelConfig]:
    """Models to serve: `--model-config-file`, else `--repository` + `--model-name`; raises `ConfigError`."""
    if settings.model_config_file:
        try:
            text = read_text(settings.model_config_file)
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read --model-config-file {settings.model_config_file}: {err}") from err
        return parse_model_server_config(text, str(settings.model_config_file))
    if settings.model_base_path:  # TF Serving's --model_name + --model_base_path (the model's own folder)
        name = check_model_name(settings.model_name)
        return [ModelConfig(name=name, base_path=settings.model_base_path)]
    if settings.repository and settings.model_name:
        return from_repository(settings.repository, settings.model_name)
    raise ConfigError("give --model-config-file, --model_base_path (and --model_name), or --repository and "
                      "--model-name")


async def poll_model_config_file(settings: ServerSettings, manager: ModelManager) -> None:
    """Re-read `--model-config-file` every `--model_config_file_poll_wait_seconds` and apply it when its text
    changed (TF Serving's behaviour); a file that does not parse is logged and the running config kept.
    """
    path, interval = settings.model_config_file, settings.model_config_file_poll_wait_seconds
    try:
        last = await asyncio.to_thread(read_text, path)
    except (OSError, UnicodeDecodeError):
        last = ""
    while True:
        await asyncio.sleep(interval)
        try:
            text = await asyncio.to_thread(read_text, path)  # a file, or an s3:// object (a network call)
        except (OSError, UnicodeDecodeError) as err:
            log.error("cannot read --model-config-file %s; the running config stays: %s", path, err)
            continue
        if text == last:
            continue
        last = text  # a bad file is reported once, not on every poll
        try:
            configs = parse_model_server_config(text, str(path))
            await manager.apply_config(configs)
        except TfshipError as err:
            log.error("--model-config-file %s not applied; the running config stays: %s", path, err)
            continue
        log.info("applied the changed --model-config-file %s: models %s", path, [c.name for c in configs])


def runtime_wrapper(settings: ServerSettings, metrics: Metrics):
    """`Batched` around each runtime under --enable-batching / --batching-parameters-file, else None."""
    if not (settings.enable_batching or settings.batching_parameters_file):
        return None
    from tfship.serving.dataplane.batching import Batched, BatchingParameters

    params = (BatchingParameters.from_file(settings.batching_parameters_file)
              if settings.batching_parameters_file else BatchingParameters())
    return lambda runtime: Batched(runtime, params, metrics, settings.batch_thread_nice)


def start_shadows(settings: ServerSettings, manager: ModelManager, metrics: Metrics, grpc_port: int):
    """`serving.dataplane.shadow.Shadows` for `--shadow` (None without); its metrics join the registry.

    Raises:
        ConfigError: a bad --shadow value, a shadow of a model that is not served, or a target that names no
            loaded version (`check_shadow_targets`).
    """
    if not settings.shadow:
        return None
    import tempfile

    from tfship.core.parity import PairBound
    from tfship.serving.dataplane.shadow import ShadowOptions, Shadows, parse_shadow
    from tfship.serving.dataplane.shadow_metrics import ShadowCollector

    targets = dict(parse_shadow(text) for text in settings.shadow)
    unknown = sorted(m for m in targets if not manager.is_configured(m))
    if unknown:
        raise ConfigError(f"--shadow names model(s) {unknown} that are not served; served: {manager.model_names()}")
    check_shadow_targets(manager, targets)
    # the default folder is this server's own: removed when it stops (a given --shadow-report-dir is kept)
    report_dir = settings.shadow_report_dir or Path(tempfile.gettempdir()) / "tfship-shadow" / str(grpc_port)
    shadows = Shadows(manager, targets, ShadowOptions(
        rate=settings.shadow_rate, queue_size=settings.shadow_queue_size, queue_bytes=settings.shadow_queue_bytes,
        workers=settings.shadow_workers, timeout_s=settings.shadow_timeout_s, keep_inputs=settings.shadow_keep_inputs,
        bound=PairBound(settings.shadow_atol, settings.shadow_rtol), report_dir=report_dir,
        remove_report_dir=settings.shadow_report_dir is None))
    metrics.registry.register(ShadowCollector(shadows))
    log.info("shadowing %s at rate %g; report parts in %s", {m: str(t) for m, t in targets.items()},
             settings.shadow_rate, report_dir)
    return shadows


def check_shadow_targets(manager: ModelManager, targets: dict) -> None:
    """Refuse at start a `--shadow MODEL=TARGET` whose target resolves to no loaded version now.

    Called once every configured model has loaded (TF Serving's start order), so a version the model's version
    policy loads is there: a version number outside it, or not in the folder, would otherwise start silently
    and count every sampled pair as a shadow error (NOT_FOUND). A version published later is shadowed through a
    label (`canary`), which the models.config moves when it is loaded.

    Args:
        manager: the server's `ModelManager`, models loaded.
        targets: {model: `ModelRef`} (`serving.dataplane.shadow.parse_shadow`).

    Raises:
        ConfigError: names the flag value, why it resolves to nothing and the versions loaded.
    """
    for model, ref in targets.items():
        try:
            manager.resolve(ref)
        except TfshipError as err:
            target = ref.version if ref.version is not None else ref.label
            raise ConfigError(f"--shadow {model}={target} names no loaded version of model {model}: {err}; shadow a "
                              "loaded version, or a label (e.g. canary) that models.config moves to the candidate "
                              "once it loads") from None
