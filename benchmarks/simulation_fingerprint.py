"""A fingerprint of the serving simulation: a hash of every SimResult field for each of 21
cases (open, closed and offline loops, stepped over and one iteration at a time, a tight
cache, disaggregated open and closed loops, prefix caching, a vision encoder's time). Run it
at two commits and diff the output: a refactor of the simulation must print the same lines.

    python benchmarks/simulation_fingerprint.py > before.txt   # at the old commit
    python benchmarks/simulation_fingerprint.py | diff before.txt -
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.serving import simulate as sim
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Arrival, ArrivalKind, Deployment, Engine, Lengths, Prefix, Workload


def fingerprint(result: sim.SimResult) -> str:
    h = hashlib.sha256()
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        h.update(f.name.encode())
        h.update(repr(value.tolist() if isinstance(value, np.ndarray) else value).encode())
    return h.hexdigest()[:16]


def workload(kind: str) -> Workload:
    arrival = {"rate": Arrival(ArrivalKind.RATE, rate_rps=20.0),
               "rate50": Arrival(ArrivalKind.RATE, rate_rps=50.0),
               "conc": Arrival(ArrivalKind.CONCURRENCY, concurrency=64),
               "off": Arrival(ArrivalKind.OFFLINE)}[kind]
    return Workload(input_len=Lengths(mean=1024), output_len=Lengths(mean=256), arrival=arrival, requests=400)


def main() -> None:
    h100 = with_gpus(resolve_cluster("dgx-h100"), 8)
    steps = {"llama3-8b vllm tp1": StepModel(resolve_model("llama3-8b"), h100, Deployment(replicas=1, tp=1),
                                             Engine.VLLM),
             "llama3-70b sglang tp4": StepModel(resolve_model("llama3-70b"), h100,
                                                Deployment(replicas=1, tp=4), Engine.SGLANG)}
    rows: list[tuple[str, str]] = []
    for name, step in steps.items():
        for kind in ("rate", "conc", "off"):
            for over in (True, False):
                result = sim.simulate(step, workload(kind), 1, 200_000, seed=1, step_over_decodes=over)
                rows.append((f"{name} {kind} {'stepped-over' if over else 'each-iteration'}",
                             fingerprint(result)))
        tight = sim.simulate(step, workload("rate50"), 2, 30_000, seed=2)
        rows.append((f"{name} tight-cache", fingerprint(tight)))
        for kind in ("rate", "conc"):
            result = sim.simulate_disaggregated(step, step, workload(kind), (2, 3), (100_000, 100_000),
                                                (1e-3, 1e-6), seed=3)
            rows.append((f"{name} disaggregated {kind}", fingerprint(result)))
    step = steps["llama3-8b vllm tp1"]
    for kind in ("rate", "conc"):
        w = dataclasses.replace(workload(kind), prefix=Prefix(share=0.5, groups=4))
        rows.append((f"prefix {kind}", fingerprint(sim.simulate(step, w, 1, 200_000, seed=4))))
    result = sim.run_requests(step, np.array([0.0, 0.01, 0.02]), np.array([100, 200, 300]),
                              np.array([5, 6, 7]), 50_000, encoder_s=0.002)
    rows.append(("vision encoder", fingerprint(result)))
    width = max(len(case) for case, _ in rows)
    print(f"{'case':<{width}}  fingerprint")
    for case, digest in rows:
        print(f"{case:<{width}}  {digest}")


if __name__ == "__main__":
    main()
