"""Run under a Python that has vLLM installed (not autoplan's: vLLM pins its own torch).

Reads a JSON list of ``vllm serve`` argument lists (model first) on stdin, parses each with
vLLM's own ``vllm serve`` parser and its post-parse validation, and prints a JSON list: per
argument list, the parsed values autoplan's export sets, or ``{"error": ...}``.
tests/unit/test_serving_engines.py drives it.
"""

import argparse
import dataclasses
import json
import sys

FIELDS = ("model_tag", "host", "port", "tensor_parallel_size", "pipeline_parallel_size",
          "data_parallel_size", "enable_expert_parallel", "max_num_seqs", "max_num_batched_tokens",
          "enable_chunked_prefill", "gpu_memory_utilization", "max_model_len", "kv_cache_dtype",
          "quantization", "nnodes", "node_rank", "master_addr", "master_port", "headless",
          "enable_prefix_caching", "kv_transfer_config", "speculative_config", "mamba_ssm_cache_dtype",
          "mamba_cache_mode", "limit_mm_per_prompt")


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out = []
    for argv in json.load(sys.stdin):
        parser = FlexibleArgumentParser(prog="vllm")
        sub = parser.add_subparsers(dest="subparser")
        command = ServeSubcommand()
        command.subparser_init(sub)
        try:
            args = parser.parse_args(["serve", *argv])
            command.validate(args)
        except SystemExit as exc:  # argparse's error exit
            out.append({"error": f"argparse exit {exc.code}"})
            continue
        except (ValueError, TypeError, argparse.ArgumentError) as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({name: getattr(args, name, None) for name in FIELDS})
    # a value vLLM parsed into its own config (KVTransferConfig) as its fields
    json.dump(out, sys.stdout,
              default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else str(o))


if __name__ == "__main__":
    main()
