"""The op policy (`core.op_policy`) at publish: a SavedModel that touches the host is refused by the export audit,
naming the op, the function and the signature that reaches it, and the pipeline never runs it (no marker file
is written, not by the re-export's load, the behaviour checks or the goldens). Plain models still pass."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.op_policy_models import ATTACKS, REFUSED_OP, save_asset_table, save_keras, save_module
from tests.saved_models import tf1_multi_meta_graph
from tfship.core import protocol
from tfship.core.errors import TfshipError
from tfship.core.op_policy import check_saved_model, parse_op_list, raise_if_refused
from tfship.signatures.audit import audit_saved_model

PASSING = ("plain", "print_stdout", "keras", "asset_table", "tf1")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{kind: SavedModel folder}, and the marker every attack would write (never written: nothing runs them)."""
    root = tmp_path_factory.mktemp("corpus")
    marker = root / "marker"
    folders = {kind: save_module(kind, root / kind, marker) for kind in (*ATTACKS, "plain", "print_stdout")}
    folders["keras"] = save_keras(root / "keras")
    folders["asset_table"] = save_asset_table(root / "asset_table", root / "vocabulary.txt")
    folders["tf1"] = tf1_multi_meta_graph(root / "tf1")
    assert not marker.exists()
    return folders, marker


@pytest.mark.parametrize("kind", ATTACKS)
def test_each_attack_is_refused_naming_op_function_and_signature(corpus, kind):
    folders, marker = corpus
    report = check_saved_model(folders[kind])
    assert not report.passed
    finding = next(f for f in report.refused if f.op == REFUSED_OP[kind])
    assert finding.where.startswith("function __inference_")
    reached = "__saved_model_init_op" if kind == "init_write" else "serving_default"
    assert reached in finding.reached_by, finding
    audit = audit_saved_model(folders[kind])
    assert not audit.passed
    line = next(v for v in audit.violations if REFUSED_OP[kind] in v)
    assert line.startswith(f"op policy: op {REFUSED_OP[kind]} (") and f"reached by {reached}" in line, line
    assert audit.to_json()["op_policy"]["passed"] is False
    with pytest.raises(TfshipError, match=rf"refused by the op policy.*op {REFUSED_OP[kind]}.*--allow-ops"):
        raise_if_refused(report, "--allow-ops")
    assert not marker.exists()


@pytest.mark.parametrize("kind", PASSING)
def test_plain_models_pass_with_their_saver(corpus, kind):
    folders, _ = corpus
    report = check_saved_model(folders[kind])
    assert report.passed, report.violations
    assert audit_saved_model(folders[kind]).to_json()["op_policy"]["passed"] is True
    if kind in ("plain", "keras", "tf1"):  # the saver's own checkpoint ops are there, and allowed
        ops = {n.op for g in protocol.SavedModel.FromString((folders[kind] / "saved_model.pb").read_bytes()
                                                             ).meta_graphs
               for nodes in [g.graph_def.node, *(f.node_def for f in g.graph_def.library.function)] for n in nodes}
        assert {"SaveV2", "RestoreV2"} <= ops


def test_print_to_stderr_passes_and_print_to_a_file_is_allowed_by_name(corpus):
    folders, _ = corpus
    report = check_saved_model(folders["print_file"], allow_ops=parse_op_list("PrintV2"))
    assert report.passed and [f.op for f in report.allowed] == ["PrintV2"]
    assert report.to_json()["allow_ops"] == ["PrintV2"] and "file://" in report.to_json()["allowed"][0]
    assert [f.op for f in report.side_effects("serving_default")] == ["PrintV2"]
    with pytest.raises(ValueError, match="not an op name"):
        parse_op_list("PrintV2,../x")


def test_checkpoint_ops_outside_the_saver_are_refused(tmp_path):
    import tensorflow as tf

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones((4, 2)))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            tf.raw_ops.SaveV2(prefix=str(tmp_path / "stolen"), tensor_names=["w"], shape_and_slices=[""],
                              tensors=[self.w.read_value()])
            return {"y": x @ self.w}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "sm"), signatures={"serving_default": model.serve})
    report = check_saved_model(tmp_path / "sm")
    (finding,) = report.refused
    assert finding.op == "SaveV2" and "outside the SavedModel's saver" in finding.reason
    assert "serving_default" in finding.reached_by
    assert not list(tmp_path.glob("stolen*"))


def test_assets_outside_the_version_are_refused(corpus, tmp_path):
    folders, _ = corpus
    linked = tmp_path / "linked"
    shutil.copytree(folders["asset_table"], linked)
    (asset,) = (linked / "assets").iterdir()
    asset.unlink()
    os.symlink("/etc/hostname", asset)
    assert any("is (or passes through) a link" in v for v in check_saved_model(linked).violations)
    moved = tmp_path / "moved"
    shutil.copytree(folders["asset_table"], moved)
    proto = protocol.SavedModel.FromString((moved / "saved_model.pb").read_bytes())
    proto.meta_graphs[0].asset_file_def[0].filename = "../../etc/hostname"
    (moved / "saved_model.pb").write_bytes(proto.SerializeToString())
    assert any("'../../etc/hostname' is not a file inside" in v for v in check_saved_model(moved).violations)


@pytest.mark.parametrize("kind", ["write", "init_write", "read"])
def test_the_pipeline_refuses_before_running_the_saved_model(corpus, kind, tmp_path):
    import tfship

    folders, marker = corpus
    x = np.random.default_rng(0).random((16, 4), dtype=np.float32)
    data = {"path": np.array(["/etc/passwd"] * 16)} if kind == "read" else {"x": x}
    with pytest.raises(TfshipError, match=rf"op policy.*{REFUSED_OP[kind]}"):
        tfship.ship(folders[kind], data | {"y": (x.sum(axis=1) > 2).astype(np.int64)}, repository=tmp_path / "models",
                    runs_dir=tmp_path / "runs", model_name="attack")
    (run,) = (p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    audit = json.loads((run / "audit.json").read_text())
    assert audit["passed"] is False and any(f"op {REFUSED_OP[kind]}" in v for v in audit["violations"])
    stateless = next(c for c in audit["behaviour"]["checks"] if c["name"] == "stateless")
    assert not stateless["passed"] and not stateless["ran"] and REFUSED_OP[kind] in stateless["detail"]
    assert not marker.exists()  # not at the re-export's load, nor by the behaviour checks, goldens or warm-up
    assert not (tmp_path / "models" / "attack").exists()
    assert not list(tmp_path.rglob("tfship_golden.npz")) and not list(tmp_path.rglob("tf_serving_warmup_requests"))


def test_a_keras_saved_model_passes_the_export_stage(corpus, tmp_path):
    from tfship.pipeline.config import load_config
    from tfship.pipeline.orchestration import steps
    from tfship.pipeline.orchestration.stages import RunFolder

    folders, _ = corpus
    np.savez(tmp_path / "data.npz", features=np.random.default_rng(1).random((16, 8), dtype=np.float32))
    config = load_config(None, {"export.allow_ops": ["PrintV2"]})
    run = RunFolder.create(tmp_path / "runs", "plain")
    outcome, _ = steps.export_user_stage(config, run, folders["keras"], tmp_path / "data.npz")
    assert outcome.audit.passed and outcome.behaviour.passed, (outcome.audit.violations, outcome.behaviour)
    audit = json.loads((run.root / "audit.json").read_text())
    assert audit["op_policy"] == {"passed": True, "allow_ops": ["PrintV2"], "violations": [], "allowed": []}


def test_a_keras_layer_that_writes_a_file_is_refused_before_anything_runs_it(tmp_path):
    import keras
    import tensorflow as tf

    import tfship

    marker = tmp_path / "marker"

    @keras.saving.register_keras_serializable("tfship_test_op_policy")
    class Writer(keras.layers.Layer):
        def call(self, x):
            tf.io.write_file(str(marker), "written by a layer")
            return x

    model = keras.Sequential([keras.Input((4,), name="x"), Writer(), keras.layers.Dense(2)], name="writer")
    x = np.random.default_rng(0).random((16, 4), dtype=np.float32)
    with pytest.raises(TfshipError, match=r"op policy: op WriteFile \('writer\S*/WriteFile'\) in function "
                                          r"__inference_\w+ touches the host's file system; reached by serving_default"):
        tfship.ship(model, (x, (x.sum(axis=1) > 2).astype(np.int64)), repository=tmp_path / "models",
                    runs_dir=tmp_path / "runs")
    assert not marker.exists() and not (tmp_path / "models" / "writer").exists()


@pytest.mark.slow
def test_an_allowed_op_is_published_served_and_on_record(corpus, tmp_path):
    import tfship

    folders, marker = corpus
    x = np.random.default_rng(0).random((32, 4), dtype=np.float32)
    result = tfship.ship(folders["print_file"], {"x": x, "y": (x.sum(axis=1) > 2).astype(np.int64)},
                         repository=tmp_path / "models", runs_dir=tmp_path / "runs", model_name="printer",
                         export={"allow_ops": ["PrintV2"]}, convert={"onnx": False, "tflite_modes": ["float32"]})
    assert result.artifact("saved_model").path is not None, result.status_line
    manifest = json.loads((tmp_path / "models" / "printer" / "1" / "manifest.json").read_text())
    assert manifest["allowed_ops"] == ["PrintV2"] and manifest["audit"]["op_policy"]["allowed"]
    stateless = next(c for c in manifest["audit"]["behaviour"]["checks"] if c["name"] == "stateless")
    assert stateless["passed"] and "allowed by export.allow_ops" in stateless["detail"]
    assert marker.exists()  # the allowed op ran (the behaviour checks, the serve-check server): on record, not hidden
    marker.unlink()


def test_every_function_and_every_meta_graph_is_judged(corpus, tmp_path):
    folders, _ = corpus
    written = protocol.SavedModel.FromString((folders["write"] / "saved_model.pb").read_bytes())
    writer = next(f for f in written.meta_graphs[0].graph_def.library.function
                  if any(n.op == "WriteFile" for n in f.node_def))
    unreachable = tmp_path / "unreachable"
    shutil.copytree(folders["plain"], unreachable)
    proto = protocol.SavedModel.FromString((unreachable / "saved_model.pb").read_bytes())
    hidden = proto.meta_graphs[0].graph_def.library.function.add()
    hidden.CopyFrom(writer)
    hidden.signature.name = "__inference_nobody_calls_me_1"
    (unreachable / "saved_model.pb").write_bytes(proto.SerializeToString())
    (finding,) = check_saved_model(unreachable).refused
    assert (finding.op, finding.where, finding.reached_by) == ("WriteFile", "function __inference_nobody_calls_me_1", ())
    assert "reached by nothing (still refused: it is in the file)" in finding.describe()

    train_graph = tmp_path / "train_graph"
    shutil.copytree(folders["tf1"], train_graph)
    proto = protocol.SavedModel.FromString((train_graph / "saved_model.pb").read_bytes())
    train = next(g for g in proto.meta_graphs if list(g.meta_info_def.tags) == ["train"])
    train.graph_def.node.add(name="input/ReadFile", op="ReadFile", input=["save/Const"])
    (train_graph / "saved_model.pb").write_bytes(proto.SerializeToString())
    (finding,) = check_saved_model(train_graph).refused
    assert (finding.op, finding.where, finding.tags) == ("ReadFile", "graph", ("train",))
    assert "of MetaGraph ['train']" in finding.describe()
    assert check_saved_model(train_graph, tags=("serve",)).passed  # a re-export's source: only what is loaded


def test_a_tf1_graph_reading_its_input_path_is_refused_in_the_graph(tmp_path):
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
        path = tf.compat.v1.placeholder(tf.string, [], name="path")
        contents = tf.io.read_file(path)
        builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "tf1_read"))
        signature = tf.compat.v1.saved_model.predict_signature_def({"path": path}, {"contents": contents})
        builder.add_meta_graph_and_variables(session, ["serve"], {"serving_default": signature})
        builder.save()
    (finding,) = check_saved_model(tmp_path / "tf1_read").refused
    assert (finding.op, finding.where, finding.reached_by) == ("ReadFile", "graph", ("serving_default",))


def test_the_policy_needs_no_tensorflow(corpus):
    import subprocess
    import sys

    folders, _ = corpus
    script = ("import sys; from tfship.core.op_policy import check_saved_model; "
              f"report = check_saved_model({str(folders['write'])!r}); "
              "assert not report.passed and 'tensorflow' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def test_a_saver_restoring_another_checkpoint_is_refused(corpus, tmp_path):
    folders, _ = corpus
    other = tmp_path / "other_checkpoint"
    shutil.copytree(folders["tf1"], other)
    proto = protocol.SavedModel.FromString((other / "saved_model.pb").read_bytes())
    serve = next(g for g in proto.meta_graphs if list(g.meta_info_def.tags) == ["serve"])
    prefix = serve.graph_def.node.add(name="elsewhere", op="Const")
    prefix.attr["dtype"].type = 7  # DT_STRING
    prefix.attr["value"].tensor.dtype = 7
    prefix.attr["value"].tensor.string_val.append(b"/srv/another_tenant/variables/variables")
    restore = next(n for n in serve.graph_def.node if n.name == f"{serve.saver_def.restore_op_name.split('/')[0]}"
                   "/RestoreV2")
    restore.input[0] = "elsewhere"
    (other / "saved_model.pb").write_bytes(proto.SerializeToString())
    (finding,) = check_saved_model(other).refused
    assert (finding.op, finding.where, finding.reached_by) == ("RestoreV2", "graph", ("saver",))
    assert "file prefix is not made from the saver's file name 'save_1/Const'" in finding.reason


def test_a_table_file_name_bound_to_a_variable_is_refused(corpus, tmp_path):
    """The object graph binds an initializer's captured file name; a crafted file binds a variable (its value is
    the checkpoint's: any path) instead of the asset."""
    folders, _ = corpus
    crafted = tmp_path / "crafted"
    shutil.copytree(folders["asset_table"], crafted)
    proto = protocol.SavedModel.FromString((crafted / "saved_model.pb").read_bytes())
    objects = proto.meta_graphs[0].object_graph_def
    asset = next(i for i, n in enumerate(objects.nodes) if n.WhichOneof("kind") == "asset")
    variable = objects.nodes.add()
    variable.variable.name = "stolen_path"
    variable.variable.dtype = 7  # DT_STRING
    (initializer,) = [f for name, f in objects.concrete_functions.items() if "initializer" in name]
    initializer.bound_inputs[list(initializer.bound_inputs).index(asset)] = len(objects.nodes) - 1
    (crafted / "saved_model.pb").write_bytes(proto.SerializeToString())
    (finding,) = check_saved_model(crafted).refused
    assert finding.op == "InitializeTableFromTextFileV2"
    assert "a variable of the object graph bound to function __inference__initializer" in finding.reason
