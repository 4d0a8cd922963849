"""The built-in serving engines' launches, one file each beside the exports
(:mod:`autoplan.export.engines.launch`), registered in the engines' order; importing any
part of this package registers them first. What a deployment costs on each engine is its
file in ``autoplan/serving/engines/``."""

# isort: off
from autoplan.export.engines import vllm
from autoplan.export.engines import sglang
from autoplan.export.engines import trtllm
# isort: on
from autoplan.export.engines.launch import (
    Disaggregation,
    LaunchSpec,
    launch,
    launch_of,
    no_launch,
    register_launch,
    unregister_launch,
)

BUILTIN = (vllm.VLLM_LAUNCH, sglang.SGLANG_LAUNCH, trtllm.TRTLLM_LAUNCH)

__all__ = ["BUILTIN", "Disaggregation", "LaunchSpec", "launch", "launch_of", "no_launch", "register_launch",
           "unregister_launch"]
