"""How long a shipped measured profile takes to apply: reading it, fitting its forests
(once per process, when a command's cluster goes through the door) and the first serving
evaluation with it, per shipped engine profile whose device has a built-in cluster.

    python benchmarks/profile_fit_speed.py

Prints one row per profile: rows, read (parse) seconds, fit seconds, trees per kind. The
fit must stay well under a second (autoplan/measured/surrogate.py, tree counts). Times are
wall-clock on this machine, cold caches (each profile read and fitted afresh).
"""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    t0 = time.perf_counter()
    from autoplan.measured import surrogate
    from autoplan.measured.profile import read_profile

    imported = time.perf_counter() - t0
    print(f"import autoplan.measured.surrogate (scikit-learn): {imported:.2f} s")
    print(f"{'profile':48} {'rows':>5} {'read s':>7} {'fit s':>6}  trees")
    for path in sorted((ROOT / "profiles" / "measured").glob("*-aiconfigurator.csv")):
        t = time.perf_counter()
        profile = read_profile(path)
        read_s = time.perf_counter() - t
        cluster = surrogate.builtin_baseline(profile)
        if cluster is None:
            print(f"{path.name:48} {len(profile.rows):>5} {read_s:>7.3f}      -  (no built-in cluster of "
                  f"{profile.descriptor})")
            continue
        surrogate.clear_caches()
        t = time.perf_counter()
        corrected = surrogate.calibrate(cluster, profile)
        fit_s = time.perf_counter() - t
        correction = corrected.device.correction
        assert isinstance(correction, surrogate.SurrogateCorrection)
        trees = ", ".join(f"{k} {f.n_estimators}" for k, f in correction.fitted.forests.items())
        print(f"{path.name:48} {len(profile.rows):>5} {read_s:>7.3f} {fit_s:>6.3f}  {trees}")


if __name__ == "__main__":
    main()
