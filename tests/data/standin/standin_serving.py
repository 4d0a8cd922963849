"""What the stand-in serving engines and benchmark clients share (tests/data/standin: `vllm`,
`trtllm-serve`, `aiperf`, and the `sglang` package for `python -m sglang.launch_server` and
`python -m sglang.bench_serving`): a tiny HTTP server that answers /health, and the
clients' result files in the real tools' formats (autoplan/tune/serving_clients.py names
the fields and the files they are read from), with numbers from a known synthetic truth.

The truth: with STANDIN_TRUTH (``host_step_s=1.5,kernel_scale=1.3``: factors on the
release line's fitted constants), autoplan's own prediction of the run's plan with its
engine line's constants so scaled, so that `autoplan calibrate` can be shown to recover
them; without it, the trial sidecar's prediction with every latency times STANDIN_FACTOR
(default 1.1) and every throughput over it (no autoplan import: fast).

Environment: STANDIN_FACTOR, STANDIN_TP_FACTORS (``2:3``: tp 2 deployments measure 3x their
prediction), STANDIN_HEALTH_DELAY (seconds before /health answers 200, default 0.1),
STANDIN_MODE (server: ok | hang, never healthy | crash, exits at once), STANDIN_CLIENT_MODE
(ok | fail, exits 1 | hang), STANDIN_PIDS (a file each process appends its pid to),
STANDIN_ARGS (a file each process appends its argv to, one JSON line)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

SIDECAR = "autoplan-trial.json"


def record(argv: list[str]) -> None:
    if os.environ.get("STANDIN_PIDS"):
        with open(os.environ["STANDIN_PIDS"], "a") as f:
            f.write(f"{os.getpid()}\n")
    if os.environ.get("STANDIN_ARGS"):
        with open(os.environ["STANDIN_ARGS"], "a") as f:
            f.write(json.dumps(argv) + "\n")


def option(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def options(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]


# --------------------------------------------------------------------------- servers


def serve(argv: list[str], engine: str) -> None:
    """A stand-in engine server: /health 503, then 200 after STANDIN_HEALTH_DELAY; a child
    process (as an engine's workers) in its process group."""
    record([engine, *argv])
    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "crash":
        print(f"{engine}: RuntimeError: CUDA error: no CUDA-capable device is detected", file=sys.stderr)
        sys.exit(1)
    port = int(option(argv, "--port", "8000") or 8000)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    if os.environ.get("STANDIN_PIDS"):
        with open(os.environ["STANDIN_PIDS"], "a") as f:
            f.write(f"{worker.pid}\n")
    ready = threading.Event()
    delay = float(os.environ.get("STANDIN_HEALTH_DELAY", "0.1"))
    if mode != "hang":
        threading.Timer(delay, ready.set).start()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            ok = self.path == "/health" and ready.is_set()
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    print(f"{engine} (stand-in) listening on 127.0.0.1:{port}", flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


# --------------------------------------------------------------------------- clients


def _healthy(port: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def factors() -> dict[str, float] | None:
    text = os.environ.get("STANDIN_TRUTH", "")
    if not text:
        return None
    return {k.strip(): float(v) for k, v in (item.split("=") for item in text.split(","))}


def truth(plan_doc: dict[str, Any], scale: dict[str, float]) -> dict[str, float]:
    """The run's numbers (module doc): autoplan's prediction of ``plan_doc`` with its engine
    line's constants times ``scale``."""
    import dataclasses

    from autoplan.serving.engine import fitted_as
    from autoplan.serving.evaluate import evaluate_serving
    from autoplan.serving.planfile import read_serving_plan

    plan = read_serving_plan(plan_doc, "the stand-in's plan")
    line = plan.engine_line
    assert line.fitted is not None
    true = dataclasses.replace(line.fitted, **{k: getattr(line.fitted, k) * f for k, f in scale.items()})
    with fitted_as(plan.engine, {line.version: true}):
        p = evaluate_serving(plan, evidence=False)
    return {
        "ttft_mean": p.ttft_ms.mean,
        "ttft_p50": p.ttft_ms.p50,
        "ttft_p99": p.ttft_ms.p99,
        "tpot_mean": p.tpot_ms.mean,
        "tpot_p50": p.tpot_ms.p50,
        "tpot_p99": p.tpot_ms.p99,
        "rps": p.requests_per_s,
        "tps": p.output_tokens_per_s,
        "goodput": p.goodput_rps,
        "completed": float(plan.workload.requests),
    }


def quick(sidecar: dict[str, Any]) -> dict[str, float]:
    """The sidecar's prediction, latencies times STANDIN_FACTOR, throughputs over it."""
    k = float(os.environ.get("STANDIN_FACTOR", "1.1"))
    # STANDIN_TP_FACTORS "2:3": a deployment of tp 2 measures 3x its prediction (so that
    # measurement and prediction rank apart)
    for item in filter(None, os.environ.get("STANDIN_TP_FACTORS", "").split(",")):
        tp, factor = item.split(":")
        if sidecar["plan"]["deployment"]["tp"] == int(tp):
            k = float(factor)
    p = sidecar["predicted"]
    return {
        "ttft_mean": p["ttft_ms"]["mean"] * k,
        "ttft_p50": p["ttft_ms"]["p50"] * k,
        "ttft_p99": p["ttft_ms"]["p99"] * k,
        "tpot_mean": p["tpot_ms"]["mean"] * k,
        "tpot_p50": p["tpot_ms"]["p50"] * k,
        "tpot_p99": p["tpot_ms"]["p99"] * k,
        "rps": p["requests_per_s"] / k,
        "tps": p["output_tokens_per_s"] / k,
        "goodput": p["goodput_rps"] / k,
        "completed": float(sidecar["load"]["requests"]),
    }


def numbers_for(folder: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """The trial's sidecar in ``folder`` and the numbers its run measures."""
    sidecar = json.loads((folder / SIDECAR).read_text())
    scale = factors()
    return sidecar, (truth(sidecar["plan"], scale) if scale is not None else quick(sidecar))


def check_load(
    sidecar: dict[str, Any],
    rate: str | None,
    concurrency: str | None,
    requests: str | None,
    input_len: str | None,
    output_len: str | None,
) -> None:
    """Exit 1 where the client was asked for other traffic than the trial's."""
    load = sidecar["load"]
    want_rate = "inf" if load["rate_rps"] is None else f"{load['rate_rps']:.6g}"
    got = {
        "rate": rate,
        "concurrency": concurrency,
        "requests": requests,
        "input_len": input_len,
        "output_len": output_len,
    }
    want = {
        "rate": want_rate,
        "concurrency": None if load["concurrency"] is None else str(load["concurrency"]),
        "requests": str(load["requests"]),
        "input_len": str(load["input_len"]),
        "output_len": str(load["output_len"]),
    }
    wrong = {
        k: (got[k], want[k]) for k in got if got[k] != want[k] and not (k == "concurrency" and got[k] is None)
    }
    if wrong:
        print(f"stand-in client: asked for other traffic than the trial's: {wrong}", file=sys.stderr)
        sys.exit(1)


def client_start(argv: list[str], port: str | None) -> None:
    record(argv)
    mode = os.environ.get("STANDIN_CLIENT_MODE", "ok")
    if mode == "fail":
        print("Traceback (most recent call last):\nValueError: Initial test run failed", file=sys.stderr)
        sys.exit(1)
    if mode == "hang":
        time.sleep(3600)
    if port is None or not _healthy(port):
        print(f"stand-in client: no healthy server on port {port}", file=sys.stderr)
        sys.exit(1)


def vllm_result(
    n: dict[str, float], rate: str, concurrency: int | None, prompts: int, goodput: bool
) -> dict[str, Any]:
    """vllm bench serve --save-result's JSON (vllm/benchmarks/serve.py main_async)."""
    doc: dict[str, Any] = {
        "date": "20261201-120000",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "stand-in",
        "tokenizer_id": "stand-in",
        "num_prompts": prompts,
        "request_rate": rate if rate == "inf" else float(rate),
        "burstiness": 1.0,
        "max_concurrency": concurrency,
        "duration": n["completed"] / n["rps"],
        "completed": int(n["completed"]),
        "failed": 0,
        "total_input_tokens": 0,
        "total_output_tokens": 0,
        "request_throughput": n["rps"],
        "request_goodput": n["goodput"] if goodput else None,
        "output_throughput": n["tps"],
        "total_token_throughput": n["tps"],
        "max_output_tokens_per_s": n["tps"],
        "max_concurrent_requests": concurrency or 1,
    }
    for metric in ("ttft", "tpot", "itl"):
        src = "tpot" if metric == "itl" else metric
        doc[f"mean_{metric}_ms"] = n[f"{src}_mean"]
        doc[f"median_{metric}_ms"] = n[f"{src}_p50"]
        doc[f"std_{metric}_ms"] = 0.0
        doc[f"p50_{metric}_ms"] = n[f"{src}_p50"]
        doc[f"p90_{metric}_ms"] = n[f"{src}_p99"]
        doc[f"p99_{metric}_ms"] = n[f"{src}_p99"]
    return doc


def sglang_result(
    n: dict[str, float], rate: str, concurrency: int | None, input_len: int, output_len: int
) -> dict[str, Any]:
    """sglang.bench_serving's JSON line with --output-details (python/sglang/bench_serving.py)."""
    completed = int(n["completed"])
    duration = completed / n["rps"]
    good = round(n["goodput"] * duration)
    gap = n["tpot_mean"] / 1e3
    # per request: the good ones at the mean TTFT, the rest far past any SLO
    ttfts = [n["ttft_mean"] / 1e3 if i < good else 1e6 for i in range(completed)]
    return {
        "backend": "sglang",
        "dataset_name": "random-ids",
        "request_rate": float(rate),
        "max_concurrency": concurrency,
        "sharegpt_output_len": None,
        "random_input_len": input_len,
        "random_output_len": output_len,
        "random_range_ratio": 1.0,
        "duration": duration,
        "completed": completed,
        "total_input_tokens": input_len * completed,
        "total_output_tokens": output_len * completed,
        "total_output_tokens_retokenized": output_len * completed,
        "request_throughput": n["rps"],
        "input_throughput": n["rps"] * input_len,
        "output_throughput": n["tps"],
        "mean_e2e_latency_ms": n["ttft_mean"] + n["tpot_mean"] * (output_len - 1),
        "median_e2e_latency_ms": n["ttft_p50"] + n["tpot_p50"] * (output_len - 1),
        "std_e2e_latency_ms": 0.0,
        "p99_e2e_latency_ms": n["ttft_p99"] + n["tpot_p99"] * (output_len - 1),
        "mean_ttft_ms": n["ttft_mean"],
        "median_ttft_ms": n["ttft_p50"],
        "std_ttft_ms": 0.0,
        "p99_ttft_ms": n["ttft_p99"],
        "mean_tpot_ms": n["tpot_mean"],
        "median_tpot_ms": n["tpot_p50"],
        "std_tpot_ms": 0.0,
        "p99_tpot_ms": n["tpot_p99"],
        "mean_itl_ms": n["tpot_mean"],
        "median_itl_ms": n["tpot_p50"],
        "std_itl_ms": 0.0,
        "p95_itl_ms": n["tpot_p99"],
        "p99_itl_ms": n["tpot_p99"],
        "concurrency": float(concurrency or 1),
        "accept_length": None,
        "input_lens": [input_len] * completed,
        "output_lens": [output_len] * completed,
        "ttfts": ttfts,
        "itls": [[gap] * (output_len - 1) for _ in range(completed)],
        "generated_texts": [""] * completed,
        "errors": [""] * completed,
    }


def aiperf_result(
    n: dict[str, float],
    rate: float | None,
    concurrency: int | None,
    requests: int,
    input_len: int,
    output_len: int,
    goodput: bool,
) -> dict[str, Any]:
    """AIPerf's profile_export_aiperf.json (aiperf/common/models/export_models.py
    JsonExportData; metric values in their display units: ms, requests/sec, tokens/sec)."""

    def ms(stat: str) -> dict[str, Any]:
        return {
            "unit": "ms",
            "avg": n[f"{stat}_mean"],
            "p50": n[f"{stat}_p50"],
            "p90": n[f"{stat}_p99"],
            "p99": n[f"{stat}_p99"],
            "min": n[f"{stat}_p50"],
            "max": n[f"{stat}_p99"],
            "std": 0.0,
        }

    doc: dict[str, Any] = {
        "request_throughput": {"unit": "requests/sec", "avg": n["rps"]},
        "request_latency": {"unit": "ms", "avg": n["ttft_mean"] + n["tpot_mean"] * (output_len - 1)},
        "request_count": {"unit": "requests", "avg": int(n["completed"])},
        "time_to_first_token": ms("ttft"),
        "inter_token_latency": ms("tpot"),
        "inter_chunk_latency": ms("tpot"),
        "output_token_throughput": {"unit": "tokens/sec", "avg": n["tps"]},
        "output_sequence_length": {"unit": "tokens", "avg": float(output_len)},
        "input_sequence_length": {"unit": "tokens", "avg": float(input_len)},
        "benchmark_duration": {"unit": "sec", "avg": n["completed"] / n["rps"]},
        "input_config": {
            "endpoint": {"type": "completions", "streaming": True},
            "loadgen": {"request_rate": rate, "concurrency": concurrency, "request_count": requests},
        },
        "was_cancelled": False,
        "error_summary": [],
        "start_time": "2026-12-01T12:00:00",
        "end_time": "2026-12-01T12:01:00",
    }
    if goodput:
        doc["goodput"] = {"unit": "requests/sec", "avg": n["goodput"]}
        doc["good_request_count"] = {
            "unit": "requests",
            "avg": round(n["goodput"] * n["completed"] / n["rps"]),
        }
    return doc


def vllm_bench(argv: list[str]) -> None:
    """``vllm bench serve ...``: checks its traffic against the trial's, writes its result."""
    client_start(["vllm", *argv], option(argv, "--port"))
    folder = Path(option(argv, "--result-dir") or ".")
    sidecar, n = numbers_for(folder)
    concurrency = option(argv, "--max-concurrency")
    rate = option(argv, "--request-rate", "inf") or "inf"
    check_load(
        sidecar,
        rate,
        concurrency,
        option(argv, "--num-prompts"),
        option(argv, "--random-input-len"),
        option(argv, "--random-output-len"),
    )
    assert "--save-result" in argv and "--ignore-eos" in argv and option(argv, "--random-range-ratio") == "0"
    doc = vllm_result(
        n,
        rate,
        None if concurrency is None else int(concurrency),
        int(option(argv, "--num-prompts") or 0),
        "--goodput" in argv,
    )
    name = option(argv, "--result-filename") or "result.json"
    (folder / name).write_text(json.dumps(doc))
    print("============ Serving Benchmark Result ============", flush=True)


def sglang_bench(argv: list[str]) -> None:
    client_start(["python", "-m", "sglang.bench_serving", *argv], option(argv, "--port"))
    out = Path(option(argv, "--output-file") or "result.jsonl")
    sidecar, n = numbers_for(out.parent)
    concurrency = option(argv, "--max-concurrency")
    rate = option(argv, "--request-rate", "inf") or "inf"
    check_load(
        sidecar,
        rate,
        concurrency,
        option(argv, "--num-prompts"),
        option(argv, "--random-input-len"),
        option(argv, "--random-output-len"),
    )
    assert option(argv, "--random-range-ratio") == "1" and "--output-details" in argv
    doc = sglang_result(
        n,
        rate,
        None if concurrency is None else int(concurrency),
        int(option(argv, "--random-input-len") or 0),
        int(option(argv, "--random-output-len") or 0),
    )
    with open(out, "a") as f:
        f.write(json.dumps(doc) + "\n")


def aiperf_profile(argv: list[str]) -> None:
    url = option(argv, "--url") or ""
    client_start(["aiperf", *argv], url.rsplit(":", 1)[-1] if url else None)
    folder = Path(option(argv, "--artifact-dir") or "artifacts")
    sidecar, n = numbers_for(folder)
    rate = option(argv, "--request-rate")
    concurrency = option(argv, "--concurrency")
    requests = option(argv, "--request-count")
    offline = rate is None
    check_load(
        sidecar,
        rate if rate is not None else "inf",
        None if offline and concurrency == requests else concurrency,
        requests,
        option(argv, "--synthetic-input-tokens-mean"),
        option(argv, "--output-tokens-mean"),
    )
    assert "ignore_eos:true" in options(argv, "--extra-inputs") and "--streaming" in argv
    doc = aiperf_result(
        n,
        None if rate is None else float(rate),
        None if concurrency is None else int(concurrency),
        int(requests or 0),
        int(option(argv, "--synthetic-input-tokens-mean") or 0),
        int(option(argv, "--output-tokens-mean") or 0),
        "--goodput" in argv,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "profile_export_aiperf.json").write_text(json.dumps(doc, indent=2))
