"""Rewrite the `prediction:` block of every plan under examples/plans/ with what
`autoplan evaluate` predicts now (run after changing the cost model or profiles).

    python scripts/refresh_example_predictions.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.strict import read_yaml
from autoplan.plans.file import read_plan


def rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def main() -> None:
    for path in sorted(Path("examples/plans").glob("*.yaml")):
        text = path.read_text()
        head, sep, rest = text.partition("\nprediction:")
        if not sep:
            continue
        # top-level keys after the prediction block (a plan's launchers line) stay as written
        lines = rest.split("\n")[1:]
        after = next((i for i, line in enumerate(lines) if line and not line[0].isspace()),
                     len(lines))
        tail = "\n".join(lines[after:])
        prediction = evaluate(read_plan(read_yaml(path), str(path))).to_dict()
        block = yaml.safe_dump({"prediction": rounded(prediction)}, sort_keys=False,
                               default_flow_style=None, width=100)
        path.write_text(head + "\n" + block + tail)
        print(f"{path}: step {prediction['step_time_s']:.3f} s, feasible {prediction['feasible']}")


if __name__ == "__main__":
    main()
