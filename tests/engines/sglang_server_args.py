"""Run under a Python that has SGLang installed (not autoplan's: SGLang pins its own torch).

Reads a JSON list of ``python -m sglang.launch_server`` argument lists on stdin, parses
each with SGLang's own ``ServerArgs`` parser and builds the ``ServerArgs`` (its post-parse
checks), and prints a JSON list: per argument list, the values autoplan's export sets, or
``{"error": ...}``. tests/unit/test_serving.py drives it.
"""

import argparse
import json
import sys

FIELDS = ("model_path", "host", "port", "tp_size", "pp_size", "dp_size", "attn_dp_size", "ep_size",
          "max_running_requests", "chunked_prefill_size", "mem_fraction_static", "context_length",
          "kv_cache_dtype", "quantization", "nnodes", "node_rank", "dist_init_addr",
          "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
          "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
          "speculative_eagle_topk", "speculative_num_draft_tokens", "mamba_ssm_dtype", "enable_multimodal")


def main() -> None:
    from sglang.srt.server_args import ServerArgs

    out = []
    for argv in json.load(sys.stdin):
        parser = argparse.ArgumentParser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(parser)
        try:
            resolved = ServerArgs.from_cli_args(parser.parse_args(argv)).resolved_dict()
        except SystemExit as exc:  # argparse's error exit
            out.append({"error": f"argparse exit {exc.code}"})
            continue
        except (ValueError, TypeError, AssertionError) as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({name: resolved.get(name) for name in FIELDS})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
