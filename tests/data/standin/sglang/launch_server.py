"""A stand-in for `python -m sglang.launch_server --model-path MODEL ...` (standin_serving.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import standin_serving  # noqa: E402

if __name__ == "__main__":
    standin_serving.serve(sys.argv[1:], "sglang")
