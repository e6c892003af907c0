"""The deploy files parse and agree with the Celery set-up (no Docker engine here to run them)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.k8s_build import K8S, KEDA, build, listed_files
from workers.celery_app import QUEUE_GPU, QUEUES
from workers.queues import QUEUE_LTI, QUEUE_MAINT

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _gpus_per_worker(queue: str) -> int:
    """GPUs one worker process of ``queue`` holds: ``gpu`` one, ``gpu-xN`` N, the rest none."""
    if queue == QUEUE_GPU:
        return 1
    group = re.fullmatch(r"gpu-x(\d+)", queue)
    return int(group.group(1)) if group else 0


GPUS_PER_QUEUE = {q: _gpus_per_worker(q) for q in QUEUES if _gpus_per_worker(q)}


def _flag(cmd: list[str], *names: str) -> str | None:
    for i, arg in enumerate(cmd):
        if arg in names and i + 1 < len(cmd):
            return cmd[i + 1]
        for name in names:
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _check_worker_command(cmd: list[str]) -> tuple[list[str], int]:
    """Queues and concurrency of a Celery worker command, checked against the spec rules."""
    assert cmd[:4] == ["celery", "-A", "workers.celery_app", "worker"], cmd
    queues = (_flag(cmd, "-Q", "--queues") or "").split(",")
    assert queues and set(queues) <= set(QUEUES), queues
    concurrency = int(_flag(cmd, "-c", "--concurrency") or 0)
    assert concurrency >= 1
    assert _flag(cmd, "--pool", "-P") == "prefork"  # the pool that enforces time limits
    assert _flag(cmd, "--prefetch-multiplier") == "1"
    if any(q in GPUS_PER_QUEUE for q in queues):
        assert len(queues) == 1, "a GPU worker consumes exactly one hardware queue"
        assert concurrency == 1, "one worker process per GPU (or GPU group)"
    return queues, concurrency


# --- docker compose -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def _is_lti_worker(cmd: list[str]) -> bool:
    return cmd[:4] == ["celery", "-A", "service.worker", "worker"]


def _check_lti_worker(cmd: list[str]) -> None:
    """The LMS-facing worker: the service's tasks, exactly the lti queue."""
    assert _flag(cmd, "-Q", "--queues") == QUEUE_LTI
    assert int(_flag(cmd, "-c", "--concurrency") or 0) >= 1


def _is_maint_worker(cmd: list[str]) -> bool:
    """The housekeeping worker: beat and the maint queue, no hardware queue."""
    return (_flag(cmd, "-Q", "--queues") or "").split(",") == [QUEUE_MAINT]


def _workers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The grading workers (not the LMS one, not the maint one)."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if "worker" in (svc.get("command") or [])
        and not _is_lti_worker(svc["command"])
        and not _is_maint_worker(svc["command"])
    }


def test_compose_and_k8s_run_the_lti_worker(
    compose: dict[str, Any], k8s: list[dict[str, Any]]
) -> None:
    lti = [
        s["command"] for s in compose["services"].values() if _is_lti_worker(s.get("command") or [])
    ]
    assert len(lti) == 1
    _check_lti_worker(lti[0])
    pods = [
        c["command"]
        for d in k8s
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
        if _is_lti_worker(c.get("command") or [])
    ]
    assert len(pods) == 1
    _check_lti_worker(pods[0])


def test_compose_has_every_role(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("api", "redis", "postgres", "migrate", "worker-cpu", "maint"):
        assert name in services, name
    assert "noeviction" in services["redis"]["command"]
    assert "service:create_app()" in services["api"]["command"]
    for svc in services.values():
        env = svc.get("environment") or {}
        if "REDIS_URL" in env:
            assert env["REDIS_URL"].startswith("redis://redis:")


def test_compose_workers_cover_queues_with_one_process_per_gpu(compose: dict[str, Any]) -> None:
    consumed: set[str] = set()
    taken: set[str] = set()
    for name, svc in _workers(compose).items():
        queues, _ = _check_worker_command(svc["command"])
        consumed.update(queues)
        devices = (
            svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        )
        gpu_ids = [i for d in devices for i in d.get("device_ids", [])]
        want = GPUS_PER_QUEUE.get(queues[0], 0)
        assert len(gpu_ids) == want, (name, gpu_ids)
        if want:
            assert all("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices)
            assert not taken & set(gpu_ids), f"{name} shares a GPU with another worker"
            taken.update(gpu_ids)
            # Inside the container its GPUs are numbered from 0.
            assert svc["environment"]["KGRADE_GPUS"].split(",") == [str(i) for i in range(want)]
            # GPU workers start only with a GPU profile (`--profile gpu`, `--profile gpu-x4`)
            assert svc.get("profiles") and all(p.startswith("gpu") for p in svc["profiles"])
            # the host's GPU workers take turns for timed loops through one shared lock file
            lock = Path(svc["environment"]["KGRADE_TIMING_LOCK"])
            mounts = {v.split(":")[1]: v.split(":")[0] for v in svc.get("volumes", [])}
            assert mounts.get(str(lock.parent)) in compose["volumes"], name
    assert consumed == set(QUEUES)


def test_compose_runs_one_beat_with_the_k8s_maint_command(compose: dict[str, Any]) -> None:
    # The stuck-job reaper (docs/faults.md) is sent by beat: exactly one, on a worker of its own
    # that is the maint queue's only consumer, started by a plain `up` (no profile).
    services = compose["services"]
    commands = {name: svc.get("command") or [] for name, svc in services.items()}
    beats = [name for name, c in commands.items() if _beats([c])]
    assert beats == ["maint"], beats
    maint = services["maint"]
    assert "profiles" not in maint
    assert _is_maint_worker(maint["command"])
    consumers = [
        n for n, c in commands.items() if QUEUE_MAINT in (_flag(c, "-Q", "--queues") or "")
    ]
    assert consumers == ["maint"], consumers
    schedule = Path(_flag(maint["command"], "-s", "--schedule") or "")
    assert any(t.split(":")[0] == str(schedule.parent) for t in maint.get("tmpfs", []))
    # the same command as the Kubernetes maint pod, but for the node name
    pod = yaml.safe_load((DEPLOY / "k8s" / "worker-maint.yaml").read_text())
    (container,) = pod["spec"]["template"]["spec"]["containers"]
    assert maint["command"][:-1] == container["command"][:-1]


def test_compose_api_counts_metrics_of_all_its_gunicorn_workers(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    folder = api["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    # a tmpfs of the API's own (never shared with a worker), as the k8s emptyDir
    assert [t for t in api.get("tmpfs", []) if t.split(":")[0] == folder], api.get("tmpfs")
    for name, svc in compose["services"].items():
        if name != "api":
            assert "PROMETHEUS_MULTIPROC_DIR" not in (svc.get("environment") or {}), name
    k8s_api = [
        d
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "api.yaml").read_text())
        if d["kind"] == "Deployment"
    ]
    env = {
        e["name"]: e.get("value")
        for e in k8s_api[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["PROMETHEUS_MULTIPROC_DIR"] == folder


def test_compose_grading_workers_can_run_bubblewrap(compose: dict[str, Any]) -> None:
    # bubblewrap in a container (deploy/README.md): a seccomp profile that allows user
    # namespaces, Docker's /proc masks off, and no capability added.
    for name, svc in _workers(compose).items():
        opts = svc.get("security_opt") or []
        assert "systempaths=unconfined" in opts, name
        assert "apparmor=unconfined" in opts, name
        (seccomp,) = [o.split("=", 1)[1] for o in opts if o.startswith("seccomp=")]
        profile = json.loads((DEPLOY / seccomp).read_text())
        denied = {n for rule in profile["syscalls"] for n in rule["names"]}
        assert {"keyctl", "bpf", "io_uring_setup", "kexec_load"} <= denied
        assert not denied & {"unshare", "clone", "mount", "pivot_root", "umount2"}, name
        assert not svc.get("cap_add") and not svc.get("privileged"), name
        assert svc.get("user") in (None, "kgrade", "10001"), name


# --- Kubernetes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    """The base (deploy/k8s) as `kubectl apply -k` sends it."""
    return build(K8S)


@pytest.mark.parametrize("directory", [K8S, KEDA], ids=["base", "keda"])
def test_kustomizations_list_exactly_their_manifests(directory: Path) -> None:
    on_disk = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed_files(directory) == on_disk


def test_k8s_objects_well_formed(k8s: list[dict[str, Any]]) -> None:
    names: set[tuple[str, str]] = set()
    for doc in k8s:
        assert doc.get("apiVersion") and doc.get("kind"), doc
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in names, f"duplicate {key}"
        names.add(key)
        if doc["kind"] in ("Deployment", "StatefulSet"):
            selector = doc["spec"]["selector"]["matchLabels"]
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), key
            for c in doc["spec"]["template"]["spec"]["containers"]:
                assert c["name"] and c["image"], key
    workloads = [d for d in k8s if d["kind"] in ("Deployment", "StatefulSet")]
    for svc in (d for d in k8s if d["kind"] == "Service"):
        sel = svc["spec"]["selector"].items()
        assert any(sel <= w["spec"]["template"]["metadata"]["labels"].items() for w in workloads), (
            f"Service {svc['metadata']['name']} selects no workload"
        )
    kinds = {k for k, _ in names}
    assert {"Namespace", "ConfigMap", "Secret", "Job", "Service", "StatefulSet"} <= kinds


def test_k8s_workers_one_gpu_per_process(k8s: list[dict[str, Any]]) -> None:
    consumed: set[str] = set()
    locks: set[str] = set()
    for doc in k8s:
        if doc["kind"] != "Deployment" or "worker" not in doc["metadata"]["name"]:
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        if _is_lti_worker(container["command"]):
            continue
        queues, _ = _check_worker_command(container["command"])
        consumed.update(queues)
        limits = container["resources"]["limits"]
        want = GPUS_PER_QUEUE.get(queues[0], 0)
        assert int(limits.get("nvidia.com/gpu", 0)) == want, doc["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if want:
            assert env["KGRADE_GPUS"].split(",") == [str(i) for i in range(want)]
            assert doc["spec"]["strategy"]["type"] == "Recreate"
            # one timing lock file per node, shared by its GPU pods
            pod = doc["spec"]["template"]["spec"]
            mount = next(
                m for m in container["volumeMounts"] if m["mountPath"] == env["KGRADE_TIMING_LOCK"]
            )
            vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert vol["hostPath"]["type"] == "FileOrCreate"
            locks.add(vol["hostPath"]["path"])
        assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert consumed == set(QUEUES)
    assert len(locks) == 1, locks


def test_dockerfile_is_non_root_with_sandbox_and_torch_flavour() -> None:
    text = (ROOT / "Dockerfile").read_text()
    # the official base by default; deploy/check passes a local one (no registry there)
    assert "ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim" in text
    froms = [ln.split() for ln in text.splitlines() if ln.startswith("FROM ")]
    assert froms[-1] == ["FROM", "${BASE_IMAGE}"], froms
    assert "node frontend/build.mjs" in text and "--from=assets" in text
    assert "ARG TORCH_FLAVOR=cpu" in text and "download.pytorch.org/whl/${TORCH_FLAVOR}" in text
    assert "bubblewrap" in text
    user_lines = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert user_lines and user_lines[-1] not in ("root", "0")
    assert "service:create_app()" in text


def test_every_api_command_passes_the_gunicorn_config() -> None:
    # without it gunicorn answers long headers and bad request lines with its HTML pages, not
    # the API's JSON errors (service/cli/gunicorn_conf.py)
    import json
    import re

    from service.cli.serve import GUNICORN_CONFIG

    commands: list[list[str]] = []
    cmd = re.search(r"^CMD (\[.*?\])", (ROOT / "Dockerfile").read_text(), re.S | re.M)
    assert cmd is not None
    commands.append(json.loads(cmd.group(1).replace("\\\n", "")))
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    commands += [s["command"] for s in compose["services"].values() if "gunicorn" in str(s)]
    for doc in yaml.safe_load_all((DEPLOY / "k8s" / "api.yaml").read_text()):
        for c in (
            (doc or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            commands.append(c["command"])
    gunicorns = [c for c in commands if c and c[0] == "gunicorn"]
    assert len(gunicorns) == 3, commands
    for c in gunicorns:
        assert _flag(c, "--config", "-c") == GUNICORN_CONFIG, c


def _beats(commands: list[list[str]]) -> list[list[str]]:
    return [
        c
        for c in commands
        if c[:4] == ["celery", "-A", "workers.celery_app", "worker"]
        and ("-B" in c or "--beat" in c)
    ] + [c for c in commands if c[:4] == ["celery", "-A", "workers.celery_app", "beat"]]


def test_k8s_runs_exactly_one_beat_and_a_maint_consumer(k8s: list[dict[str, Any]]) -> None:
    # Celery beat sends the stuck-job reaper (docs/faults.md): without it nothing requeues a
    # job whose worker died; with two, every periodic task is sent twice.
    from workers.queues import QUEUE_MAINT

    pods = [
        (d, c["command"])
        for d in k8s
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    beats = [(d, c) for d, c in pods if _beats([c])]
    assert len(beats) == 1, [d["metadata"]["name"] for d, _ in beats]
    ((doc, cmd),) = beats
    assert doc["spec"].get("replicas") == 1 and doc["spec"]["strategy"]["type"] == "Recreate"
    consumers = [c for _, c in pods if QUEUE_MAINT in (_flag(c, "-Q", "--queues") or "").split(",")]
    assert consumers, "no worker consumes the maint queue"
