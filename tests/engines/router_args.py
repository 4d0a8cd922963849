"""Run under a Python that has the router installed (vllm-router beside vLLM, sglang-router
beside SGLang).

argv[1] names the router's parser (``module:function``, a ``parse_router_args(list[str])``
that returns its RouterArgs). Reads a JSON list of argument lists on stdin, parses each,
and prints a JSON list: per argument list, the RouterArgs fields the exports set (prefill
URLs with their bootstrap ports, decode URLs, the disaggregation switch, host, port), or
``{"error": ...}``. tests/unit/test_serving_disaggregated.py drives it.
"""

import importlib
import json
import sys


def main() -> None:
    module, function = sys.argv[1].split(":")
    parse = getattr(importlib.import_module(module), function)
    out = []
    for argv in json.load(sys.stdin):
        try:
            args = parse(argv)
        except SystemExit as exc:  # argparse's error exit
            out.append({"error": f"argparse exit {exc.code}"})
            continue
        fields = vars(args) if hasattr(args, "__dict__") else {}
        keep = {k: v for k, v in fields.items()
                if k in ("pd_disaggregation", "vllm_pd_disaggregation", "prefill_urls", "decode_urls",
                         "host", "port", "kv_connector")}
        out.append(json.loads(json.dumps(keep, default=str)))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
