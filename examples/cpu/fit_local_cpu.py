"""Fit examples/cpu/local-cpu.yaml on examples/cpu/profile.csv (run from the repository root).

The profile comes first, on a quiet machine, one torch thread per process (what each of the
two validation ranks computes with):

    OMP_NUM_THREADS=1 autoplan bench --device cpu --model examples/cpu/tiny-llama.yaml \\
        -o examples/cpu/profile.csv
    python examples/cpu/fit_local_cpu.py
"""

from __future__ import annotations

import os
from pathlib import Path

from autoplan.bench.machine import cluster_yaml, describe_machine
from autoplan.bench.profile import read_profile

RANKS = 2  # validation processes, one per core of this 2-core machine
COMMAND = "python examples/cpu/fit_local_cpu.py"


def main() -> None:
    profile = read_profile(Path("examples/cpu/profile.csv"))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # bf16: validate computes in bf16, and the peak must be the rate of what runs (this
    # CPU has native bf16 GEMMs: 0.47 TFLOP/s on one core against 0.10 in fp32)
    cluster = describe_machine(profile, name="local-cpu", ranks_per_node=RANKS, mem_bytes=ram / RANKS,
                               compute_dtype="bf16")
    text = cluster_yaml(cluster, profile, COMMAND)
    note = (f"# One 'GPU' = one validation process with {profile.meta.get('torch_threads', '?')} torch "
            f"thread(s) on its own core; mem_GiB = this machine's RAM / {RANKS}.\n")
    head, sep, body = text.partition("cluster:\n")
    Path("examples/cpu/local-cpu.yaml").write_text(head + note + sep + body)


if __name__ == "__main__":
    main()
