"""Resolve a model, device or cluster reference: a built-in name, a file path,
or an inline mapping. Every error names the file (or option) and the field."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from autoplan.descriptors.hardware import (
    MAX_POOLS,
    Cluster,
    Device,
    PooledCluster,
    read_cluster,
    read_device,
    read_link,
)
from autoplan.descriptors.model import Model, read_model
from autoplan.descriptors.stack import DEFAULT_STACK, Stack, read_stack
from autoplan.descriptors.strict import Fields, _type_name, did_you_mean, read_yaml, shown
from autoplan.errors import InputError, Problem
from autoplan.resources import profiles_dir

MAX_GPUS = 1 << 20  # 1,048,576 GPUs in one cluster: several times the largest built


@cache
def _index() -> dict[str, dict[str, Path]]:
    """Built-in files by kind ("model", "device", "cluster", "stack") and name."""
    found: dict[str, dict[str, Path]] = {"model": {}, "device": {}, "cluster": {}, "stack": {}}
    for sub in ("models", "hardware", "stacks"):
        for path in sorted((profiles_dir() / sub).glob("*.yaml")):
            data = read_yaml(path)
            kind = next(iter(data)) if isinstance(data, Mapping) and len(data) == 1 else None
            assert kind in found, f"{path}: expected one top-level key model/device/cluster/stack"
            found[kind][path.stem] = path
    return found


def builtin_names(kind: str) -> list[str]:
    return sorted(_index()[kind])


def _unknown_name(kind: str, name: str, source: str, field: str) -> InputError:
    names = builtin_names(kind)
    return InputError.single(
        source, field, f"unknown {kind} {shown(name)}{did_you_mean(name, names)}; "
                       f"built-in {kind}s: {', '.join(names)}"
    )


def looks_like_path(ref: str) -> bool:
    """Whether a descriptor reference names a file rather than a built-in."""
    return _looks_like_path(ref)


def _looks_like_path(ref: str) -> bool:
    if ref.endswith((".yaml", ".yml", ".json")) or "/" in ref:
        return True
    try:
        return Path(ref).is_file()
    except OSError:  # a name too long to be a file's, or one that cannot be looked at
        return False


def _is_dir(ref: str) -> bool:
    try:
        return Path(ref).is_dir()
    except (OSError, ValueError):
        return False


def _raise_if(problems: list[Problem]) -> None:
    if problems:
        raise InputError(problems)


def beside(ref: str, source: str) -> Path:
    """The file a relative path ``ref`` in the file ``source`` names: beside that file where
    one is there, else as given (from the current directory, as it always was read)."""
    path = Path(ref).expanduser()
    try:
        if not path.is_absolute() and Path(source).is_file():
            there = Path(source).parent / path
            if there.exists():
                return there
    except (OSError, ValueError):  # a name too long to look at, a NUL: read as given
        pass
    return path


def _document(ref: str, kind: str, source: str, field: str) -> tuple[Any, str]:
    """The parsed file for a path or a built-in name, and the label to report it by.
    A relative path inside a file is taken relative to that file."""
    if _looks_like_path(ref):
        path = beside(ref, source)
        if kind == "model" and path.is_dir():  # a HuggingFace snapshot folder
            path = path / "config.json"  # read as every file is: a FIFO or link loop refused
        return read_yaml(path), str(path)
    builtin = _index()[kind].get(ref)
    # a snapshot folder, named bare ("" names no folder: Path("") is the current directory)
    if builtin is None and kind == "model" and ref.strip() and _is_dir(ref):
        return _document(os.path.join(ref, ""), kind, source, field)
    if builtin is None:
        raise _unknown_name(kind, ref, source, field)
    return read_yaml(builtin), str(builtin)


def _section(data: Any, kind: str, label: str) -> Any:
    if not isinstance(data, Mapping) or kind not in data:
        raise InputError.single(label, kind, f"expected a top-level '{kind}:' mapping")
    extra = sorted(set(data) - {kind})
    if extra:
        raise InputError.single(label, extra[0], f"unknown top-level key; expected only '{kind}:'")
    return data[kind]


def resolve_model(ref: Any, source: str = "--model", field: str = "model") -> Model:
    """A built-in name, a descriptor file, a HuggingFace config.json, or a mapping."""
    return resolve_model_noted(ref, source, field)[0]


def resolve_model_noted(ref: Any, source: str = "--model",
                        field: str = "model") -> tuple[Model, tuple[str, ...]]:
    """:func:`resolve_model`, with what a HuggingFace config.json was imported as and
    which of its fields are not modelled (``hf.import_notes``; none for other models)."""
    from autoplan.descriptors.hf import import_notes, is_hf_config, model_from_hf_config

    problems: list[Problem] = []
    if isinstance(ref, Mapping):
        model = read_model(Fields(ref, source, field, problems))
    elif isinstance(ref, str):
        data, label = _document(ref, "model", source, field)
        if isinstance(data, Mapping) and is_hf_config(data):
            imported = model_from_hf_config(data, label)
            return imported, tuple(import_notes(data, imported, label))
        model = read_model(Fields(_section(data, "model", label), label, "model", problems))
    else:
        raise InputError.single(source, field, f"expected a model name, path or mapping, got {shown(ref)}")
    _raise_if(problems)
    assert model is not None
    return model, ()


def resolve_device(ref: Any, source: str, field: str) -> Device:
    problems: list[Problem] = []
    if isinstance(ref, Mapping):
        device = read_device(Fields(ref, source, field, problems))
    elif isinstance(ref, str):
        data, label = _document(ref, "device", source, field)
        device = read_device(Fields(_section(data, "device", label), label, "device", problems))
    else:
        raise InputError.single(source, field, f"expected a device name or mapping, got {shown(ref)}")
    _raise_if(problems)
    assert device is not None
    return device


def _cluster_from_mapping(data: Any, source: str, field: str) -> Cluster:
    problems: list[Problem] = []
    f = Fields(data, source, field, problems)
    device = None
    if f.ok:
        device_ref = f.raw("device")
        if device_ref is not None:
            try:
                device = resolve_device(device_ref, source, f.key_path("device"))
            except InputError as exc:
                problems.extend(exc.problems)
    cluster = read_cluster(f, device)
    _raise_if(problems)
    assert cluster is not None
    return cluster


def resolve_cluster(ref: Any, source: str = "--cluster", field: str = "cluster") -> Cluster:
    """A built-in name or path (optionally as ``{name: ..., nodes: N}``), or a full mapping.
    A pooled cluster (``pools:``) is refused: see :func:`resolve_any_cluster`."""
    found = resolve_any_cluster(ref, source, field)
    if isinstance(found, PooledCluster):
        raise InputError.single(source, field, f"{found.name} has pools of unlike nodes: "
                                "training search and training plans take it; this needs a "
                                "cluster of one kind of node")
    return found


def resolve_any_cluster(ref: Any, source: str = "--cluster",
                        field: str = "cluster") -> Cluster | PooledCluster:
    """:func:`resolve_cluster`, or a heterogeneous cluster: a mapping (or file) with
    ``pools:`` and ``between_pools:``."""
    if isinstance(ref, Mapping) and "pools" in ref:
        return _pooled_from_mapping(ref, source, field)
    if isinstance(ref, str) and _looks_like_path(ref):
        data, label = _document(ref, "cluster", source, field)
        section = _section(data, "cluster", label)
        if isinstance(section, Mapping) and "pools" in section:
            return _pooled_from_mapping(section, label, "cluster")
        return _cluster_from_mapping(section, label, "cluster")
    return _one_cluster(ref, source, field)


def _pooled_from_mapping(data: Any, source: str, field: str) -> PooledCluster:
    """``{name, pools: [...], between_pools: {bandwidth_GBps, latency_us}}``. A pool is a
    cluster's mapping with its pool ``name``, or ``{name, cluster: REF, nodes: N}``."""
    problems: list[Problem] = []
    f = Fields(data, source, field, problems)
    name = f.name("name")
    raw = f.raw("pools")
    between = read_link(f.child("between_pools", f.raw("between_pools")))
    f.close()
    pools: list[Cluster] = []
    if raw is not None and (not isinstance(raw, list) or not 2 <= len(raw) <= MAX_POOLS):
        what = f"{len(raw)} pools" if isinstance(raw, list) else _type_name(raw)
        f.fail("pools", f"expected a list of 2 to {MAX_POOLS} pools, got {what}")
    elif raw is not None:
        for i, item in enumerate(raw):
            pool = _pool(item, source, f.key_path(f"pools[{i}]"), problems)
            if pool is not None:
                if pool.name in [p.name for p in pools]:
                    f.fail(f"pools[{i}].name", f"pool {shown(pool.name)} is named twice")
                pools.append(pool)
        if sum(p.gpus for p in pools) > MAX_GPUS:
            f.fail("pools", f"expected at most {MAX_GPUS:,} GPUs in all, got "
                            f"{sum(p.gpus for p in pools):,}")
    _raise_if(problems)
    assert between is not None
    return PooledCluster(name=name, pools=tuple(pools), between_pools=between)


def _pool(item: Any, source: str, path: str, problems: list[Problem]) -> Cluster | None:
    try:
        if not (isinstance(item, Mapping) and "cluster" in item):
            return _cluster_from_mapping(item, source, path)
        f = Fields(item, source, path, problems)
        name, ref = f.name("name"), f.raw("cluster")
        nodes = f.int("nodes", None, min=1, max=MAX_GPUS)
        f.close()
        if ref is None or name is None:
            return None
        cluster = _one_cluster(ref, source, f.key_path("cluster"))
        return dataclasses.replace(cluster, name=name, nodes=nodes or cluster.nodes)
    except InputError as exc:
        problems.extend(exc.problems)
        return None


def _one_cluster(ref: Any, source: str, field: str) -> Cluster:
    if isinstance(ref, Mapping) and "gpus_per_node" not in ref and "name" in ref:
        # the short form of the plan file: {name: dgx-h100, nodes: 32}, or part of a node
        # or whole nodes by their GPUs: {name: dgx-h100, gpus: 4}
        problems: list[Problem] = []
        f = Fields(ref, source, field, problems)
        name = f.name("name")
        nodes = f.int("nodes", None, min=1)
        gpus = f.int("gpus", None, min=1)
        if nodes is not None and gpus is not None:
            f.fail("gpus", "give nodes or gpus, not both")
        f.close()
        _raise_if(problems)
        base = resolve_cluster(name, source, f"{field}.name")
        if gpus is not None:
            return with_gpus(base, gpus, source, f"{field}.gpus")
        return dataclasses.replace(base, nodes=nodes or 1)
    if isinstance(ref, Mapping):
        return _cluster_from_mapping(ref, source, field)
    if isinstance(ref, str):
        data, label = _document(ref, "cluster", source, field)
        section = _section(data, "cluster", label)
        if isinstance(section, Mapping) and "pools" in section:
            raise InputError.single(label, "cluster.pools", "a pool is a cluster of identical "
                                    "nodes, not one with pools of its own")
        return _cluster_from_mapping(section, label, "cluster")
    raise InputError.single(source, field, f"expected a cluster name, path or mapping, got {shown(ref)}")


def with_gpus(cluster: Cluster, gpus: int, source: str = "--gpus", field: str = "") -> Cluster:
    """The cluster sized to ``gpus``: whole nodes, or part of one node."""
    if gpus < 1:
        raise InputError.single(source, field, f"expected a positive GPU count, got {gpus}")
    if gpus > MAX_GPUS:
        raise InputError.single(source, field, f"expected at most {MAX_GPUS:,} GPUs, got {gpus:,}")
    if gpus < cluster.gpus_per_node:
        return dataclasses.replace(
            cluster, nodes=1, gpus_per_node=gpus, nvlink_domain=min(cluster.nvlink_domain, gpus)
        )
    if gpus % cluster.gpus_per_node:
        raise InputError.single(
            source,
            field,
            f"expected a multiple of {cluster.name}'s {cluster.gpus_per_node} GPUs per node "
            f"(or fewer than one node), got {gpus}",
        )
    return dataclasses.replace(cluster, nodes=gpus // cluster.gpus_per_node)


def builtin_model_matches(model: Model) -> bool:
    """True when ``model`` is exactly the built-in of its name (so a plan can name it)."""
    if model.name not in _index()["model"]:
        return False
    return resolve_model(model.name) == model


@cache
def builtin_node_cluster(device_name: str) -> Cluster | None:
    """The built-in cluster of ``device_name`` devices with the most GPUs per node (name order
    breaks ties), or None where no built-in cluster has them."""
    found = [c for c in (resolve_cluster(n) for n in builtin_names("cluster"))
             if c.device.name == device_name]
    return max(found, key=lambda c: c.gpus_per_node, default=None)


def _without_grids(cluster: Cluster) -> Cluster:
    """``cluster`` without the measured kernel grids the training door attaches to its device
    (``Device.kernels``) and the mixer tables the serving door does (``Device.mixer_kernels``):
    no part of a cluster file."""
    if cluster.device.kernels is None and cluster.device.mixer_kernels is None:
        return cluster
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, kernels=None,
                                                                   mixer_kernels=None))


def builtin_cluster_matches(cluster: Cluster) -> bool:
    """True when ``cluster`` is the built-in of its name, up to the node count (and whatever
    measured kernel grids its device carries)."""
    if cluster.name not in _index()["cluster"]:
        return False
    return dataclasses.replace(resolve_cluster(cluster.name), nodes=cluster.nodes) == _without_grids(cluster)


def builtin_cluster_ref(cluster: Cluster) -> dict[str, Any] | None:
    """The short form a plan file names ``cluster`` by where it is a built-in sized by
    :func:`with_gpus`: ``{name, nodes}`` for whole nodes, ``{name, gpus}`` for part of a
    node; None for another cluster (written out whole)."""
    if builtin_cluster_matches(cluster):
        return {"name": cluster.name, "nodes": cluster.nodes}
    if cluster.name not in _index()["cluster"]:
        return None
    base = resolve_cluster(cluster.name)
    if cluster.gpus < base.gpus_per_node and with_gpus(base, cluster.gpus) == _without_grids(cluster):
        return {"name": cluster.name, "gpus": cluster.gpus}
    return None


@cache
def _builtin_stack(name: str) -> Stack:
    return resolve_stack(name, "stack", "stack")


def default_stack() -> Stack:
    """The stack a plan that names none runs on (Megatron-Core with Transformer Engine)."""
    return _builtin_stack(DEFAULT_STACK)


def builtin_stack(name: str) -> Stack:
    """A built-in stack by name, loaded once."""
    return _builtin_stack(name)


def resolve_stack(ref: Any, source: str = "--stack", field: str = "stack") -> Stack:
    """A built-in stack name, a stack file, or a mapping."""
    problems: list[Problem] = []
    if isinstance(ref, Mapping):
        stack = read_stack(Fields(ref, source, field, problems))
    elif isinstance(ref, str):
        if not _looks_like_path(ref) and ref in _index()["stack"] and source != "stack":
            return _builtin_stack(ref)
        data, label = _document(ref, "stack", source, field)
        stack = read_stack(Fields(_section(data, "stack", label), label, "stack", problems))
    else:
        raise InputError.single(source, field, f"expected a stack name, path or mapping, got {shown(ref)}")
    _raise_if(problems)
    assert stack is not None
    return stack


def builtin_stack_matches(stack: Stack) -> bool:
    """True when ``stack`` is exactly the built-in of its name (so a plan can name it)."""
    return stack.name in _index()["stack"] and _builtin_stack(stack.name) == stack
