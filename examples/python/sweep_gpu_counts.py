"""Sweep a model family over GPU counts into a DataFrame, and plot it.

For each model, `autoplan.api.search` with several GPU counts and the tokens to train
prices each count's best plan (days, GPU-hours, dollars, energy), as
`autoplan search --gpus 16..64 --train-tokens ...` does. The rows go into one pandas
DataFrame (printed, and written to sweep.csv); the plot is days to train against GPUs,
drawn with matplotlib where it is installed, else each model's front (days against
dollars) written as SVG by autoplan's own writer.

    python examples/python/sweep_gpu_counts.py
    python examples/python/sweep_gpu_counts.py --models llama3-8b,llama3-70b --gpus 16..64
"""

from __future__ import annotations

import argparse

import pandas as pd

from autoplan import api


def sweep(models: list[str], cluster: str, gpus: str, global_batch: int, seq_len: int,
          train_tokens: float) -> pd.DataFrame:
    frames = []
    for model in models:
        result = api.search(model=model, cluster=cluster, gpus=gpus, global_batch=global_batch,
                            seq_len=seq_len, train_tokens=train_tokens)
        assert result.train is not None  # several GPU counts with tokens to train: a sweep
        rows = result.train.to_frame()
        rows.insert(0, "model", model)
        frames.append(rows)
        svg = f"sweep-{model}.svg"
        with open(svg, "w", encoding="utf-8") as f:  # autoplan's own SVG writer: no matplotlib needed
            f.write(result.train.front_svg())
        print(f"wrote {svg}")
    return pd.concat(frames, ignore_index=True)


def plot(table: pd.DataFrame, path: str) -> bool:
    """Days to train against GPUs, a line per model; False where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, rows in table.groupby("model"):
        ax.plot(rows["gpus"], rows["train_days"], marker="o", label=model)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("days to train")
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama3-8b,llama3-70b")
    parser.add_argument("--cluster", default="dgx-h100")
    parser.add_argument("--gpus", default="16..64")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--train-tokens", type=float, default=1e12)
    args = parser.parse_args()
    table = sweep(args.models.split(","), args.cluster, args.gpus, args.global_batch, args.seq_len,
                  args.train_tokens)
    table.to_csv("sweep.csv", index=False)
    print(table[["model", "gpus", "layout", "train_days", "cost_usd", "chosen"]].to_string(index=False))
    print("wrote sweep.csv")
    if plot(table, "sweep.png"):
        print("wrote sweep.png")
    else:
        print("matplotlib is not installed: no sweep.png (the fronts above are SVG)")


if __name__ == "__main__":
    main()
