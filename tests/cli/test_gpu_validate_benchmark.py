"""benchmarks/gpu_validate.py's table from the runs saved under benchmarks/gpu/ (measured on
an H200 and on an H100): every saved case is predicted again by this checkout, and the table and its MAPE
line are printed. The assertions are on the table's shape and on what the saved runs hold,
not on accuracy (that is the benchmark's to report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_validate.py"
GPU = ROOT / "benchmarks" / "gpu"


@pytest.mark.parametrize("folder", ["h200-2026-11-26", "h100-2026-11-26"])
def test_the_table_predicts_every_saved_run_again(folder: str) -> None:
    saved_at = GPU / folder
    done = run_script(SCRIPT, "table", saved_at, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    saved = sorted(saved_at.glob("*.json"))
    rows = [line for line in done.stdout.splitlines() if line.startswith("| llama")]
    assert len(rows) == len(saved) == 6
    for path, row in zip(saved, rows, strict=True):
        run = json.loads(path.read_text())
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == path.stem
        assert float(cells[4]) == round(run["measured"]["step_time_s"], 3)  # measured, as saved
        assert run["ran"]["device"] == "cuda" and run["ran"]["mode"] == "slice"
    assert "compute time MAPE: analytic" in done.stdout and "peak memory MAPE" in done.stdout


def test_a_folder_without_saved_runs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text("{}")
    done = run_script(SCRIPT, "table", tmp_path, cwd=ROOT)
    assert done.returncode == 2 and "unknown: other" in done.stderr
