"""docs/training.md's "Train on your own TFRecords" recipe, run as written: its Python block writes the GZIP
shards, its TOML block is the config, and its command trains on them (the `train` stage of the command)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def recipe_blocks() -> dict[str, str]:
    """{name: code} of the fenced blocks marked `<!-- recipe: name -->` in docs/training.md."""
    text = (REPO_ROOT / "docs" / "training.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- recipe: (\S+) -->\n```\w*\n(.*?)```", text, re.S)}


def test_the_tfrecord_recipe_trains_as_written(tmp_path):
    blocks = recipe_blocks()
    assert set(blocks) == {"make_records.py", "my-records.toml", "command"}
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    (tmp_path / "make_records.py").write_text(blocks["make_records.py"])
    subprocess.run([sys.executable, "make_records.py"], cwd=tmp_path, check=True, timeout=300, env=env)
    assert len(list(tmp_path.glob("records-*.tfrecord.gz"))) == 4
    (tmp_path / "my-records.toml").write_text(blocks["my-records.toml"])
    command = blocks["command"].split("#")[0].split()
    assert command[:2] == ["tfship", "run"]
    tfship = str(Path(sys.executable).with_name("tfship"))
    done = subprocess.run([tfship, "train", *command[2:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    train = json.loads((run / "train.json").read_text())
    assert train["test_accuracy"] > 0.9  # the digits CNN, 10 epochs: ~0.97
    assert train["input"]["records_per_second"] > 0 and train["input"]["skipped_records"] == 0
    data = train["data"]  # the data stage's summary: class names, counts, the scan
    assert data["class_names"] == [str(d) for d in range(10)]
    assert data["streaming"]["split"] == "hash of the record bytes"
    assert data["train"] + data["validation"] + data["test"] == 1797
