"""Write examples/runs/serving-vllm-standin.csv and examples/runs/serving-trial/: synthetic
serving runs, made by `autoplan tune --serving` under the stand-in engine and client of
tests/data/standin (no GPU), whose numbers are autoplan's own prediction with the vLLM
line's host time per iteration 1.5x, kernel scale 1.3x and front-end time per request 2x
(STANDIN_TRUTH): what `autoplan calibrate` should recover from them. Not measurements.

    python examples/runs/make_serving_runs.py      # from the repository root, autoplan installed
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "data" / "standin"
OUT = ROOT / "examples" / "runs" / "serving-vllm-standin.csv"
TRIAL = ROOT / "examples" / "runs" / "serving-trial"
TRUTH = "host_step_s=1.5,kernel_scale=1.3,request_s=2.0"
# the job of examples/serving/tune-job.yaml at loads that move each constant: a rate, and
# closed loops of 16 and of 1 (the batch), prompts of 256 to 2048 tokens (the GPU's share,
# eager prefills), few requests each (a stand-in's run is a simulation)
LOADS = ({"input_len": 1024, "arrival": "{rate_rps: 8}", "requests": 16},
         {"input_len": 256, "arrival": "{concurrency: 16}", "requests": 16},
         {"input_len": 2048, "arrival": "{concurrency: 1}", "requests": 8})


def main() -> None:
    env = {**os.environ, "PATH": os.pathsep.join((str(STANDIN), str(Path(sys.executable).parent),
                                                  os.environ["PATH"])),
           "PYTHONPATH": os.pathsep.join((str(STANDIN), str(ROOT))), "STANDIN_TRUTH": TRUTH,
           "MODEL": "meta-llama/Llama-3.1-8B-Instruct"}
    OUT.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, load in enumerate(LOADS):
            job = Path(tmp) / f"job-{i}.yaml"
            job.write_text("model: llama3.1-8b\ncluster: dgx-h100\ngpus: 2\nengine: vllm\n"
                           f"workload: {{input_len: {load['input_len']}, output_len: 64, "
                           f"arrival: {load['arrival']}, requests: {load['requests']}}}\n"
                           "slo: {ttft_ms: 500, tpot_ms: 40}\n")
            subprocess.run([sys.executable, "-m", "autoplan.cli.main", "tune", "--serving", str(job),
                            "--top", "2", "--runs", str(OUT), "--workdir", str(Path(tmp) / f"work-{i}"),
                            "--quiet"], env=env, check=True, cwd=tmp)
        first = sorted((Path(tmp) / "work-0").iterdir())[0]
        shutil.rmtree(TRIAL, ignore_errors=True)
        TRIAL.mkdir()
        for name in ("autoplan-trial.json", "vllm-bench.json"):
            shutil.copy(first / name, TRIAL / name)
    print(f"wrote {OUT} and {TRIAL}")


if __name__ == "__main__":
    main()
