"""Absurd and hostile input ends quickly with exit 2, the file and field named, bounded
memory and nothing echoed back whole: deep nesting, alias bombs, recursive aliases,
oversized and endless files, absurd sizes, thousands of problems, fuzzed documents."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.descriptors.job import MAX_GLOBAL_BATCH, MAX_SEQ_LEN
from autoplan.descriptors.strict import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, MAX_PROBLEMS
from autoplan.parallel.pp import MAX_PIPELINE_OPS
from tests.helpers import BEST, autoplan, cpu_seconds

JOB = "cluster: dgx-h100\njob: {global_batch: 8, seq_len: 4096}\n"
SMALL = ("-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8")


@pytest.fixture(autouse=True, scope="module")
def _imported() -> None:
    """The commands' imports happen once, as in a process that starts: not timed here."""
    autoplan("search", "--help")
    autoplan("evaluate", BEST)


def _refused(*args: object, needles: tuple[str, ...] = (), seconds: float = 1.0,
             megabytes: float | None = 64) -> str:
    """Run in this process: exit 2 within ``seconds`` of this process's CPU time (well
    under the second a user notices, imports aside: a first run, untimed, pays them; CPU
    time, not wall-clock, so that other jobs sharing the machine cannot fail it), allocating
    under ``megabytes`` (a further run, traced, three times slower: ``megabytes=None`` skips
    it where nothing read could grow, a flag's value or a usage error; ``cpu_seconds``)."""
    autoplan(*args)  # once untimed: the first run in a process pays the command's imports
    with cpu_seconds() as took:
        r = autoplan(*args)
    elapsed = took[0]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    assert elapsed < seconds, elapsed
    if megabytes is not None:
        tracemalloc.start()
        try:
            autoplan(*args)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < megabytes * 2**20, peak
    for needle in needles:
        assert needle in r.stderr, r.stderr[-2000:]
    assert len(r.stderr) < 20_000  # nothing echoed back whole
    return r.stderr


def _file(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + f"\nmodel: *{chr(ord('a') + levels)}\n"


@pytest.mark.parametrize("where", ["job", "plan"])
def test_a_billion_laughs_is_refused_before_any_value_is_built(tmp_path: Path, where: str) -> None:
    path = _file(tmp_path, _bomb() + JOB)
    args = ("search", path) if where == "job" else ("evaluate", path)
    _refused(*args, needles=(f"{path}: line", f"more than {MAX_NODES:,} values"))


def test_an_alias_inside_itself_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, "model: &a [*a]\n" + JOB)
    _refused("search", path, needles=("an alias refers to the value holding it",))


@pytest.mark.parametrize("shape", ["flow", "block"])
def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path: Path, shape: str) -> None:
    if shape == "flow":  # as deep as the file size allows
        depth = MAX_FILE_BYTES // 2 - 10
        text = "model: " + "[" * depth + "]" * depth + "\n"
    else:
        text = "".join("  " * i + "k:\n" for i in range(MAX_DEPTH + 10)) + "  " * 74 + "x: 1\n"
    path = _file(tmp_path, text)
    err = _refused("search", path, needles=(f"{path}: line",))
    assert "nesting depth" in err or f"nested deeper than {MAX_DEPTH} levels" in err


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = _file(tmp_path, "model: '" + "x" * (MAX_FILE_BYTES + 1) + "'\n")
    _refused("search", path, needles=(f"{path}: larger than {MAX_FILE_BYTES >> 10} KiB",))


def test_an_endless_file_is_refused_unread() -> None:
    _refused("search", "/dev/zero", needles=("/dev/zero: not a regular file",))


# issue 34, item 1: every file input goes through one reader (strict.read_limited): regular
# files only, a size cap, no blocking on a FIFO, a symbolic link loop refused
@pytest.mark.parametrize("kind", ["fifo", "loop", "device"])
@pytest.mark.parametrize("where", ["plan", "profile"])
def test_special_files_as_inputs_are_refused_without_blocking(tmp_path: Path, kind: str,
                                                              where: str) -> None:
    import os
    if kind == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
        needle = "not a regular file (a FIFO)"
    elif kind == "loop":
        target = tmp_path / "loop1"
        os.symlink(tmp_path / "loop2", target)
        os.symlink(target, tmp_path / "loop2")
        needle = "cannot read file"
    else:
        target, needle = Path("/dev/zero"), "not a regular file (a device"
    args = ("evaluate", target) if where == "plan" else ("evaluate", BEST, "--profile", target)
    _refused(*args, needles=(f"{target}: {needle}",))


def test_a_long_name_is_shown_cut_short(tmp_path: Path) -> None:
    name = "x" * 20_000
    path = _file(tmp_path, f"model: {name}\n" + JOB)
    err = _refused("search", path, needles=("unknown model 'xxx",))
    assert name not in err and "..." in err


def test_thousands_of_problems_are_reported_as_the_first_few(tmp_path: Path) -> None:
    path = _file(tmp_path, "".join(f"k{i}: {i}\n" for i in range(2000)))
    err = _refused("search", path, needles=(f"more problems (the first {MAX_PROBLEMS} are shown)",))
    assert err.count("unknown field") == MAX_PROBLEMS


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--global-batch", "1000000000000", f"expected a value <= {MAX_GLOBAL_BATCH:,}"),
    ("--seq-len", "1000000000000", f"expected a value <= {MAX_SEQ_LEN:,}"),
    ("--gpus", "1000000000", "expected GPU counts from 1 to 1,048,576"),
])
def test_absurd_sizes_are_refused_at_once(flag: str, value: str, needle: str) -> None:
    args = {"--global-batch": 64, "--seq-len": 4096} | {flag: value}
    base = ("search", "-m", "llama3-8b", "-c", "dgx-h100")
    rest = [] if flag == "--gpus" else ["--gpus", "8"]
    _refused(*base, *rest, *(x for kv in args.items() for x in map(str, kv)), needles=(needle,))


def test_a_job_file_with_absurd_sizes_names_the_field(tmp_path: Path) -> None:
    path = _file(tmp_path, "model: llama3-8b\ncluster: dgx-h100\ngpus: 8\n"
                           "job: {global_batch: 1e15, seq_len: 4096}\n")
    _refused("search", path, needles=(f"{path}: job.global_batch: expected a value <=",))


def test_explain_refuses_a_timeline_longer_than_the_simulator_walks() -> None:
    _refused("explain", BEST, "--microbatches", "100000000",
             needles=("--microbatches: at most", f"{MAX_PIPELINE_OPS:,} pipeline operations"))


def test_a_plan_past_the_simulators_limit_breaks_a_named_rule(tmp_path: Path) -> None:
    doc = yaml.safe_load(BEST.read_text())
    doc["job"]["global_batch"] = MAX_GLOBAL_BATCH
    doc["micro_batch"] = 1
    path = _file(tmp_path, yaml.safe_dump(doc), "plan.yaml")
    _refused("evaluate", path, needles=("pipeline operations per step",))


def test_the_search_counts_plans_past_the_limit_as_broken_rules() -> None:
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "4", "--global-batch",
                 str(MAX_GLOBAL_BATCH), "--seq-len", "1024", "-f", "json")
    # every plan runs at least 2**24 / (4 * 16) = 2**18 microbatches: none is simulated
    assert 2**18 > MAX_PIPELINE_OPS
    assert r.returncode == 1, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert stats["pruned"]["pipeline-ops"] > 0 and stats["evaluated"] == 0


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=True), st.text(max_size=30))
_docs = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=25)
_keys = st.sampled_from(["model", "cluster", "job", "layout", "micro_batch", "schedule", "zero",
                         "recompute", "stages", "gpus", "space", "stack", "prediction"])


@pytest.mark.slow  # more than about 3 s on 2 cores
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.dictionaries(_keys, _docs, max_size=6))
def test_fuzzed_plan_and_job_files_never_end_in_a_traceback(tmp_path: Path, doc: dict) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    for command in ("evaluate", "check", "search"):
        r = autoplan(command, path)
        assert r.returncode in (1, 2), (command, doc, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (command, doc, r.stderr[-3000:])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=400))
def test_fuzzed_text_is_never_a_traceback(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    r = autoplan("evaluate", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, (text, r.stderr[-2000:])


# A name is data: one that could start a new YAML line (U+2028, U+2029, U+0085), drive a
# terminal (ESC), reorder text (U+202E) or not encode at all (a lone surrogate) is refused
# where it is loaded, naming the field, before any export could write it (issue 34, item 2).
HOSTILE_NAMES = ["m\u2028injected_key: 1", "m\u2029x", "m\u0085enable_attention_dp: true",
                 "m\x1b]0;retitled\x07", "m\u202eevil", "\ud800x", "m\nx: 1", "x" * 201]


@pytest.mark.parametrize("field", ["model", "cluster"])
def test_a_name_that_could_inject_is_refused_at_load_naming_the_field(tmp_path: Path,
                                                                      field: str) -> None:
    from autoplan.descriptors.library import resolve_cluster, resolve_model

    base = yaml.safe_load(BEST.read_text())
    base.pop("prediction", None)
    for i, name in enumerate(HOSTILE_NAMES):
        doc = dict(base)
        if field == "model":
            doc["model"] = {**resolve_model("llama3-8b").to_dict(), "name": name}
        else:
            doc["cluster"] = {**resolve_cluster("dgx-h100").to_dict(), "nodes": 8, "name": name}
        path = tmp_path / f"plan{i}.json"
        path.write_text(json.dumps(doc))  # JSON carries every code point, lone surrogates too
        out = tmp_path / f"out{i}"
        for command in (("evaluate", path), ("export", path, "--to", "nemo", "-o", out)):
            r = autoplan(*command)
            assert r.returncode == 2 and "Traceback" not in r.stderr, (name, r.stderr[-500:])
            assert f"{field}.name: expected a name" in r.stderr, (name, r.stderr[-500:])
        assert not out.exists()
    _refused("evaluate", path, needles=(f"{field}.name: expected a name",))  # fast, bounded


def _plan_json(tmp_path: Path, model: dict | None = None, device: dict | None = None) -> Path:
    """The best example plan as JSON, its model (llama3-8b) and cluster (dgx-h100 x 8)
    written out whole with ``model`` and ``device`` fields changed."""
    from autoplan.descriptors.library import resolve_cluster, resolve_model

    doc = yaml.safe_load(BEST.read_text())
    doc.pop("prediction", None)
    doc["model"] = {**resolve_model("llama3-8b").to_dict(), **(model or {})}
    cluster = {**resolve_cluster("dgx-h100").to_dict(), "nodes": 8}
    doc["cluster"] = {**cluster, "device": {**cluster["device"], **(device or {})}}
    return _file(tmp_path, json.dumps(doc), "plan.json")


def _space(tmp_path: Path, **changes: object) -> Path:
    doc = yaml.safe_load((Path(__file__).parents[2] / "searchspace" / "megatron.yaml").read_text())
    doc["searchspace"].update(changes)
    return _file(tmp_path, yaml.safe_dump(doc), "space.yaml")


def _pooled(tmp_path: Path, between: str) -> Path:
    return _file(tmp_path, "cluster:\n  name: p\n  pools:\n"
                           "    - {name: hopper, cluster: dgx-h100, nodes: 4}\n"
                           "    - {name: ampere, cluster: dgx-a100, nodes: 4}\n"
                           f"  between_pools: {between}\n", "pools.yaml")


def _hf(tmp_path: Path, **changes: object) -> Path:
    data = json.loads((Path(__file__).parents[1] / "data" / "hf" / "Meta-Llama-3-8B.json").read_text())
    folder = tmp_path / "hf"
    folder.mkdir()
    return _file(folder, json.dumps({**data, **changes}), "config.json")


# issue 34, items 3 and 7: sizes past anything physical were tracebacks (OverflowError,
# ZeroDivisionError) or were accepted; each is refused at load, naming the file and field
@pytest.mark.parametrize(("make", "needle"), [
    (lambda t: ("evaluate", _plan_json(t, model={"vocab": 1e308})),
     "plan.json: model.vocab: expected a value <="),
    (lambda t: ("evaluate", _plan_json(t, model={"vocab": 10**300})), "got 1e+300"),
    (lambda t: ("search", "-m", _hf(t, vocab_size=1e308), "-c", "dgx-h100", "-n", "8", "-b", "8",
                "-s", "4096"), "config.json: vocab_size: expected a value <="),
    (lambda t: ("search", "-m", _hf(t, hidden_size=1e20), "-c", "dgx-h100", "-n", "8", "-b", "8",
                "-s", "4096"), "config.json: hidden_size: expected a value <="),
    (lambda t: ("search", "-m", "llama3-70b", "-c", _pooled(t, "{bandwidth_GBps: 25, latency_us: 1e308}"),
                "-b", "64", "-s", "4096"), "cluster.between_pools.latency_us: expected a value <="),
    (lambda t: ("search", "-m", "llama3-70b", "-c", _pooled(t, "{bandwidth_GBps: 1e-300, latency_us: 10}"),
                "-b", "64", "-s", "4096"), "cluster.between_pools.bandwidth_GBps: expected a value >="),
    (lambda t: ("search", "-m", "mixtral-8x7b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "4096",
                "--moe-imbalance", "1e308"), "job.moe_imbalance: expected a value <="),
    (lambda t: ("search", *SMALL, "-b", "8", "-s", "4096", "--space", _space(t, micro_batch=[1, 10**30])),
     "space.yaml: searchspace.micro_batch[1]: expected a value <= "),
    (lambda t: ("evaluate", _plan_json(t, device={"mem_GiB": 1e-300})),
     "plan.json: cluster.device.mem_GiB: expected a value >= "),
], ids=["plan-vocab-float", "plan-vocab-int", "hf-vocab", "hf-hidden", "pool-latency",
        "pool-bandwidth", "moe-imbalance", "space-micro-batch", "device-memory"])
def test_absurd_sizes_in_files_and_flags_are_refused_naming_the_field(tmp_path: Path, make, needle) -> None:
    _refused(*make(tmp_path), needles=(needle,))


# issue 34, item 7: what YAML 1.1 and JSON read silently differently from what a person wrote
@pytest.mark.parametrize(("name", "text", "needle"), [
    ("octal.yaml", "model: llama3-8b\ncluster: dgx-h100\ngpus: 8\njob: {global_batch: 010, seq_len: 4096}\n",
     "ambiguous integer '010'"),
    ("dup.json", '{"model": "llama3-8b", "model": "llama3-70b"}', "invalid JSON: duplicate key 'model'"),
    ("merge.yaml", "base: &b {global_batch: 8}\njob:\n  <<: *b\n  seq_len: 4096\n",
     "merge keys (<<) are not read"),
], ids=["yaml-octal", "json-duplicate", "yaml-merge"])
def test_what_a_loader_would_read_otherwise_is_refused(tmp_path: Path, name: str, text: str,
                                                       needle: str) -> None:
    _refused("search", _file(tmp_path, text, name), needles=(f"{name}: ", needle))


# issue 34, item 1: the trace flag, a job file's trace, a snapshot folder's config.json and
# the profile of bench and validate are read as every other file
@pytest.mark.parametrize("where", ["trace-flag", "job-trace", "snapshot", "bench-profile",
                                   "validate-profile"])
@pytest.mark.parametrize("kind", ["fifo", "loop"])
def test_every_file_input_refuses_fifos_and_link_loops(tmp_path: Path, where: str, kind: str) -> None:
    import os
    name = "config.json" if where == "snapshot" else "input"
    folder = tmp_path / "snap"
    folder.mkdir()
    target = folder / name
    if kind == "fifo":
        os.mkfifo(target)
        needle = "not a regular file (a FIFO)"
    else:
        os.symlink(folder / "other", target)
        os.symlink(target, folder / "other")
        needle = "cannot read file"
    serve = ("serve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8")
    args = {
        "trace-flag": (*serve, "--trace", target),
        "job-trace": ("serve", _file(tmp_path, "model: llama3-8b\ncluster: dgx-h100\ngpus: 8\n"
                                               f"workload: {{arrival: {{trace: {target}}}}}\n")),
        "snapshot": ("search", "-m", folder, "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "4096"),
        "bench-profile": ("bench", "--profile", target, "--fit"),
        "validate-profile": ("validate", "examples/cpu/plan-pp2.yaml", "--profile", target),
    }[where]
    _refused(*args, needles=(needle,))


def test_a_snapshot_folder_named_bare_is_read_as_a_folder(tmp_path: Path) -> None:
    from tests.helpers import autoplan as run

    folder = tmp_path / "my-snapshot"
    folder.mkdir()
    r = run("search", "-m", "my-snapshot", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "4096", cwd=tmp_path)
    assert r.returncode == 2 and "my-snapshot/config.json: file not found" in r.stderr, r.stderr
    (folder / "config.json").write_text((Path(__file__).parents[1] / "data" / "hf" / "Meta-Llama-3-8B.json")
                                        .read_text())
    r = run("search", "-m", "my-snapshot", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "4096",
            "--top", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-500:]


# issue 34, item 5: what --describe writes must load again, whatever the flags held
def test_bench_describe_refuses_a_name_that_would_inject(tmp_path: Path) -> None:
    out = tmp_path / "d.yaml"
    _refused("bench", "--profile", "examples/cpu/profile.csv", "--describe", out,
             "--name", "x\ninjected: 1 #", megabytes=None,
             needles=("--name: expected a name without control",))
    assert not out.exists()


def test_bench_describe_keeps_a_hostile_profile_path_on_one_comment_line(tmp_path: Path) -> None:
    from autoplan.descriptors.library import resolve_cluster
    from tests.helpers import autoplan as run

    profile = tmp_path / "pro\nfile\u2028x.csv"
    profile.write_text((Path(__file__).parents[2] / "examples" / "cpu" / "profile.csv").read_text())
    out = tmp_path / "d.yaml"
    r = run("bench", "--profile", profile, "--describe", out)
    assert r.returncode == 0, r.stderr[-500:]
    assert resolve_cluster(str(out)).name == "local-cpu"
    assert all(line.startswith("#") for line in out.read_text().splitlines()[:3])


# issue 34, item 7: a trace's times and the SLOs have physical ranges
@pytest.mark.parametrize(("rows", "needle"), [
    ("0,100,10\n1e308,100,10\n", "row 3, arrival_s: expected seconds within 1e+11 of 0"),
    ("0,100,10\n1e9,100,10\n", "row 3, arrival_s: arrives 1e+09 s after the first request (row 2)"),
], ids=["absurd-arrival", "span"])
def test_trace_times_past_any_replay_are_refused(tmp_path: Path, rows: str, needle: str) -> None:
    trace = _file(tmp_path, "arrival_s,input_len,output_len\n" + rows, "t.csv")
    _refused("serve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--trace", trace,
             needles=(needle,))


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--tpot-slo", "1e-300", "--tpot-slo: expected milliseconds from 0.001 to 1e+09, got 1e-300"),
    ("--ttft-slo", "1e300", "--ttft-slo: expected milliseconds from 0.001 to 1e+09"),
    ("--rate", "1e-300", "--rate: expected requests/s from 0.0001 to 1e+06"),
])
def test_serving_flags_past_any_physical_value_are_refused(flag: str, value: str, needle: str) -> None:
    args = ("serve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--input-len", "10",
            "--output-len", "10")
    _refused(*args, *(("--rate", "1") if flag != "--rate" else ()), flag, value, needles=(needle,),
             megabytes=None)


def test_a_job_files_slo_past_any_physical_value_names_the_field(tmp_path: Path) -> None:
    job = _file(tmp_path, "model: llama3-8b\ncluster: dgx-h100\ngpus: 8\n"
                          "workload: {input_len: 10, output_len: 10, arrival: {rate_rps: 1}}\n"
                          "slo: {tpot_ms: 1e-300}\n")
    _refused("serve", job, needles=("slo.tpot_ms: expected a value >= 0.001",))


# issue 34, item 8: a trailing slash means a directory
def test_an_output_with_a_trailing_slash_is_a_directory(tmp_path: Path) -> None:
    from tests.helpers import autoplan as run

    r = run("search", *SMALL, "-b", "8", "-s", "4096", "--out", f"{tmp_path}/newdir/")
    assert r.returncode == 2 and "names a directory (a trailing '/')" in r.stderr, r.stderr
    assert not (tmp_path / "newdir").exists()
    r = run("export", BEST, "--to", "megatron", "--out", f"{tmp_path}/launch/")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "launch" / "pretrain_megatron.sh").is_file()


# issue 34, item 6: a path (or any text) holding an escape sequence is shown, not obeyed
def test_escape_sequences_in_paths_are_shown_not_sent_to_the_terminal(tmp_path: Path) -> None:
    from tests.helpers import autoplan as run

    plan = tmp_path / "e\x1b]0;retitled\x07.yaml"
    plan.write_text(BEST.read_text())
    for args in (("evaluate", plan), ("check", plan), ("evaluate", tmp_path / "gone\x1b[2J.yaml"),
                 ("search", *SMALL, "-b", "8", "-s", "4096", "--top", "1",
                  "--out", tmp_path / "o\x1b[2J.yaml")):
        r = run(*args)
        assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr, args
        assert "\\x1b" in r.stdout + r.stderr, args


# issue 34, newcomer 3: typer's own usage errors read as every other error
@pytest.mark.parametrize(("args", "first"), [
    (("search", "--train-tokens", "abc"), "autoplan: error: --train-tokens: expected a number, got 'abc'"),
    (("search", "--top", "0"), "autoplan: error: --top: expected a value >= 1, got '0'"),
    (("serve", "--top", "10" * 12), "autoplan: error: --top: expected a value <= 1000, got '1010"),
    (("search", "--dtype", "fp4"), "autoplan: error: --dtype: expected one of bf16, fp16, fp8, got 'fp4'"),
    (("search", "--objective", "bogus"), "autoplan: error: --objective: expected one of time, cost, energy"),
    (("check", BEST, "--max-regression", "nan"), "autoplan: error: --max-regression: expected a value >= 0"),
    (("export", BEST), "autoplan: error: --to: required"),
    (("search", "--topp", "1"), "autoplan: error: --topp: no such option; did you mean --top"),
    (("search", "-m"), "autoplan: error: -m: expected a value"),
    (("evaluate",), "autoplan: error: PLAN.yaml: missing argument"),
    (("nosuch",), "autoplan: error: no such command 'nosuch'"),
], ids=lambda v: v if isinstance(v, str) and v.startswith("auto") is False else None)
def test_usage_errors_have_the_one_error_format(args: tuple, first: str) -> None:
    err = _refused(*args, megabytes=None)
    lines = err.strip().splitlines()
    assert lines[0].startswith(first), lines
    assert all(line.startswith("autoplan: error: ") for line in lines), lines
    assert lines[-1].startswith("autoplan: error: see 'autoplan"), lines


def test_an_empty_model_name_is_an_unknown_model_not_the_current_folder(tmp_path: Path) -> None:
    """A model named "" is no HuggingFace snapshot folder (Path("") is the current
    directory): it was read as one, looked for its config.json, and recursed until Python
    gave up (found by the fuzzer above)."""
    path = tmp_path / "plan.yaml"
    path.write_text("model: ''\n")
    _refused("evaluate", path, needles=("model: unknown model ''",), megabytes=None)
    _refused("search", "--model", "", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
             "--seq-len", "1024", needles=("model: missing",), megabytes=None)
