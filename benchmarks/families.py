"""Today's model families (issue 51): each flagship's parameters, its best training plan
and its best serving deployment, with what a sequence keeps in the cache.

    python benchmarks/families.py [--quick]

Per built-in flagship (profiles/models/): the parameters autoplan counts (the MTP modules
and vision tower where the published figure includes them: docs/research/issue51-model-configs.md
and tests/unit/test_hf_families.py cite each figure), ``autoplan search`` on H100s (the
launchable space: the plan some launcher runs; the GPU count sized to the model) and
``autoplan serve`` on H200s at 4 requests/s of 2,048 + 256 tokens (fp8 weights for the
largest), and the serving cache per GPU: KV bytes per context token (full and sparse
layers), per windowed token (sliding layers, up to the window) and the constant state per
sequence (linear and Mamba layers). ``--quick`` searches 64 GPUs for every model.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

from autoplan.descriptors.library import resolve_model
from autoplan.descriptors.model import FULL
from autoplan.kernels.mixers import kv_bytes_per_token

# (model, published total, what it counts, GPUs to search)
FLAGSHIPS = [
    ("qwen3-next-80b-a3b", 81_324_862_720, "with MTP", 256),
    ("qwen3.5-397b-a17b", 397e9, "name only", 1024),
    ("kimi-linear-48b-a3b", 49_122_681_728, "", 128),
    ("kimi-k3", 2_779_930_000_000, "xinference 2779.93B", 2048),
    ("nemotron-h-56b", 56e9, "card, rounded", 256),
    ("nemotron-3-nano-30b-a3b", 31.6e9, "card, rounded", 128),
    ("nemotron-3-ultra-550b-a55b", 550e9, "name only", 1024),
    ("deepseek-v3.2", 685_355_329_792, "with MTP and its head", 1024),
    ("deepseek-v4-flash", 284e9, "card, rounded", 512),
    ("glm-5", 753_864_139_008, "GLM-5.1, with MTP", 1024),
    ("gpt-oss-120b", 116.8e9, "card, rounded", 256),
    ("gemma-4-26b-a4b", 25.2e9, "card, text only", 128),
    ("gemma-3-27b-it", 27_432_406_640, "with vision (keras-hub)", 128),
    ("minimax-m2.5", 228_689_764_864, "M2.7 files less scales", 512),
    ("kimi-k2.5", 1_026_879_376_368, "with vision", 1024),
    ("qwen3-vl-235b-a22b", 235_670_022_896, "with vision", 512),
    ("qwen3-vl-32b", 32e9, "name only", 128),
]
BIG = {"kimi-k2.5", "kimi-k3", "nemotron-3-ultra-550b-a55b", "glm-5", "deepseek-v3.2",
       "qwen3.5-397b-a17b", "qwen3-vl-235b-a22b", "minimax-m2.5"}
# served on more GPUs, or by another engine, than the rest: Kimi-K3 (2.8T) needs 32 H200s in
# fp8, and runs on SGLang releases (vLLM's on main only: serving/engines/vllm.py)
SERVE = {"kimi-k3": ("32", ("--engine", "sglang"))}


def _json(*args: str) -> dict:
    out = subprocess.run(["autoplan", *args, "--format", "json"], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout)


def counted(name: str, what: str) -> float:
    m = resolve_model(name)
    total = m.params_total
    if "MTP" in what:
        total += m.params_mtp
    if "head" in what:  # DeepSeek-V3.2's MTP layer stores its own embedding and head
        total += 2 * m.vocab * m.hidden
    if "text only" in what and m.vision is not None:
        total -= m.vision.params
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="search 64 GPUs for every model")
    args = parser.parse_args(argv)
    head = (f"{'model':24} {'params B':>9} {'published':>10} {'off':>7}  {'train: GPUs':>11} "
            f"{'best layout':34} {'MFU':>6}  {'serve: deployment':24} {'TPOT p50':>8} "
            f"{'KV B/tok':>9} {'window B/tok':>12} {'state MB/seq':>12}")
    print(head)
    print("-" * len(head))
    for name, published, what, gpus in FLAGSHIPS:
        ours = counted(name, what)
        g = "64" if args.quick else str(gpus)
        plan = _json("search", "--model", name, "--cluster", "dgx-h100", "--gpus", g,
                     "--global-batch", "1024", "--seq-len", "4096", "--top", "1")
        if plan.get("plans"):
            p = plan["plans"][0]
            lay = p["layout"]
            layout = " ".join(f"{k}{v}" for k, v in lay.items() if v != 1 or k == "dp")
            mfu = f"{p['prediction']['mfu']:.1%}"
        else:
            layout, mfu = plan.get("error", "no plan")[:34], "-"
        big = name in BIG
        gpus_served, extra = SERVE.get(name, ("16" if big else "8", ()))
        served = _json("serve", "--model", name, "--cluster", "dgx-h200", "--gpus", gpus_served,
                       "--rate", "4", "--input-len", "2048", "--output-len", "256", "--top", "1",
                       *(("--weights", "fp8") if big else ()), *extra)
        if served.get("plans"):
            s = served["plans"][0]
            d, pred = s["deployment"], s["prediction"]
            deploy = f"{d['replicas']}x tp{d['tp']} pp{d['pp']} {d['weights']}"
            cache = pred.get("cache_per_gpu")
            if cache is None:  # a model whose layers are alike: its attention's KV alone
                m = resolve_model(name)
                kv = kv_bytes_per_token(m, FULL, d["tp"], 2) * math.ceil(m.layers / d["pp"])
                win, state = 0.0, 0.0
            else:
                kv, win = cache["kv_bytes_per_token"], cache["sliding_bytes_per_token"]
                state = cache["state_bytes_per_sequence"] / 1e6
            tpot = f"{pred['tpot_ms']['p50']:.1f}"
        else:
            deploy, tpot, kv, win, state = "none fits", "-", 0.0, 0.0, 0.0
        print(f"{name:24} {ours / 1e9:9.2f} {published / 1e9:10.2f} "
              f"{(ours - published) / published:+7.2%}  {g:>11} {layout:34} {mfu:>6}  "
              f"{deploy:24} {tpot:>8} {kv:9,.0f} {win:12,.0f} {state:12.2f}")
    print("\npublished: see docs/research/issue51-model-configs.md; 'card, rounded' and 'name only' "
          "figures are rounded, so only the exact ones test the count")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
