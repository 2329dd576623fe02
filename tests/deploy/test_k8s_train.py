"""deploy/k8s/train: the multi-worker training Job, its headless Service, NetworkPolicy and volume agree with
each other, and the TF_CONFIG each pod builds (the manifest's own command, run here for every index) names
the pods the Service publishes. The manifests' schema check is test_k8s_manifests.py's (every manifest)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tfship.pipeline.training.cluster import parse_tf_config

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "deploy" / "k8s" / "train"
KUBERNETES_VERSION = "1.30"


def _kind(kind: str) -> dict:
    docs = [d for p in sorted(TRAIN.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == kind]
    assert len(docs) == 1, kind
    return docs[0]


def pod_env(job: dict) -> dict[str, str]:
    """The training container's environment as the manifest sets it."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_train_manifests_validate_strictly():
    for kind in ("Job", "Service", "NetworkPolicy", "PersistentVolumeClaim"):
        kubernetes_validate.validate(_kind(kind), KUBERNETES_VERSION, strict=True)


def test_job_service_and_policy_agree():
    job, service, policy = _kind("Job"), _kind("Service"), _kind("NetworkPolicy")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    env = pod_env(job)
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] \
        == int(env["TFSHIP_TRAIN_WORKERS"])
    assert pod["subdomain"] == service["metadata"]["name"] == env["TFSHIP_TRAIN_SERVICE"]
    assert job["metadata"]["name"] == env["TFSHIP_TRAIN_JOB"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    port = int(env["TFSHIP_TRAIN_PORT"])
    (container,) = pod["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [port] == [p["port"] for p in service["spec"]["ports"]]
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [port]
    assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()
    assert container["image"] == "tfship:train" and pod["restartPolicy"] == "Never"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claim = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
    assert claim[mounts[env["TFSHIP_WORK"]]] == _kind("PersistentVolumeClaim")["metadata"]["name"]


@pytest.mark.parametrize("index", [0, 1])
def test_each_pod_builds_the_tf_config_of_its_index(index):
    job = _kind("Job")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    (command,) = re.findall(r'TF_CONFIG="\$\((.+?)\)"', script)
    assert command == "python -m tfship.pipeline.training.indexed_job"
    env = {**os.environ, **pod_env(job), "JOB_COMPLETION_INDEX": str(index), "PYTHONPATH": str(ROOT)}
    printed = subprocess.run([sys.executable, *command.split()[1:]], env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    cluster = parse_tf_config(printed)
    name, service, port = env["TFSHIP_TRAIN_JOB"], env["TFSHIP_TRAIN_SERVICE"], env["TFSHIP_TRAIN_PORT"]
    assert [t.address for t in cluster.tasks] == [f"{name}-{i}.{service}:{port}" for i in range(2)]
    assert cluster.me.index == index and cluster.is_chief == (index == 0)


def test_an_incomplete_pod_environment_is_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFSHIP_", "JOB_COMPLETION"))}
    done = subprocess.run([sys.executable, "-m", "tfship.pipeline.training.indexed_job"], capture_output=True,
                          text=True, timeout=60, env={**env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "JOB_COMPLETION_INDEX" in done.stderr
