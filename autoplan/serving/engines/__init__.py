"""The built-in serving engines, one file each (``autoplan/serving/engine.py``), registered
in this order (the order ``--engine`` lists them in)."""

# isort: off
from autoplan.serving.engines import vllm
from autoplan.serving.engines import sglang
from autoplan.serving.engines import trtllm
# isort: on

BUILTIN = (vllm.VLLM, sglang.SGLANG, trtllm.TRTLLM)
