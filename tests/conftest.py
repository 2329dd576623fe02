"""Suite-wide order: the files holding slow tests (marker `slow`) run first.

`make test` spreads whole files over pytest-xdist workers (`--dist loadfile`) in collection order. With the
slow files first, the minutes-long ones start at once and the short files fill the end, so the workers finish
together instead of one running the longest files alone. Within a file the order is unchanged; the sort is
stable, so every worker collects the same order (xdist requires it).
"""

from __future__ import annotations


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
    slow_files = {_file(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file(item) not in slow_files)
