"""KEDA's ScaledObjects (deploy/k8s/keda): valid against KEDA's own CRD schema, aimed at the
Deployments that consume each queue, and reading the Redis list Celery really writes (checked
by sending a task through the real Redis)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import redis
import yaml

from tests.deploy.k8s_build import KEDA, build
from tests.deploy.test_manifests import GPUS_PER_QUEUE, _flag
from workers.celery_app import QUEUES, make_celery

#: KEDA v2.20.2's ScaledObject CRD, unmodified (source and licence in the file's header).
CRD = Path(__file__).parent / "schemas" / "keda.sh_scaledobjects.yaml"
#: Trigger metadata KEDA's Redis list scaler reads from the ScaledObject itself
#: (pkg/scalers/redis_scaler.go, v2.20.2); passwords belong in a TriggerAuthentication.
REDIS_SCALER_KEYS = {
    "address",
    "host",
    "port",
    "databaseIndex",
    "enableTLS",
    "unsafeSsl",
    "listName",
    "listLength",
    "activationListLength",
}
#: GPUs in the pool the example is sized for (deploy/k8s/keda/kustomization.yaml, README).
GPU_POOL = 12


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as `kubectl apply` with strict field
    validation does (the API server would otherwise drop them silently)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    assert f"{crd['spec']['group']}/{version['name']}" == "keda.sh/v1alpha1"
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return build(KEDA)


def _scaled(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in objects if d["kind"] == "ScaledObject"]


def test_scaled_objects_match_kedas_crd(
    objects: list[dict[str, Any]], validator: jsonschema.Draft7Validator
) -> None:
    scaled = _scaled(objects)
    assert len(scaled) == len(QUEUES)
    for doc in scaled:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, (doc["metadata"]["name"], errors)


def test_crd_check_refuses_a_misspelt_field(
    objects: list[dict[str, Any]], validator: jsonschema.Draft7Validator
) -> None:
    doc = _scaled(objects)[0]
    bad = {**doc, "spec": {**doc["spec"], "maxReplicas": 3}}
    assert any("maxReplicas" in e.message for e in validator.iter_errors(bad))


def _worker_queues(objects: list[dict[str, Any]], name: str) -> list[str]:
    """The grading queues the Deployment ``name`` consumes."""
    (deployment,) = [
        d for d in objects if d["kind"] == "Deployment" and d["metadata"]["name"] == name
    ]
    assert "replicas" not in deployment["spec"], "KEDA's HPA owns the replica count"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    queues = (_flag(container["command"], "-Q", "--queues") or "").split(",")
    # Only hardware queues drive scaling; a housekeeping queue every worker also consumes
    # would not say how many GPUs the backlog needs.
    return [q for q in queues if q in QUEUES]


def test_each_grading_queue_scales_its_own_workers(objects: list[dict[str, Any]]) -> None:
    scaled_queues: set[str] = set()
    gpus_at_max = 0
    for doc in _scaled(objects):
        spec = doc["spec"]
        assert doc["metadata"]["namespace"] == "kgrade"
        queues = _worker_queues(objects, spec["scaleTargetRef"]["name"])
        lists = [t["metadata"]["listName"] for t in spec["triggers"] if t["type"] == "redis"]
        # The scaled pods consume exactly the lists measured, one trigger per queue.
        assert sorted(lists) == sorted(queues), doc["metadata"]["name"]
        scaled_queues.update(lists)
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        gpus_at_max += spec["maxReplicaCount"] * max(GPUS_PER_QUEUE.get(q, 0) for q in queues)
        # The list empties while its last jobs still run: scale-down waits past a grading.
        down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert down["stabilizationWindowSeconds"] >= 300
        if spec["minReplicaCount"] == 0:
            assert spec["cooldownPeriod"] >= 300
    assert scaled_queues == set(QUEUES)
    assert gpus_at_max == GPU_POOL


def test_redis_triggers_point_at_the_broker(objects: list[dict[str, Any]]) -> None:
    config = next(d for d in objects if d["kind"] == "ConfigMap")
    broker = urlsplit(config["data"]["REDIS_URL"])
    # A key prefix would rename every list; the triggers would then measure empty keys.
    assert "KGRADE_REDIS_KEYPREFIX" not in config["data"]
    service = next(
        d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == broker.hostname
    )
    port = next(p["port"] for p in service["spec"]["ports"])
    # KEDA's operator resolves the name from its own namespace: it must carry ours.
    address = f"{broker.hostname}.{service['metadata']['namespace']}.svc.cluster.local:{port}"
    for doc in _scaled(objects):
        for trigger in doc["spec"]["triggers"]:
            meta = trigger["metadata"]
            assert trigger["type"] == "redis"
            assert set(meta) <= REDIS_SCALER_KEYS, set(meta) - REDIS_SCALER_KEYS
            assert meta["address"] == address
            assert int(meta["databaseIndex"]) == int(broker.path.strip("/") or 0)
            assert int(meta["listLength"]) >= 1
            assert int(meta.get("activationListLength", "0")) >= 0


@pytest.fixture
def prefixed_celery(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Celery on the shared test Redis, its keys under a prefix of its own (cleaned up)."""
    prefix = f"kgrade-test-keda-{secrets.token_hex(4)}:"
    monkeypatch.setenv("KGRADE_REDIS_KEYPREFIX", prefix)
    app = make_celery(redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        yield app, client, prefix
    finally:
        app.close()
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


def test_a_queued_grading_lands_on_the_list_keda_reads(
    objects: list[dict[str, Any]], prefixed_celery: Any
) -> None:
    """Send a grading as the API does (the task by name, to its queue) and look in Redis."""
    app, client, prefix = prefixed_celery
    lists = {t["metadata"]["listName"]: t for d in _scaled(objects) for t in d["spec"]["triggers"]}
    for queue in QUEUES:
        app.send_task("workers.tasks.grade_submission", args=[1], queue=queue)
        # Exactly one message, on a list named as the trigger says (with no priority suffix).
        assert client.llen(f"{prefix}{lists[queue]['metadata']['listName']}") == 1, queue
        keys = {k.decode() for k in client.scan_iter(match=f"{prefix}{queue}*")}
        assert keys == {f"{prefix}{queue}"}, keys
