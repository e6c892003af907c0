"""The Kubernetes manifests against the Kubernetes API schemas (strict: an unknown or misspelt
field fails), and the deploy rules that need the app: probes on real endpoints, grace periods
beyond a job's hard time limit, replicas left to the scaler."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from service import create_app
from tests.deploy.k8s_build import DEPLOY, K8S, KEDA, build
from workers.celery_app import HARD_TIME_LIMIT_S

#: Kubernetes versions whose schemas (bundled with kubernetes-validate, offline) the manifests
#: must satisfy: the oldest minor we target and the newest bundled one. Pinned, so a new
#: kubernetes-validate release does not change what the test checks.
K8S_VERSIONS = ("1.33.0", "1.37.0")
#: Objects of CRDs, validated elsewhere against their own schema (tests/deploy/test_keda.py).
CRD_GROUPS = ("keda.sh/",)
GRADING_WORKERS = (
    "kgrade-worker-cpu",
    "kgrade-worker-gpu",
    "kgrade-worker-gpu-x2",
    "kgrade-worker-gpu-x4",
)


def _core_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]


@pytest.fixture(scope="module")
def with_keda() -> list[dict[str, Any]]:
    return build(KEDA)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", [K8S, KEDA], ids=["base", "keda"])
def test_manifests_match_the_kubernetes_schemas(directory: Path, version: str) -> None:
    objects = _core_objects(build(directory))
    assert len(objects) >= 10
    errors = []
    for doc in objects:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']} {where}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: a probe spelt wrong is refused, not ignored."""
    api = next(
        d for d in build(K8S) if d["kind"] == "Deployment" and "api" in d["metadata"]["name"]
    )
    container = api["spec"]["template"]["spec"]["containers"][0]
    container["readynessProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readynessProbe"):
        kubernetes_validate.validate(api, K8S_VERSIONS[0], strict=True)


def test_the_keda_overlay_only_adds_scaled_objects(
    k8s_base: list[dict[str, Any]], with_keda: list[dict[str, Any]]
) -> None:
    assert not [d for d in k8s_base if d["apiVersion"].startswith(CRD_GROUPS)]
    added = [d for d in with_keda if d not in k8s_base]
    assert added and all(d["kind"] == "ScaledObject" for d in added)
    assert [d for d in with_keda if d in k8s_base] == k8s_base


@pytest.fixture(scope="module")
def k8s_base() -> list[dict[str, Any]]:
    return build(K8S)


def _deployment(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)


@pytest.mark.parametrize("name", GRADING_WORKERS)
def test_grading_workers_leave_replicas_and_finish_their_job(
    k8s_base: list[dict[str, Any]], name: str
) -> None:
    deployment = _deployment(k8s_base, name)
    # Left out, so a re-apply never resets what kubectl scale or KEDA's HPA set.
    assert "replicas" not in deployment["spec"]
    # SIGTERM = Celery's warm shutdown: the running job finishes, bounded by the hard limit.
    config = next(d for d in k8s_base if d["kind"] == "ConfigMap")
    hard = int(config["data"].get("KGRADE_TASK_TIME_LIMIT", HARD_TIME_LIMIT_S))
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > hard


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = tmp_path_factory.mktemp("health") / "k.sqlite3"
    config = {"DATABASE_URL": f"sqlite:///{db}", "IMPORT_BANK": False, "REDIS_URL": ""}
    return create_app(config).test_client()


def test_api_probes_hit_the_health_endpoints(
    k8s_base: list[dict[str, Any]], app_client: Any
) -> None:
    container = _deployment(k8s_base, "kgrade-api")["spec"]["template"]["spec"]["containers"][0]
    paths = {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    # Liveness never depends on PostgreSQL or Redis; readiness does.
    assert paths == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for path in set(paths.values()):
        assert app_client.get(path).status_code == 200, path
    port = container["readinessProbe"]["httpGet"]["port"]
    assert port in {p["name"] for p in container["ports"]}


def test_compose_healthcheck_asks_readyz_on_the_api_port(app_client: Any) -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    test = " ".join(api["healthcheck"]["test"])
    url = urlsplit(re.search(r"https?://[^'\"\s)]+", test).group(0))
    assert url.path == "/readyz"
    bind = api["command"][api["command"].index("--bind") + 1]
    assert url.port == int(bind.rsplit(":", 1)[1])
    assert app_client.get(url.path).status_code == 200
    # Services that need the API up wait for it to be ready, not just started.
    for name, svc in compose["services"].items():
        if "api" in (svc.get("depends_on") or {}):
            assert svc["depends_on"]["api"]["condition"] == "service_healthy", name
