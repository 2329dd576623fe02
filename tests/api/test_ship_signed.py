"""`tfship.ship(..., publish={"signing_key": ...})` (issue 40): the whole pipeline's publish stage signs the version
it publishes, and the signature verifies for that model name and version only (`serving.storage.signed`)."""

from __future__ import annotations

import numpy as np
import pytest

import tfship
from tests.signing_keys import ec_key_pair
from tfship.serving.storage.signed import SIGNATURE_FILE, SignatureError, verify_version


@pytest.mark.slow
def test_the_publish_stage_signs_with_publish_signing_key(tmp_path):
    import keras

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 3), dtype=np.float32), rng.integers(0, 2, 64).astype(np.int64)
    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(inputs), name="signed")
    private, public, key_id = ec_key_pair(tmp_path)
    result = tfship.ship(model, (x, y), runs_dir=tmp_path / "runs", repository=tmp_path / "models",
                         convert={"tflite_modes": ["float32"]}, publish={"signing_key": str(private)})
    assert result.ok, result.errors
    version_dir = result.published
    assert (version_dir / SIGNATURE_FILE).is_file()
    record = verify_version(version_dir, public, version_dir.parent.name, int(version_dir.name))
    assert record.key_id == key_id and record.signed_files == len(
        [p for p in version_dir.rglob("*") if p.is_file() and p.name != SIGNATURE_FILE])
    with pytest.raises(SignatureError, match="substituted version"):
        verify_version(version_dir, public, "another_model", int(version_dir.name))
