"""tests/deploy: `docker`-marked tests run only when asked for (`-m docker`, as `make docker-test` does).

They need a Docker engine and build both images, so a plain `pytest` run deselects them; pytest
reports them as deselected (never skipped). Any -m expression that names `docker` selects by
itself, as usual.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "docker" in (config.option.markexpr or ""):
        return
    deselected = [item for item in items if item.get_closest_marker("docker") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("docker") is None]
