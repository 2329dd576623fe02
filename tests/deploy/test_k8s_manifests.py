"""deploy/k8s: every manifest validates against the Kubernetes (or KServe) schema, and they agree.

Kubernetes kinds are checked strictly (unknown fields fail) with kubernetes-validate's bundled
schemas; the KServe InferenceService with tests/deploy/schemas/, whose containers and volumes
refer to the same Kubernetes definitions. Fast, no cluster and no Docker needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import importlib_resources
import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"  # oldest version we promise; native gRPC probes are GA since 1.27
KSERVE_SCHEMA = Path(__file__).parent / "schemas" / "inferenceservice-serving.kserve.io-v1beta1.json"
GRPC_PORT, REST_PORT, METRICS_PORT = 8500, 8501, 9090
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")
KUSTOMIZATIONS = sorted(K8S.rglob("kustomization.yaml"))


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _all_docs() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in MANIFESTS for doc in _docs(path)]


def _find(variant: str, kind: str) -> dict:
    docs = [doc for doc in _docs_in(K8S / variant) if doc["kind"] == kind]
    assert len(docs) == 1, f"{variant}: expected one {kind}, found {len(docs)}"
    return docs[0]


def _docs_in(folder: Path) -> list[dict]:
    return [doc for path in sorted(folder.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in _docs(path)]


def _kserve_validator() -> jsonschema.Draft202012Validator:
    version_dir = f"v{kubernetes_validate.utils.latest_version()}-local-strict"
    definitions_file = (importlib_resources.files("kubernetes_validate") / "kubernetes-json-schema"
                        / version_dir / "_definitions.json")
    definitions = Resource.from_contents(json.loads(definitions_file.read_text()))
    schema = json.loads(KSERVE_SCHEMA.read_text())
    registry = Registry().with_resources([(definitions.id(), definitions)])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def test_manifests_found() -> None:
    kinds = sorted(doc["kind"] for _, doc in _all_docs())
    assert kinds == sorted(["Deployment", "Deployment", "Deployment", "Service", "Service", "Service",
                            "HorizontalPodAutoscaler", "HorizontalPodAutoscaler", "PersistentVolumeClaim",
                            "InferenceService",
                            "Job", "Service", "NetworkPolicy", "PersistentVolumeClaim"])  # train/


def test_bucket_variant_reads_the_bucket_with_secret_credentials_and_no_claim() -> None:
    pod = _find("bucket", "Deployment")["spec"]["template"]["spec"]
    server = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["MODEL_BASE_PATH"].startswith("s3://") and env["TFSHIP_MODEL_CACHE_DIR"] == "/cache"
    assert server["envFrom"] == [{"secretRef": {"name": "tfship-bucket-credentials"}}]
    assert any(a.startswith("--model-config-file=s3://") for a in server["args"])
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    assert {m["mountPath"] for m in server["volumeMounts"]} == {"/cache", "/tmp"}


@pytest.mark.parametrize(("path", "doc"), _all_docs(), ids=lambda v: v.name if isinstance(v, Path) else "")
def test_manifest_matches_schema(path: Path, doc: dict) -> None:
    if doc["apiVersion"].startswith("serving.kserve.io/"):
        errors = sorted(_kserve_validator().iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, f"{path}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kserve_schema_rejects_unknown_fields() -> None:
    doc = _docs(K8S / "kserve" / "inferenceservice.yaml")[0]
    doc["spec"]["predictor"]["containers"][0]["imagePolicy"] = "Always"
    doc["spec"]["predictor"]["sklearn"] = {"storageUri": "s3://x"}
    messages = [e.message for e in _kserve_validator().iter_errors(doc)]
    assert any("imagePolicy" in m for m in messages), messages
    assert any("sklearn" in m for m in messages), messages


def test_kubernetes_schema_rejects_unknown_fields() -> None:
    doc = _find("edge", "Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {"port": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", ["cloud", "edge"])
def test_deployment_serves_the_model_repository(variant: str) -> None:
    pod = _find(variant, "Deployment")["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["image"] == f"tfship:{variant}"
    env = {item["name"]: item["value"] for item in server["env"]}
    assert env["MODEL_BASE_PATH"] == "/models" and env["MODEL_NAME"]
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {
        "grpc": GRPC_PORT, "http": REST_PORT, "metrics": METRICS_PORT}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"] == {"port": GRPC_PORT}, f"{variant} {probe} is not a native gRPC probe"
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert mounts["/models"]["name"] in {v["name"] for v in pod["volumes"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's numeric USER
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    assert server["resources"]["limits"]["memory"]


def test_only_cloud_asks_for_a_gpu() -> None:
    cloud = _find("cloud", "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
    edge = _find("edge", "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert cloud["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in edge.get("limits", {}) and "nvidia.com/gpu" not in edge.get("requests", {})


@pytest.mark.parametrize("variant", ["cloud", "edge"])
def test_service_and_hpa_point_at_the_deployment(variant: str) -> None:
    deployment = _find(variant, "Deployment")
    service = _find(variant, "Service")
    hpa = _find(variant, "HorizontalPodAutoscaler")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "grpc": (GRPC_PORT, "grpc"), "http": (REST_PORT, "http"), "metrics": (METRICS_PORT, "metrics")}
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_cloud_volume_claim_exists() -> None:
    pod = _find("cloud", "Deployment")["spec"]["template"]["spec"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {_find("cloud", "PersistentVolumeClaim")["metadata"]["name"]}


def test_inferenceservice_runs_our_image_on_grpc() -> None:
    (container,) = _docs(K8S / "kserve" / "inferenceservice.yaml")[0]["spec"]["predictor"]["containers"]
    assert container["image"] == "tfship:cloud"
    assert container["ports"] == [{"name": "h2c", "containerPort": GRPC_PORT, "protocol": "TCP"}]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["MODEL_BASE_PATH"] == "/mnt/models"  # where KServe's storage initializer writes
    assert env["STORAGE_URI"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: p.parent.name)
def test_kustomization_lists_every_manifest(kustomization: Path) -> None:
    listed = set(yaml.safe_load(kustomization.read_text())["resources"])
    present = {p.name for p in kustomization.parent.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def _arch_terms(pod: dict) -> tuple[str | None, set[str]]:
    """(the pod's nodeSelector kubernetes.io/arch, the architectures its required node affinity allows)."""
    required = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    allowed: set[str] = set()
    for term in (required or {}).get("nodeSelectorTerms", []):
        for expression in term.get("matchExpressions", []):
            if expression["key"] == "kubernetes.io/arch" and expression["operator"] == "In":
                allowed |= set(expression["values"])
    return pod.get("nodeSelector", {}).get("kubernetes.io/arch"), allowed


def test_pods_land_on_nodes_of_an_architecture_their_image_is_built_for() -> None:
    """edge: amd64 or arm64 (the two docker-edge builds; docker-test-arm64 runs the arm64 one); cloud, the bucket
    variant, KServe and train: amd64 only (TensorFlow's CUDA builds)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "docker-edge PLATFORM=linux/arm64" in makefile  # the arm64 edge image has a build and a test
    edge = _find("edge", "Deployment")["spec"]["template"]["spec"]
    assert _arch_terms(edge) == (None, {"amd64", "arm64"})
    for variant, kind in (("cloud", "Deployment"), ("bucket", "Deployment"), ("train", "Job")):
        pod = _find(variant, kind)["spec"]["template"]["spec"]
        assert _arch_terms(pod) == ("amd64", set()), variant
    predictor = _docs(K8S / "kserve" / "inferenceservice.yaml")[0]["spec"]["predictor"]
    assert _arch_terms(predictor) == ("amd64", set())


def test_arch_terms_reads_what_the_scheduler_reads() -> None:
    """The check above can fail: another key, or a NotIn, allows nothing."""
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                              {"key": "kubernetes.io/arch", "operator": "NotIn", "values": ["s390x"]}]}]}}}}
    assert _arch_terms(pod) == (None, set())
    assert _arch_terms({"nodeSelector": {"kubernetes.io/arch": "arm64"}}) == ("arm64", set())
