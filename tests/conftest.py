"""Suite-wide: TensorFlow's kernels as the server runs them, and the files holding slow tests run first.

`make test` spreads whole files over pytest-xdist workers (`--dist loadfile`) in collection order. With the
slow files first, the minutes-long ones start at once and the short files fill the end, so the workers finish
together instead of one running the longest files alone. Within a file the order is unchanged; the sort is
stable, so every worker collects the same order (xdist requires it).
"""

from __future__ import annotations

import os

# The model server runs TensorFlow without oneDNN (serving.runtimes.tf_env); tests that compare its answers
# bit for bit with a SavedModel called in the test process need the same kernels here. Set before any test
# module imports TensorFlow (this file is imported first, by every xdist worker); the children inherit it.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
    slow_files = {_file(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file(item) not in slow_files)
