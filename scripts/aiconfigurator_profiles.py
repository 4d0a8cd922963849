"""The measured profiles shipped from NVIDIA AIConfigurator's kernel tables, and the table
of how well they interpolate (profiles/measured/README.md, NOTICE-aiconfigurator.md).

    pip install 'autoplan[aiconfigurator]'              # aiconfigurator-core 0.12
    python scripts/aiconfigurator_profiles.py import    # rewrite profiles/measured/*-aiconfigurator.csv
    python scripts/aiconfigurator_profiles.py table     # the README's interpolation table
    python scripts/aiconfigurator_profiles.py kernels   # rewrite profiles/measured/kernels/*.csv
    python scripts/aiconfigurator_profiles.py mixers    # rewrite profiles/measured/mixers/*.csv

``import`` runs ``autoplan profiles import aiconfigurator --system S --thin -o
profiles/measured/`` for each device below (every engine, each at the newest version of its
GEMM table). ``table`` needs no package: for each shipped aiconfigurator profile, per kernel
kind, the rows the surrogate learns from, the analytic model's error on them (mean
|analytic - measured| / measured) and the surrogate's leave-shapes-out error (5-fold
cross-validated: each row predicted by forests fitted without it), against the built-in
node cluster of the profile's device (``autoplan bench --profile FILE --fit`` prints the
same per profile). ``kernels`` writes training's measured kernel grids
(``autoplan/measured/kernels.py``): per device of :data:`KERNEL_SYSTEMS`, the GEMM grid of
TensorRT-LLM's table and the NCCL grid (``autoplan.measured.aiconfigurator.kernel_grids``).
``mixers`` writes serving's measured token-mixer tables (``autoplan/measured/mixer_tables.py``):
per device of :data:`SYSTEMS` and engine at the version its serving profile ships at, the
Gated DeltaNet and Mamba-2 kernels, the DeepSeek Sparse Attention block and DeepSeek-V4's C
and H attention modules (TensorRT-LLM's at 1.3.0rc23, its first release that runs the model)
(``autoplan.measured.aiconfigurator_mixers.mixer_files``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "profiles" / "measured"
SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")
KERNEL_SYSTEMS = ("a100_sxm", *SYSTEMS)
KERNELS = MEASURED / "kernels"
KERNELS_COMMAND = "python scripts/aiconfigurator_profiles.py kernels"
MIXERS = MEASURED / "mixers"


def run_import() -> None:
    for system in SYSTEMS:
        subprocess.run([sys.executable, "-m", "autoplan.cli.main", "profiles", "import", "aiconfigurator",
                        "--system", system, "--thin", "-o", "profiles/measured/"], cwd=ROOT, check=True)


def write_kernels() -> None:
    from autoplan.measured.aiconfigurator import kernel_grids, locate

    package = locate()
    KERNELS.mkdir(parents=True, exist_ok=True)
    for system in KERNEL_SYSTEMS:
        for grid in kernel_grids(package, system, KERNELS_COMMAND):
            path = KERNELS / grid.name
            tmp = path.with_suffix(".tmp")
            tmp.write_text(grid.text(), encoding="utf-8")
            tmp.replace(path)
            print(f"{path.relative_to(ROOT)}: {len(grid.rows)} rows")


def shipped_versions(system: str) -> dict[str, str]:
    """engine -> the version of its shipped serving profile of ``system`` (the mixer tables
    are taken at the same versions)."""
    from autoplan.measured.aiconfigurator import SYSTEMS as DESCRIPTORS
    from autoplan.measured.profile import profile_header

    out = {}
    for path in sorted(MEASURED.glob(f"{DESCRIPTORS[system]}-*-aiconfigurator.csv")):
        with path.open(encoding="utf-8") as f:
            header = profile_header(f)
        if header.get("descriptor") == DESCRIPTORS[system] and header.get("engine"):
            out[header["engine"]] = header["engine_version"]
    return out


def write_mixers() -> None:
    from autoplan.measured.aiconfigurator import locate
    from autoplan.measured.aiconfigurator_mixers import mixer_files

    package = locate()
    MIXERS.mkdir(parents=True, exist_ok=True)
    for system in SYSTEMS:
        for table in mixer_files(package, system, versions=shipped_versions(system)):
            path = MIXERS / table.name
            tmp = path.with_suffix(".tmp")
            tmp.write_text(table.text(), encoding="utf-8")
            tmp.replace(path)
            print(f"{path.relative_to(ROOT)}: {len(table.rows)} rows")


def table() -> None:
    from autoplan.measured.profile import read_profile
    from autoplan.measured.surrogate import builtin_baseline, fit_report

    print("| profile | baseline | kind | rows | analytic | surrogate (held out) |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for path in sorted(MEASURED.glob("*-aiconfigurator.csv")):
        profile = read_profile(path)
        cluster = builtin_baseline(profile)
        if cluster is None:
            print(f"| `{path.name}` | no built-in cluster of {profile.descriptor} | | | | |")
            continue
        for row in fit_report(profile, cluster):
            held = "-" if row.surrogate_mape is None else f"{row.surrogate_mape:.1%}"
            print(f"| `{path.name}` | {cluster.name} | {row.kind} | {row.rows} | {row.analytic_mape:.1%} "
                  f"| {held} |")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "import":
        run_import()
    elif what == "table":
        table()
    elif what == "kernels":
        write_kernels()
    elif what == "mixers":
        write_mixers()
    else:
        sys.exit(f"usage: python {Path(__file__).name} import|table|kernels|mixers")
