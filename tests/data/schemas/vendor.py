"""Rebuild the trimmed schemas of this folder from their published sources (README.md names
each: repository, path, release). Run by hand when a target moves to a newer release:

    python tests/data/schemas/vendor.py --dgd nvidia.com_dynamographdeployments.yaml \\
        --lws leaderworkerset.x-k8s.io_leaderworkersets.yaml \\
        --llmd values.schema.json --llmd-values values.yaml \\
        --k8s kubernetes_validate/kubernetes-json-schema/v1.35.0-local-strict

What trimming does, and why validation stays sound:

- ``description`` and ``title`` are dropped (documentation, most of each file's bytes).
- A pod spec, a container and a volume keep only the properties of :data:`KEEP` (every one
  the exports write, and the common ones beside them). The tests validate strictly (an
  object's unknown property is an error), so a manifest that ever writes a property trimmed
  here fails loudly: add it to :data:`KEEP` and rebuild, never loosen the tests.
- Of Kubernetes' definitions only those the kept resources reach are kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent

# properties kept of a PodSpec, a Container and a Volume (recognised by their properties)
KEEP = {
    "pod": {"containers", "initContainers", "volumes", "nodeSelector", "tolerations", "affinity",
            "terminationGracePeriodSeconds", "serviceAccountName", "imagePullSecrets", "mainContainer",
            "hostIPC", "enableServiceLinks", "restartPolicy", "schedulerName", "priorityClassName",
            "securityContext", "resourceClaims"},
    "container": {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports",
                  "resources", "readinessProbe", "livenessProbe", "startupProbe", "volumeMounts",
                  "workingDir", "securityContext", "restartPolicy", "lifecycle", "stdin", "tty"},
    "volume": {"name", "emptyDir", "configMap", "secret", "persistentVolumeClaim", "hostPath"},
}


def _kind(schema: dict[str, Any]) -> str | None:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return None
    if "containers" in props and "volumes" in props:
        return "pod"
    if "image" in props and "args" in props and "command" in props:
        return "container"
    if "emptyDir" in props and "configMap" in props and "name" in props:
        return "volume"
    return None


def trim(node: Any, prune: bool = True) -> Any:
    """The schema without documentation, its pod specs, containers and volumes pruned
    (``prune``; a chart's values schema is only stripped: its pools look like pod specs)."""
    if isinstance(node, list):
        return [trim(x, prune) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: trim(v, prune) for k, v in node.items() if k not in ("description", "title")}
    kind = _kind(out) if prune else None
    if kind is not None:
        out["properties"] = {k: v for k, v in out["properties"].items() if k in KEEP[kind]}
        if "required" in out:
            out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def _crd_schema(path: Path, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    found = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert found, f"{path}: no version {version}"
    return trim(found[0]["schema"]["openAPIV3Schema"])


def _refs(node: Any, out: set[str]) -> Any:
    """``node`` with every ``$ref`` pointing into the bundle's own ``$defs``; the names it
    refers to added to ``out``."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            out.add(name)
            node = {**node, "$ref": f"#/$defs/{name}"}
        return {k: _refs(v, out) if k != "$ref" else v for k, v in node.items()}
    if isinstance(node, list):
        return [_refs(v, out) for v in node]
    return node


def _k8s(folder: Path, kinds: list[str], dest: Path) -> None:
    """The resources' schemas and the definitions they reach, trimmed, in one bundle whose
    ``$defs`` hold both (a resource by its file's stem, ``deployment-apps-v1``)."""
    every = json.loads((folder / "_definitions.json").read_text(encoding="utf-8"))["$defs"]
    keep: dict[str, Any] = {}
    todo: set[str] = set()
    for k in kinds:  # one bundle: a resource's own $id and $schema would move its refs' base
        raw = json.loads((folder / f"{k}.json").read_text(encoding="utf-8"))
        keep[k] = _refs(trim({key: v for key, v in raw.items() if key not in ("$id", "$schema")}), todo)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        found: set[str] = set()
        keep[name] = _refs(trim(every[name]), found)
        todo |= found - set(keep)
    dest.write_text(json.dumps({"$defs": dict(sorted(keep.items()))}, separators=(",", ":")) + "\n",
                    encoding="utf-8")


def _keys(node: Any, prefix: str = "") -> list[str]:
    """Every key path of a values.yaml (lists: their first item's keys, as ``a[].b``)."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.append(path)
            out += _keys(v, path)
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        out += _keys(node[0], prefix + "[]")
    return out


def _write(dest: Path, schema: Any) -> None:
    dest.write_text(json.dumps(schema, separators=(",", ":")) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dgd", type=Path, help="Dynamo's nvidia.com_dynamographdeployments.yaml")
    p.add_argument("--lws", type=Path, help="LWS's leaderworkerset.x-k8s.io_leaderworkersets.yaml")
    p.add_argument("--llmd", type=Path, help="llm-d-modelservice's values.schema.json")
    p.add_argument("--llmd-values", type=Path, help="llm-d-modelservice's values.yaml")
    p.add_argument("--k8s", type=Path, help="a kubernetes-json-schema vX.Y.Z-local-strict folder")
    a = p.parse_args()
    if a.dgd:
        _write(HERE / "dynamo-dynamographdeployment-v1alpha1.json", _crd_schema(a.dgd, "v1alpha1"))
    if a.lws:
        _write(HERE / "lws-leaderworkerset-v1.json", _crd_schema(a.lws, "v1"))
    if a.llmd:
        _write(HERE / "llm-d-modelservice-values.schema.json",
               trim(json.loads(a.llmd.read_text(encoding="utf-8")), prune=False))
    if a.llmd_values:
        keys = sorted(set(_keys(yaml.safe_load(a.llmd_values.read_text(encoding="utf-8")))))
        (HERE / "llm-d-modelservice-values-keys.txt").write_text("\n".join(keys) + "\n", encoding="utf-8")
    if a.k8s:
        _k8s(a.k8s, ["deployment-apps-v1", "service-v1", "configmap-v1"], HERE / "kubernetes.json")


if __name__ == "__main__":
    main()
