"""Compare two serving engines on one job.

`autoplan.api.serve` runs `autoplan serve` once per engine; each result's DataFrame of
ranked deployments gets an engine column, and the best of each is printed side by side
with the one that serves more tokens per GPU named (a deployment that misses the SLO
never wins). Each engine's best is also printed as JSON lines, as `autoplan serve --format
json` gives its plans[0].

    python examples/python/compare_engines.py examples/serving/chat-job.yaml --engines vllm,sglang
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from autoplan import api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", default="examples/serving/chat-job.yaml")
    parser.add_argument("--engines", default="vllm,sglang")
    parser.add_argument("--gpus", type=int, default=None)
    args = parser.parse_args()
    frames, best = [], {}
    for engine in args.engines.split(","):
        result = api.serve(args.job, engine=engine, gpus=args.gpus)
        rows = result.to_frame()
        frames.append(rows.assign(engine=engine))
        if result.plans:
            best[engine] = result.to_dict()["plans"][0]
            print(json.dumps({"engine": engine, "deployment": best[engine]["deployment"],
                              "prediction": best[engine]["prediction"]}, sort_keys=True))
    table = pd.concat(frames, ignore_index=True)
    tops = table[table["rank"] == 1].set_index("engine")
    print(tops[["deployment", "meets_slo", "goodput_rps", "tokens_per_s_per_gpu", "tpot_ms_slo"]].to_string())
    meeting = tops[tops["meets_slo"]]
    if meeting.empty:
        print("neither engine's best deployment meets the SLO")
    else:
        winner = meeting["tokens_per_s_per_gpu"].idxmax()
        print(f"{winner} serves the most tokens per GPU within the SLO: "
              f"{meeting.loc[winner, 'deployment']}")


if __name__ == "__main__":
    main()
