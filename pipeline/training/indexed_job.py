"""`TF_CONFIG` for a pod of a Kubernetes Indexed Job (deploy/k8s/train/job.yaml).

An Indexed Job gives pod i the environment variable `JOB_COMPLETION_INDEX=i` and the hostname `<job>-<i>`;
with `subdomain: <service>` and a headless Service of that name, every pod is reachable as
`<job>-<i>.<service>` (DNS) inside the namespace. `tf_config_for_pod` turns that into the TF_CONFIG of
worker i in a cluster of `workers` such addresses, all on one port; worker 0 is the chief.

`python -m tfship.pipeline.training.indexed_job` prints it from the environment the manifest sets
(`JOB_COMPLETION_INDEX`, `TFSHIP_TRAIN_WORKERS`, `TFSHIP_TRAIN_JOB`, `TFSHIP_TRAIN_SERVICE`,
`TFSHIP_TRAIN_PORT`); the container's command exports it before `tfship run`.
"""

from __future__ import annotations

import json
import os
import sys

from tfship.core.errors import ConfigError

ENV = ("JOB_COMPLETION_INDEX", "TFSHIP_TRAIN_WORKERS", "TFSHIP_TRAIN_JOB", "TFSHIP_TRAIN_SERVICE",
       "TFSHIP_TRAIN_PORT")


def tf_config_for_pod(index: int, workers: int, job: str, service: str, port: int) -> str:
    """The TF_CONFIG JSON of pod `index` (0-based) of an Indexed Job of `workers` pods.

    Raises:
        ConfigError: index outside 0..workers-1, workers < 1 or a port outside 1..65535.
    """
    if workers < 1 or not 0 <= index < workers:
        raise ConfigError(f"Indexed Job: pod index {index} is outside 0..{workers - 1} ({workers} workers)")
    if not 1 <= port <= 65535:
        raise ConfigError(f"Indexed Job: port {port} is outside 1..65535")
    addresses = [f"{job}-{i}.{service}:{port}" for i in range(workers)]
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def tf_config_from_environment(environ: dict[str, str] | None = None) -> str:
    """`tf_config_for_pod` from the variables in `ENV` (default: this process's environment).

    Raises:
        ConfigError: a variable missing or not an integer where one is expected.
    """
    environ = dict(os.environ if environ is None else environ)
    missing = [name for name in ENV if not environ.get(name)]
    if missing:
        raise ConfigError(f"Indexed Job: environment variable(s) {missing} not set (the manifest sets them)")
    try:
        index, workers, port = (int(environ[n]) for n in ("JOB_COMPLETION_INDEX", "TFSHIP_TRAIN_WORKERS",
                                                           "TFSHIP_TRAIN_PORT"))
    except ValueError as err:
        raise ConfigError(f"Indexed Job: {err}") from None
    return tf_config_for_pod(index, workers, environ["TFSHIP_TRAIN_JOB"], environ["TFSHIP_TRAIN_SERVICE"], port)


def main() -> int:
    """Print the pod's TF_CONFIG; exit 2 with one line on stderr when the environment is incomplete."""
    try:
        print(tf_config_from_environment())
    except ConfigError as err:
        print(f"tfship indexed_job: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
