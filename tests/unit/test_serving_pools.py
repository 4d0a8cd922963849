"""Prefill and decode on different GPUs (issue 52): a heterogeneous cluster's pools each run one
side of a disaggregated deployment (Splitwise, Patel et al. 2024), the KV cache handed over the
link between them; serve searches both orders, the plan file says each side's pool and reads
back, the exports write each pool's workers, and a bad pool is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autoplan.descriptors.hardware import PooledCluster
from autoplan.descriptors.library import resolve_any_cluster, resolve_model
from autoplan.kernels.layer import kv_bytes_per_token_layer
from autoplan.serving.cost import kv_transfer
from autoplan.serving.deployment import Deployment, Pool
from tests.helpers import autoplan

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "clusters" / "b200-h200.yaml"
SERVE = ("serve", "--model", "llama3-8b", "--cluster", str(CLUSTER), "--rate", "2",
         "--input-len", "1024", "--output-len", "64", "--requests", "100", "--top", "40")


def _pools() -> PooledCluster:
    found = resolve_any_cluster(str(CLUSTER))
    assert isinstance(found, PooledCluster)
    return found


def test_the_kv_hand_off_between_pools_runs_over_their_link() -> None:
    pools, m = _pools(), resolve_model("llama3-8b")
    d = Deployment.split(Pool(2, 4), Pool(1, 8), on=("blackwell", "hopper"))
    link = pools.between_pools
    start, per_token = kv_transfer(m, pools.pools[1], d, link)
    # every layer's K and V of a prompt token, over the min(4, 8) GPU pairs of the link
    assert start == link.latency_s
    assert per_token == pytest.approx(m.layers * kv_bytes_per_token_layer(m, 1, 2) / (4 * link.effective_Bps))


def test_serve_puts_prefill_and_decode_on_either_pool_and_the_plan_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    result = autoplan(*SERVE, "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    import json

    labels = [p["deployment"]["disaggregated"] for p in json.loads(result.stdout)["plans"]]
    assert {(s["prefill"]["pool"], s["decode"]["pool"]) for s in labels} == {
        ("blackwell", "hopper"), ("hopper", "blackwell")}
    doc = yaml.safe_load(out.read_text())
    assert [p["name"] for p in doc["cluster"]["pools"]] == ["blackwell", "hopper"]
    evaluated = autoplan("evaluate", str(out), "--format", "json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["plans"][0]["prediction"]["prefill_pool"]["kv_transfer_ms_mean"] > 0


def test_the_exports_write_each_pools_workers_and_the_router_finds_them(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    assert autoplan(*SERVE, "--out", str(plan)).returncode == 0
    doc = yaml.safe_load(plan.read_text())
    sides = doc["deployment"]["disaggregated"]
    result = autoplan("export", str(plan), "--to", "vllm", "--out", str(tmp_path / "x"))
    assert result.returncode == 0, result.stderr
    devices = {"blackwell": "b200", "hopper": "h200"}
    for role in ("prefill", "decode"):
        script = (tmp_path / "x" / f"serve-vllm-{role}.sh").read_text()
        assert f"on {sides[role]['replicas'] * sides[role]['tp']} x {devices[sides[role]['pool']]}" in script
        assert f"of pool {sides[role]['pool']}'s" in script
    router = (tmp_path / "x" / "router-vllm.sh").read_text()
    assert "${NODES[0]}" in router and "${NODES[1]}" in router  # one node per pool


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["deployment"]["disaggregated"]["prefill"].update(pool="volta"),
     "deployment.disaggregated.prefill.pool"),
    (lambda d: d["deployment"]["disaggregated"]["decode"].pop("pool"),
     "deployment.disaggregated.decode.pool"),
    (lambda d: d["deployment"]["disaggregated"]["prefill"].update(replicas=9),
     "deployment.disaggregated.prefill"),
    (lambda d: d.update(cluster="dgx-h100"), "deployment.disaggregated.prefill.pool"),
])
def test_a_bad_pool_is_refused_naming_it(tmp_path: Path, change, field) -> None:
    plan = tmp_path / "plan.yaml"
    assert autoplan(*SERVE, "--out", str(plan)).returncode == 0
    doc = yaml.safe_load(plan.read_text())
    change(doc)
    plan.write_text(yaml.safe_dump(doc))
    result = autoplan("evaluate", str(plan))
    assert result.returncode == 2 and field in result.stderr and "Traceback" not in result.stderr


def test_gpus_beside_a_pooled_cluster_is_refused() -> None:
    result = autoplan(*SERVE, "--gpus", "8")
    assert result.returncode == 2 and "--gpus" in result.stderr


def test_the_kubernetes_exports_name_each_pools_gpus(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    assert autoplan(*SERVE, "--out", str(plan)).returncode == 0
    for target in ("k8s", "dynamo"):
        out = tmp_path / f"{target}.yaml"
        result = autoplan("export", str(plan), "--to", target, "--out", str(out))
        assert result.returncode == 0, result.stderr
        head = out.read_text().splitlines()[0]
        assert "pool blackwell" in head and "pool hopper" in head and "nodeSelector" in head
