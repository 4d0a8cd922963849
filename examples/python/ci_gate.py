"""Gate a committed plan in a Python CI step.

`autoplan.api.check` is `autoplan check` as a function: the plan must read, fit memory
(with --min-headroom GiB free), and be within --max-regression of the best plan a search
finds now. The report is printed as the command prints it, written as JUnit XML for the
CI's test page, and the step exits with the command's code (0 pass, 1 a rule failed,
2 bad input).

    python examples/python/ci_gate.py examples/plans/llama3-8b-64xh100-megatron-best.yaml \\
        --max-regression 0.05 --junit autoplan-check.xml
"""

from __future__ import annotations

import argparse
import sys

from autoplan import api


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("--max-regression", type=float, default=0.05)
    parser.add_argument("--min-headroom", type=float, default=0.0)
    parser.add_argument("--junit", default="autoplan-check.xml")
    args = parser.parse_args()
    try:
        result = api.check(args.plan, max_regression=args.max_regression, min_headroom=args.min_headroom)
    except api.InputError as exc:  # a bad option: one line per problem, exit 2, as the command does
        for problem in exc.problems:
            print(f"autoplan: error: {problem}", file=sys.stderr)
        return 2
    print(result.to_text(), end="")
    with open(args.junit, "w", encoding="utf-8") as f:
        f.write(result.to_junit())
    if not result.passed:
        print(f"failed: {', '.join(result.failed)}", file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
