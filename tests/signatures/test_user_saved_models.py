"""Re-exporting users' SavedModels: only the variables the serving function reads are kept (training state
left behind, then judged by the audit), and the `serve` MetaGraph is picked from TF1-style exports with
several (or the one `tags` names)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.saved_models import tf1_expected, tf1_multi_meta_graph, wrapped_keras_after_fit
from tfship.core.errors import ContractError
from tfship.core.saved_model import read_signatures
from tfship.pipeline.conversion.artifacts import saved_model_runner
from tfship.signatures.audit import audit_saved_model
from tfship.signatures.export import build_savedmodel_module, export_saved_model

FEATURES = np.random.default_rng(1).random((7, 4), dtype=np.float32)


def _reexport(source, folder, tags=("serve",)):
    contract = read_signatures(source, tags)["serving_default"]
    module = build_savedmodel_module(source, contract, tags)
    export_saved_model(module, contract, folder)
    return module, audit_saved_model(folder)


def test_training_state_of_a_wrapped_keras_model_is_left_behind(tmp_path):
    source = wrapped_keras_after_fit(tmp_path / "source")
    module, audit = _reexport(source, tmp_path / "out")
    assert audit.passed, audit.violations
    kept = [v["name"].split("/")[-1] for v in audit.to_json()["variables"]]
    assert sorted(kept) == ["bias", "bias", "kernel", "kernel"]  # the two Dense layers, nothing else
    dropped = " ".join(module.dropped_variables)
    assert re.search(r"adam(_\d+)?/iteration", dropped) and re.search(r"adam(_\d+)?/learning_rate", dropped)
    assert len(module.dropped_variables) == 10  # iteration, learning_rate, 2 slots x 4 weights
    x = np.random.default_rng(2).random((5, 6), dtype=np.float32)
    np.testing.assert_array_equal(saved_model_runner(tmp_path / "out")({"features": x})["logits"],
                                  saved_model_runner(source)({"features": x})["logits"])


def test_training_state_the_serving_function_reads_is_kept_and_refused_by_the_audit(tmp_path):
    source = wrapped_keras_after_fit(tmp_path / "source", uses_step=True)
    module, audit = _reexport(source, tmp_path / "out")
    assert not audit.passed
    assert any(re.search(r"'adam(_\d+)?/iteration' looks like optimizer or training state", v)
               for v in audit.violations), audit.violations
    assert not any("iteration" in name for name in module.dropped_variables)


def test_tf1_export_with_serve_train_and_eval_meta_graphs(tmp_path):
    source = tf1_multi_meta_graph(tmp_path / "tf1")
    assert set(read_signatures(source)) == {"serving_default"}
    assert set(read_signatures(source, ("eval",))) == {"eval"}
    with pytest.raises(ContractError, match=r"no MetaGraph tagged \['gpu', 'serve'\].*\[\['train'\], \['serve'\], "
                                             r"\['eval'\]\].*--tags"):
        read_signatures(source, ("serve", "gpu"))
    module, audit = _reexport(source, tmp_path / "out")
    assert audit.passed, audit.violations
    assert sorted(v["name"] for v in audit.to_json()["variables"]) == ["b", "w"]
    assert {"global_step:0", "w/Adam:0", "beta1_power:0"} <= set(module.dropped_variables)
    got = saved_model_runner(tmp_path / "out")({"features": FEATURES})
    expected = tf1_expected(FEATURES)
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["class_id"], expected["class_id"])
