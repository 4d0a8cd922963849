"""The serving engines' own benchmark clients, as ``tune --serving`` runs them and ``runs
import`` reads what they wrote: each drives one replica at its share of the job's traffic
(:class:`Load`) and saves a result file, read here into :class:`Measured` (TTFT, TPOT and
ITL mean, median and 99th percentile, requests and output tokens per second, goodput under
the SLO, requests completed).

- vLLM: ``vllm bench serve`` (vllm/benchmarks/serve.py, github.com/vllm-project/vllm at
  commit def9ce8): ``--save-result`` writes one JSON object (``--result-dir``,
  ``--result-filename``) with ``completed``, ``failed``, ``request_throughput``,
  ``output_throughput``, ``request_goodput`` (with ``--goodput``), ``mean_<m>_ms``,
  ``median_<m>_ms`` and ``p<q>_<m>_ms`` for each of ``--percentile-metrics`` at each of
  ``--metric-percentiles``, and the traffic it ran: ``num_prompts``, ``request_rate``
  (``"inf"``: all at once), ``max_concurrency``. Its random dataset draws lengths in
  [L (1 - r), L (1 + r)] for ``--random-range-ratio`` r (vllm/benchmarks/datasets/random.py):
  0 for fixed lengths; it ignores EOS for that dataset.
- SGLang: ``python -m sglang.bench_serving`` (python/sglang/bench_serving.py,
  github.com/sgl-project/sglang at commit 0033168): appends one JSON line per run to
  ``--output-file`` with ``completed``, ``request_throughput``, ``output_throughput``,
  ``mean/median/p99_ttft_ms``, ``mean/median/p99_tpot_ms``, ``mean/median/p95/p99_itl_ms``,
  ``request_rate``, ``max_concurrency``, ``random_input_len``, ``random_output_len``, and
  with ``--output-details`` each request's ``ttfts``, ``itls`` and ``output_lens`` (from
  which the goodput is counted as vLLM's client counts it: it reports none). Its random
  dataset draws lengths in [L r, L] (``sample_random_requests``): ``--random-range-ratio 1``
  for fixed lengths; ``random-ids`` takes random token ids (no ShareGPT download).
- TensorRT-LLM: NVIDIA AIPerf (``aiperf profile``, github.com/ai-dynamo/aiperf v0.1.1,
  aiperf/exporters/json_exporter.py, aiperf/common/models/export_models.py): writes
  ``profile_export_aiperf.json`` into ``--artifact-dir``, one object per metric tag with its
  ``unit`` and ``avg``, ``p50``, ``p99`` (``time_to_first_token``, ``inter_token_latency``,
  which is (latency - TTFT) / (output tokens - 1): TPOT; ``inter_chunk_latency``: the gaps
  between streamed chunks, ITL; ``request_throughput``, ``output_token_throughput``,
  ``request_count``, ``error_request_count``, ``goodput`` with ``--goodput``), and the
  ``input_config`` it ran (``loadgen``: ``request_rate``, ``concurrency``,
  ``request_count``).

Pure library: nothing is printed; a result that is no measurement raises
:class:`~autoplan.errors.InputError` naming its file and field."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import InputError, Problem
from autoplan.text import one_line

MAX_RESULT_BYTES = 64 * 2**20  # a client's result with every request's details (--output-details)


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """What a client drives one replica with: Poisson arrivals at ``rate_rps``, or a closed
    loop of ``concurrency`` requests in flight, or (neither) every request at once; fixed
    lengths; ``requests`` requests; the SLO its goodput counts against."""

    rate_rps: float | None = None
    concurrency: int | None = None
    input_len: int
    output_len: int
    requests: int
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    seed: int = 0

    def label(self) -> str:
        how = (f"{self.rate_rps:g} req/s" if self.rate_rps is not None
               else f"concurrency {self.concurrency}" if self.concurrency is not None else "offline")
        return f"{self.input_len} in / {self.output_len} out, {how}, {self.requests} requests"


@dataclass(frozen=True, slots=True)
class Stats:
    """Milliseconds over the requests: mean, median, 99th percentile (None: not reported)."""

    mean: float
    p50: float | None = None
    p99: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"mean": self.mean, "p50": self.p50, "p99": self.p99}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What one benchmark run measured of one replica."""

    client: str  # vllm-bench | sglang-bench | aiperf
    completed: int
    failed: int | None
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats | None
    requests_per_s: float
    output_tokens_per_s: float
    goodput_rps: float | None  # requests/s within the SLO (None: not counted)
    # the traffic the client says it ran, where it records it (checked against the plan)
    rate_rps: float | None = None  # inf: every request at once
    concurrency: int | None = None
    requests: int | None = None
    input_len: int | None = None
    output_len: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"client": self.client, "completed": self.completed, "failed": self.failed,
                "ttft_ms": self.ttft_ms.to_dict(), "tpot_ms": self.tpot_ms.to_dict(),
                "itl_ms": None if self.itl_ms is None else self.itl_ms.to_dict(),
                "requests_per_s": self.requests_per_s, "output_tokens_per_s": self.output_tokens_per_s,
                "goodput_rps": self.goodput_rps}


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    """One benchmark client: how it is run and how its result is read."""

    name: str  # as the runs log's client column spells it
    engine: str  # the engine whose own client it is
    program: tuple[str, ...]  # the command before its flags
    result: str  # the result file, in the trial's folder
    # (load, checkpoint, port, the trial's folder) -> its flags
    flags: Callable[[Load, str, int, Path], list[str]]
    read: Callable[[Any, str], Measured]  # (the parsed result, its path) -> what it measured
    source: str  # the file its output format is read from

    def command(self, load: Load, checkpoint: str, port: int, folder: Path) -> list[str]:
        return [*self.program, *self.flags(load, checkpoint, port, folder)]


# --------------------------------------------------------------------------- reading

class _Doc:
    """A result object's fields read with problems collected (file and field named)."""

    def __init__(self, data: Mapping[str, Any], source: str, at: str = "") -> None:
        self.data, self.source, self.at = data, source, at
        self.problems: list[Problem] = []

    def _where(self, key: str) -> str:
        return f"{self.at}.{key}" if self.at else key

    def fail(self, key: str, message: str) -> None:
        self.problems.append(Problem(self.source, self._where(key), message))

    def number(self, key: str, *, required: bool = True, positive: bool = False) -> float | None:
        value = self.data.get(key)
        if value is None:
            if required:
                self.fail(key, "missing")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {one_line(repr(value))[:40]}")
            return None
        value = float(value)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            self.fail(key, f"expected a {'positive' if positive else 'non-negative'} finite number, "
                           f"got {value:g}")
            return None
        return value

    def count(self, key: str, *, required: bool = True) -> int | None:
        value = self.number(key, required=required)
        if value is None:
            return None
        if not value.is_integer():
            self.fail(key, f"expected a whole number, got {value:g}")
            return None
        return int(value)

    def rate(self, key: str) -> float | None:
        """A request rate: a number, or ``inf`` (every request at once)."""
        value = self.data.get(key)
        if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
            return math.inf
        if isinstance(value, float) and math.isinf(value) and value > 0:
            return math.inf
        return self.number(key, required=False, positive=True)

    def done(self) -> None:
        if self.problems:
            raise InputError(self.problems)


def _stats(d: _Doc, metric: str) -> Stats | None:
    mean = d.number(f"mean_{metric}_ms")
    p50 = d.number(f"median_{metric}_ms", required=False)
    p99 = d.number(f"p99_{metric}_ms", required=False)
    return None if mean is None else Stats(mean, p50, p99)


def _latencies(d: _Doc) -> tuple[Stats, Stats, Stats | None]:
    ttft, tpot = _stats(d, "ttft"), _stats(d, "tpot")
    itl = _stats(d, "itl") if "mean_itl_ms" in d.data else None
    d.done()
    assert ttft is not None and tpot is not None
    return ttft, tpot, itl


def read_vllm(data: Any, source: str) -> Measured:
    """``vllm bench serve --save-result``'s JSON (module doc)."""
    d = _Doc(_object(data, source), source)
    completed = d.count("completed")
    failed = d.count("failed", required=False)
    rps = d.number("request_throughput")
    out = d.number("output_throughput")
    goodput = d.number("request_goodput", required=False)
    rate = d.rate("request_rate")
    concurrency = d.count("max_concurrency", required=False)
    prompts = d.count("num_prompts", required=False)
    ttft, tpot, itl = _latencies(d)
    assert completed is not None and rps is not None and out is not None
    return Measured(client="vllm-bench", completed=completed, failed=failed, ttft_ms=ttft, tpot_ms=tpot,
                    itl_ms=itl, requests_per_s=rps, output_tokens_per_s=out, goodput_rps=goodput,
                    rate_rps=rate, concurrency=concurrency, requests=prompts)


def read_sglang(data: Any, source: str) -> Measured:
    """``sglang.bench_serving``'s JSON line (module doc); with ``--output-details`` the
    goodput is counted from each request's TTFT and TPOT (TTFT plus the sum of its
    inter-token gaps is its latency, as the client measures it)."""
    d = _Doc(_object(data, source), source)
    completed = d.count("completed")
    rps = d.number("request_throughput")
    out = d.number("output_throughput")
    rate = d.rate("request_rate")
    concurrency = d.count("max_concurrency", required=False)
    inp = d.count("random_input_len", required=False)
    outp = d.count("random_output_len", required=False)
    ttft, tpot, itl = _latencies(d)
    assert completed is not None and rps is not None and out is not None
    return Measured(client="sglang-bench", completed=completed, failed=None, ttft_ms=ttft, tpot_ms=tpot,
                    itl_ms=itl, requests_per_s=rps, output_tokens_per_s=out, goodput_rps=None,
                    rate_rps=rate, concurrency=concurrency, input_len=inp, output_len=outp)


def sglang_goodput(data: Mapping[str, Any], source: str, ttft_slo_ms: float | None,
                   tpot_slo_ms: float | None) -> float | None:
    """Requests per second within the SLO, from ``--output-details``' per-request lists
    (None where they are missing): a request is good where its TTFT and its TPOT, (sum of
    its gaps) / (output tokens - 1), are within the SLO, as vllm/benchmarks/serve.py's
    ``calculate_metrics`` counts it."""
    ttfts, itls, lens = data.get("ttfts"), data.get("itls"), data.get("output_lens")
    duration = data.get("duration")
    if not (isinstance(ttfts, list) and isinstance(itls, list) and isinstance(lens, list)
            and len(ttfts) == len(itls) == len(lens) and isinstance(duration, (int, float)) and duration > 0):
        return None
    good = 0
    for i, (t, gaps, n) in enumerate(zip(ttfts, itls, lens, strict=True)):
        if not (isinstance(t, (int, float)) and isinstance(n, int) and isinstance(gaps, list)
                and all(isinstance(g, (int, float)) for g in gaps)):
            raise InputError.single(source, f"ttfts[{i}]", "expected numbers for each request's "
                                                           "ttft, itls and output_lens")
        if n <= 0:  # failed
            continue
        tpot = sum(gaps) / (n - 1) if n > 1 else 0.0
        if ((ttft_slo_ms is None or t * 1e3 <= ttft_slo_ms)
                and (tpot_slo_ms is None or tpot * 1e3 <= tpot_slo_ms)):
            good += 1
    return good / float(duration)


# AIPerf's time units (aiperf/common/enums/metric_enums.py MetricTimeUnit tags) in ms
AIPERF_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}


def _aiperf_stats(d: _Doc, tag: str, required: bool = True) -> Stats | None:
    raw = d.data.get(tag)
    if raw is None:
        if required:
            d.fail(tag, "missing")
        return None
    if not isinstance(raw, Mapping):
        d.fail(tag, "expected an object with unit, avg, p50, p99")
        return None
    m = _Doc(raw, d.source, tag)
    unit = raw.get("unit")
    scale = AIPERF_MS.get(unit) if isinstance(unit, str) else None
    if scale is None:
        m.fail("unit", f"expected one of {', '.join(AIPERF_MS)}, got {one_line(repr(unit))[:40]}")
    avg, p50, p99 = m.number("avg"), m.number("p50", required=False), m.number("p99", required=False)
    d.problems += m.problems
    if scale is None or avg is None:
        return None
    return Stats(avg * scale, None if p50 is None else p50 * scale, None if p99 is None else p99 * scale)


def _aiperf_value(d: _Doc, tag: str, units: tuple[str, ...], required: bool = True) -> float | None:
    raw = d.data.get(tag)
    if raw is None:
        if required:
            d.fail(tag, "missing")
        return None
    if not isinstance(raw, Mapping):
        d.fail(tag, "expected an object with unit and avg")
        return None
    m = _Doc(raw, d.source, tag)
    if raw.get("unit") not in units:
        m.fail("unit", f"expected {' or '.join(units)}, got {one_line(repr(raw.get('unit')))[:40]}")
    value = m.number("avg")
    d.problems += m.problems
    return value


def read_aiperf(data: Any, source: str) -> Measured:
    """AIPerf's ``profile_export_aiperf.json`` (module doc)."""
    d = _Doc(_object(data, source), source)
    ttft = _aiperf_stats(d, "time_to_first_token")
    tpot = _aiperf_stats(d, "inter_token_latency")
    itl = _aiperf_stats(d, "inter_chunk_latency", required=False)
    rps = _aiperf_value(d, "request_throughput", ("requests/sec",))
    out = _aiperf_value(d, "output_token_throughput", ("tokens/sec",))
    count = _aiperf_value(d, "request_count", ("requests",))
    errors = _aiperf_value(d, "error_request_count", ("requests",), required=False)
    goodput = _aiperf_value(d, "goodput", ("requests/sec",), required=False)
    rate = concurrency = requests = None
    config = d.data.get("input_config")
    if isinstance(config, Mapping) and isinstance(config.get("loadgen"), Mapping):
        lg = _Doc(config["loadgen"], source, "input_config.loadgen")
        rate = lg.rate("request_rate")
        concurrency = lg.count("concurrency", required=False)
        requests = lg.count("request_count", required=False)
        d.problems += lg.problems
    d.done()
    assert ttft is not None and tpot is not None and rps is not None and out is not None and count is not None
    return Measured(client="aiperf", completed=int(count), failed=None if errors is None else int(errors),
                    ttft_ms=ttft, tpot_ms=tpot, itl_ms=itl, requests_per_s=rps, output_tokens_per_s=out,
                    goodput_rps=goodput, rate_rps=rate, concurrency=concurrency, requests=requests)


def _object(data: Any, source: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InputError.single(source, "", "expected a JSON object (a benchmark client's result)")
    return data


def parse_result(text: str, source: str) -> Any:
    """A result file's JSON: one object, or the last of a JSON-lines file (SGLang's client
    appends a line per run; vLLM's ``--append-result`` too)."""
    from autoplan.descriptors.strict import DuplicateKey, json_object

    stripped = text.strip()
    if not stripped:
        raise InputError.single(source, "", "empty: expected a benchmark client's JSON result")
    try:
        return json.loads(stripped, object_pairs_hook=json_object)
    except DuplicateKey as exc:
        raise InputError.single(source, "", f"key {exc.key!r} twice in one object") from None
    except (ValueError, RecursionError):
        pass
    last = stripped.splitlines()[-1]
    try:
        return json.loads(last, object_pairs_hook=json_object)
    except DuplicateKey as exc:
        raise InputError.single(source, "", f"key {exc.key!r} twice in one object") from None
    except (ValueError, RecursionError) as exc:
        raise InputError.single(source, "", f"not JSON (nor JSON lines): "
                                            f"{one_line(str(exc))[:160]}") from None


def read_result_file(path: Path) -> tuple[Client, Any]:
    """The client that wrote the result at ``path`` (known from its fields) and the result."""
    from autoplan.descriptors.strict import read_limited

    data = read_limited(path, MAX_RESULT_BYTES, "a benchmark result")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError.single(str(path), "", f"not UTF-8 text (byte {exc.start})") from None
    doc = parse_result(text, str(path))
    return client_of(doc, str(path)), doc


def client_of(doc: Any, source: str) -> Client:
    """Which client wrote ``doc``: AIPerf's export has ``time_to_first_token``; SGLang's
    line ``mean_e2e_latency_ms`` or ``total_output_tokens_retokenized``; vLLM's
    ``mean_ttft_ms`` beside ``num_prompts`` or ``endpoint_type``."""
    if isinstance(doc, Mapping):
        if "time_to_first_token" in doc:
            return CLIENTS["aiperf"]
        if "total_output_tokens_retokenized" in doc or "mean_e2e_latency_ms" in doc:
            return CLIENTS["sglang-bench"]
        if "mean_ttft_ms" in doc and ("num_prompts" in doc or "endpoint_type" in doc):
            return CLIENTS["vllm-bench"]
    raise InputError.single(source, "", "not a result of vllm bench serve (--save-result), "
                                        "sglang.bench_serving (--output-file) or aiperf "
                                        "(profile_export_aiperf.json)")


# --------------------------------------------------------------------------- running

def _rate_text(load: Load) -> str:
    return "inf" if load.rate_rps is None else f"{load.rate_rps:.6g}"


def vllm_flags(load: Load, checkpoint: str, port: int, folder: Path) -> list[str]:
    """``vllm bench serve``'s flags (vllm/benchmarks/serve.py ``add_cli_args`` and the
    dataset parser's ``--random-*``): a closed loop is ``--max-concurrency`` at rate inf."""
    out = ["--backend", "vllm", "--host", "127.0.0.1", "--port", str(port), "--model", checkpoint,
           "--dataset-name", "random", "--random-input-len", str(load.input_len),
           "--random-output-len", str(load.output_len), "--random-range-ratio", "0", "--ignore-eos",
           "--num-prompts", str(load.requests), "--request-rate", _rate_text(load), "--seed", str(load.seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
    if load.concurrency is not None:
        out += ["--max-concurrency", str(load.concurrency)]
    slo = [f"{k}:{v:g}" for k, v in (("ttft", load.ttft_slo_ms), ("tpot", load.tpot_slo_ms)) if v is not None]
    if slo:
        out += ["--goodput", *slo]
    return out + ["--disable-tqdm", "--save-result", "--result-dir", str(folder),
                  "--result-filename", CLIENTS["vllm-bench"].result]


def sglang_flags(load: Load, checkpoint: str, port: int, folder: Path) -> list[str]:
    """``sglang.bench_serving``'s flags (its ``__main__`` parser): the native ``sglang``
    backend (``/generate``, EOS ignored unless ``--disable-ignore-eos``)."""
    out = ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(port), "--model", checkpoint,
           "--dataset-name", "random-ids", "--random-input-len", str(load.input_len),
           "--random-output-len", str(load.output_len), "--random-range-ratio", "1",
           "--num-prompts", str(load.requests), "--request-rate", _rate_text(load), "--seed", str(load.seed)]
    if load.concurrency is not None:
        out += ["--max-concurrency", str(load.concurrency)]
    return out + ["--disable-tqdm", "--output-details", "--output-file",
                  str(folder / CLIENTS["sglang-bench"].result)]


def aiperf_flags(load: Load, checkpoint: str, port: int, folder: Path) -> list[str]:
    """``aiperf profile``'s flags (docs/cli_options.md of v0.1.1): synthetic prompts of fixed
    length, fixed outputs with EOS ignored (docs/tutorial.md's ``--extra-inputs
    ignore_eos:true``); every request at once is a concurrency of all of them."""
    out = ["--model", checkpoint, "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "completions",
           "--streaming", "--synthetic-input-tokens-mean", str(load.input_len),
           "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(load.output_len),
           "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--request-count", str(load.requests), "--random-seed", str(load.seed)]
    if load.rate_rps is not None:
        out += ["--request-rate", f"{load.rate_rps:.6g}"]
        if load.concurrency is not None:
            out += ["--concurrency", str(load.concurrency)]
    else:
        out += ["--concurrency", str(load.concurrency if load.concurrency is not None else load.requests)]
    slo = [f"{k}:{v:g}" for k, v in (("time_to_first_token", load.ttft_slo_ms),
                                      ("inter_token_latency", load.tpot_slo_ms)) if v is not None]
    if slo:
        out += ["--goodput", " ".join(slo)]
    return out + ["--artifact-dir", str(folder)]


CLIENTS: dict[str, Client] = {c.name: c for c in (
    Client(name="vllm-bench", engine="vllm", program=("vllm", "bench", "serve"), result="vllm-bench.json",
           flags=vllm_flags, read=read_vllm, source="vllm/benchmarks/serve.py (vllm-project/vllm def9ce8)"),
    Client(name="sglang-bench", engine="sglang", program=("python", "-m", "sglang.bench_serving"),
           result="sglang-bench.jsonl", flags=sglang_flags, read=read_sglang,
           source="python/sglang/bench_serving.py (sgl-project/sglang 0033168)"),
    Client(name="aiperf", engine="trtllm", program=("aiperf", "profile"), result="profile_export_aiperf.json",
           flags=aiperf_flags, read=read_aiperf,
           source="aiperf/exporters/json_exporter.py (ai-dynamo/aiperf v0.1.1)"),
)}


def client_for(engine: str) -> Client | None:
    """The engine's own benchmark client (None: autoplan runs none for it)."""
    return next((c for c in CLIENTS.values() if c.engine == engine), None)


def measured_of(client: Client, doc: Any, source: str, load: Load | None = None) -> Measured:
    """What ``doc`` measured; SGLang's goodput counted against ``load``'s SLO, other
    clients' without an SLO taken as their request rate (every request counts)."""
    m = client.read(doc, source)
    if client.name == "sglang-bench" and load is not None:
        good = sglang_goodput(doc, source, load.ttft_slo_ms, load.tpot_slo_ms)
        m = _with_goodput(m, good)
    if m.goodput_rps is None and load is not None and load.ttft_slo_ms is None and load.tpot_slo_ms is None:
        m = _with_goodput(m, m.requests_per_s)
    return m


def _with_goodput(m: Measured, goodput: float | None) -> Measured:
    import dataclasses

    return dataclasses.replace(m, goodput_rps=goodput)


def mismatches(m: Measured, load: Load) -> list[tuple[str, str]]:
    """(field, why) where the result says it ran other traffic than ``load``: its request
    rate, concurrency, requests or lengths, where it records them."""
    out = []
    want_rate = math.inf if load.rate_rps is None else load.rate_rps
    if m.rate_rps is not None and not math.isclose(m.rate_rps, want_rate, rel_tol=1e-3):
        out.append(("request_rate", f"ran {m.rate_rps:g} requests/s, the plan {want_rate:g}"))
    if m.concurrency is not None and m.concurrency != load.concurrency and not (
            load.concurrency is None and load.rate_rps is None and m.concurrency == load.requests):
        out.append(("max_concurrency", f"ran {m.concurrency} in flight, the plan "
                                       f"{load.concurrency if load.concurrency is not None else 'no limit'}"))
    if m.requests is not None and m.requests != load.requests:
        out.append(("num_prompts", f"ran {m.requests} requests, the plan {load.requests}"))
    for key, got, want in (("random_input_len", m.input_len, load.input_len),
                           ("random_output_len", m.output_len, load.output_len)):
        if got is not None and got != want:
            out.append((key, f"ran {got} tokens, the plan {want}"))
    return out
