"""The digits pipeline's run publishes into a bucket, and a server serving that bucket answers as the local
version does (`make serve` against s3://)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship
from tests.s3_server import bucket, s3_endpoint, s3_env  # noqa: F401 - fixtures
from tfship.core.locations import BucketUrl
from tfship.serving.launcher import ServerProcess
from tfship.serving.storage.filesystem import open_filesystem
from tfship.serving.tfs.client import PredictClient

pytestmark = pytest.mark.slow


def test_pipeline_run_publishes_to_a_bucket_and_serves_from_it(pipeline_run, bucket, s3_env, tmp_path):  # noqa: F811
    repository = BucketUrl(f"s3://{bucket}/models")
    done = run_tfship("publish", "--run", str(pipeline_run["run"]), "--repository", str(repository))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    manifest = json.loads(open_filesystem(repository).cat_file(f"{bucket}/models/digits/1/manifest.json"))
    assert manifest["version"] == 1 and manifest["repository"] == str(repository)
    x = np.random.default_rng(0).random((3, 8, 8, 1), dtype=np.float32)
    answers = []
    for source in (repository, pipeline_run["repository"]):
        env = {**s3_env, "TFSHIP_MODEL_CACHE_DIR": str(tmp_path / "cache")}
        with ServerProcess(source, "digits", "saved_model", ["--rest-port", "-1"], env=env) as server:
            answers.append(PredictClient(server.grpc_target).predict("digits", {"image": x})["probabilities"])
    np.testing.assert_array_equal(answers[0], answers[1])


def test_unsupported_scheme_is_refused_before_anything_runs(tmp_path):
    done = run_tfship("publish", "--repository", "gs://bucket/models", cwd=tmp_path)
    assert done.returncode == 2 and "argument --repository: 'gs://bucket/models' uses the URL scheme gs://" in \
        done.stderr
    assert list(tmp_path.iterdir()) == []
