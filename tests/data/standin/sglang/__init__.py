"""A stand-in for SGLang's package (tests/data/standin on PYTHONPATH): `python -m
sglang.launch_server` and `python -m sglang.bench_serving` (standin_serving.py)."""
