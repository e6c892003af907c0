"""The objects `kubectl apply -k DIR` would send, assembled as kustomize does for the parts our
kustomizations use (no kustomize binary on a fresh clone): resources (files and directories,
recursively), namespace, images. A kustomization using anything else fails here, so the
assembly never silently differs from kustomize's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
KEDA = K8S / "keda"

SUPPORTED_KEYS = {"apiVersion", "kind", "namespace", "resources", "images"}
#: Kinds kustomize leaves without a namespace (cluster-scoped ones we use or might).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def kustomization(directory: Path) -> dict[str, Any]:
    data = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(data) - SUPPORTED_KEYS
    assert not unsupported, f"{directory}: extend tests/deploy/k8s_build.py for {unsupported}"
    return data


def build(directory: Path) -> list[dict[str, Any]]:
    """The assembled objects of the kustomization in ``directory``."""
    k = kustomization(directory)
    docs: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += build(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    docs = copy.deepcopy(docs)
    namespace = k.get("namespace")
    for doc in docs:
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        _set_images(doc, k.get("images", []))
    return docs


def _set_images(doc: dict[str, Any], images: list[dict[str, str]]) -> None:
    pod = _pod_spec(doc)
    if pod is None:
        return
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name = container["image"].split("@")[0].rsplit(":", 1)[0]
        for image in images:
            if image["name"] == name:
                new = image.get("newName", name)
                container["image"] = f"{new}:{image['newTag']}" if "newTag" in image else new


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec") or {}
    if doc["kind"] == "Pod":
        return spec
    template = (spec.get("jobTemplate", {}).get("spec") or spec).get("template")
    return template.get("spec") if template else None


def listed_files(directory: Path) -> set[str]:
    """The plain files a kustomization lists (directories left out)."""
    return {r for r in kustomization(directory).get("resources", []) if (directory / r).is_file()}
