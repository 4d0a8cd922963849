"""One vocabulary of flags (issue 47): docs/CLI.md's table lists every option of every
command as the live app defines it (its short aliases, the older spellings kept working,
its choices), so it cannot go stale; the objectives, the image formats and the device
choices read the same across commands; a usage error quotes the value refused; an error
about a file a flag named names the flag.

``python -m tests.cli.test_vocabulary`` prints the table from the live app, to paste
into docs/CLI.md when a command gains an option (each row's meaning is the option's
help; edit it there, in the command's code)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_hostile_input import _refused
from tests.helpers import BEST, REPO, autoplan, cpu_seconds

DOC = REPO / "docs" / "CLI.md"
HEADER = "| command | flag | short | also accepted | takes | meaning |"


# --------------------------------------------------------------------------- the table, live


def _commands() -> list[tuple[str, Any]]:
    """(name as typed, click command) for the root and every command, groups walked."""
    from typer.main import get_command

    from autoplan.cli.main import app

    root = get_command(app)
    found: list[tuple[str, Any]] = [("autoplan", root)]

    def walk(group: Any, prefix: str) -> None:
        for name in sorted(group.commands):
            command = group.commands[name]
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            else:
                found.append((f"{prefix}{name}", command))

    walk(root, "")
    return found


def _takes(param: Any, ctx: Any) -> str:
    """What an option takes, as its help shows it: ``flag``, a type, or its choices
    ``a|b|c``; a range with its bounds."""
    if getattr(param, "is_flag", False):
        return "flag"
    shown = (param.display_type_rich(ctx) if hasattr(param, "display_type_rich")
             else param.make_metavar(ctx)) or ""
    shown = shown.strip("<>[]")
    if shown.endswith(" range"):
        lo, hi = getattr(param, "min", None), getattr(param, "max", None)
        kind = shown[:-len(" range")]
        bounds = [f">= {lo:g}" if lo is not None else "", f"<= {hi:g}" if hi is not None else ""]
        shown = f"{kind} " + " and ".join(b for b in bounds if b)
    return shown


def _first_sentence(text: str) -> str:
    text = " ".join((text or "").split())
    cut = re.search(r"(?<=[a-z)%])\. ", text)
    return (text[:cut.start() + 1] if cut else text).replace("|", "\\|")


def live_rows() -> list[dict[str, Any]]:
    """Every option of every command: its flag, short aliases, other long spellings,
    what it takes, its meaning (the help's first sentence); ``--help`` aside. A hidden
    option is a former spelling kept working (``tune --top-k``, "--top's former name"):
    listed with the option its help names, not as a row of its own."""
    import typer

    rows: list[dict[str, Any]] = []
    former: list[tuple[str, Any]] = []
    for name, command in _commands():
        ctx = typer._click.core.Context(command, info_name=name) if hasattr(typer, "_click") else None
        if ctx is None:
            import click

            ctx = click.Context(command, info_name=name)
        for param in command.params:
            if getattr(param, "param_type_name", "") != "option" or "--help" in param.opts:
                continue
            if getattr(param, "hidden", False):
                former.append((name, param))
                continue
            longs = [o for o in param.opts if o.startswith("--")]
            shorts = [o for o in param.opts if not o.startswith("--")]
            rows.append({"command": name, "flag": longs[0], "short": shorts, "also": longs[1:]
                         + list(param.secondary_opts), "takes": _takes(param, ctx),
                         "meaning": _first_sentence(param.help or "")})
    for name, param in former:
        named = re.search(r"--[a-z][a-z-]*", param.help or "")
        row = next((r for r in rows if r["command"] == name and named and r["flag"] == named.group()), None)
        assert row is not None, f"{name} {param.opts}: a hidden option's help names the option it spells"
        row["also"] += [o for o in param.opts if o not in row["also"] and o != row["flag"]]
    return rows


def table_markdown() -> str:
    lines = [HEADER, "|---|---|---|---|---|---|"]
    for r in live_rows():
        cells = [r["command"], f"`{r['flag']}`", " ".join(f"`{s}`" for s in r["short"]),
                 " ".join(f"`{a}`" for a in r["also"]), r["takes"].replace("|", "\\|"), r["meaning"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def doc_rows() -> dict[tuple[str, str], list[str]]:
    """docs/CLI.md's table: (command, flag) -> its cells."""
    text = DOC.read_text(encoding="utf-8")
    assert HEADER in text, "docs/CLI.md has no flag table"
    rows: dict[tuple[str, str], list[str]] = {}
    for line in text[text.index(HEADER):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        key = (cells[0], cells[1].strip("`"))
        assert key not in rows, f"docs/CLI.md lists {key} twice"
        rows[key] = cells
    return rows


def test_the_flag_table_lists_every_option_of_every_command_with_its_aliases_and_choices() -> None:
    documented = doc_rows()
    live = live_rows()
    missing = [(r["command"], r["flag"]) for r in live if (r["command"], r["flag"]) not in documented]
    assert not missing, f"docs/CLI.md lacks {missing}: python -m tests.cli.test_vocabulary prints the table"
    for r in live:
        cells = documented[(r["command"], r["flag"])]
        for alias in r["short"]:
            assert f"`{alias}`" in cells[2], (r["command"], r["flag"], alias, cells)
        for alias in r["also"]:
            assert f"`{alias}`" in cells[3], (r["command"], r["flag"], alias, cells)
        if "|" in r["takes"]:  # choices: every one listed
            for choice in r["takes"].split("|"):
                assert choice in cells[4], (r["command"], r["flag"], choice, cells)
    stale = set(documented) - {(r["command"], r["flag"]) for r in live}
    assert not stale, f"docs/CLI.md lists options no command has: {sorted(stale)}"


def test_the_flag_table_covers_every_command() -> None:
    documented = {command for command, _ in doc_rows()}
    assert documented >= {name for name, c in _commands() if c.params}
    assert {"search", "serve", "tune", "runs import", "explain", "bench", "validate"} <= documented


# short aliases that mean two flags, each older than this test and kept for the scripts
# that use them (docs/CLI.md says so): bench's -p (--preset) and runs import's -p (--plan)
TWO_MEANINGS = {"-p": {"--preset", "--plan"}}


def test_a_short_alias_means_one_long_flag_across_every_command_and_group() -> None:
    """Where a flag was renamed (runs import's --out, now --runs), its short alias goes with
    the old spelling it stands for: -o still means --out there."""
    spellings: dict[str, list[set[str]]] = {}
    for r in live_rows():
        for alias in r["short"]:
            spellings.setdefault(alias, []).append({r["flag"], *r["also"]})
    two = {alias: {sorted(s)[0] if len(s) == 1 else "/".join(sorted(s)) for s in found}
           for alias, found in spellings.items() if not set.intersection(*found)}
    assert two == TWO_MEANINGS
    assert "`-p`" in DOC.read_text(encoding="utf-8").split("## Every flag")[0]


# --------------------------------------------------------------------------- objectives


SMALL = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "64", "-s", "4096",
         "--train-tokens", "1e11")
SERVE = ("serve", "examples/serving/chat-job.yaml", "--gpus", "4,8", "--requests", "50")


def test_serve_and_search_objectives_share_cost_and_energy_and_their_values_are_the_enums() -> None:
    from autoplan.cli.options import _OTHER_OBJECTIVE
    from autoplan.serving.sweep import ServeObjective
    from autoplan.whatif.economics import Objective

    search, serve = {o.value for o in Objective}, {o.value for o in ServeObjective}
    assert search & serve == {"cost", "energy"}
    assert set(_OTHER_OBJECTIVE["search"]) == serve - search
    assert set(_OTHER_OBJECTIVE["serve"]) == search - serve
    text = DOC.read_text(encoding="utf-8")
    assert "## Objectives" in text and "goodput" in text and "time" in text


@pytest.mark.parametrize(("args", "needles"), [
    ((*SMALL, "--objective", "goodput"), ("--objective: expected one of time, cost, energy, got 'goodput'",
                                          "autoplan serve's", "days to train, time")),
    ((*SERVE, "--objective", "time"), ("--objective: expected one of goodput, cost, energy, got 'time'",
                                       "autoplan search's", "goodput per GPU, goodput")),
])
def test_each_command_refuses_the_others_objective_naming_its_own(args: tuple[str, ...],
                                                                   needles: tuple[str, ...]) -> None:
    err = _refused(*args, needles=needles, megabytes=None)
    assert err.strip().splitlines()[-1].startswith("autoplan: error: see 'autoplan")


@pytest.mark.parametrize("objective", ["cost", "energy"])
def test_cost_and_energy_are_taken_by_both_commands(objective: str) -> None:
    with cpu_seconds():
        r = autoplan(*SMALL[:-2], "--gpus", "8,16", "--train-tokens", "1e11", "--objective", objective,
                     "--top", "1", "-f", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["train"]["objective"] == objective


def test_serve_takes_cost_as_its_objective() -> None:
    r = autoplan(*SERVE, "--objective", "cost", "-f", "json")
    assert r.returncode in (0, 1), r.stderr  # 1: no count meets the SLO in 50 requests
    assert json.loads(r.stdout)["objective"] == "cost"


# --------------------------------------------------------------------------- images


def _no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


PNG_ERROR = 'PNG needs matplotlib: pip install "autoplan[png]"'


@pytest.mark.parametrize(("args", "flag"), [
    ((*SMALL, "--plot", "front.png"), "--plot"),
    ((*SERVE, "--plot", "front.png"), "--plot"),
    (("explain", BEST, "--timeline", "t.png"), "--timeline"),
])
def test_a_png_without_matplotlib_is_refused_naming_the_flag_and_the_extra(
        args: tuple[str, ...], flag: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_matplotlib(monkeypatch)
    args = tuple(str(tmp_path / str(a)) if str(a).endswith(".png") else a for a in args)
    err = _refused(*args, needles=(f"{flag}: {PNG_ERROR}",), megabytes=None)
    assert "pip install matplotlib" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_png_extra_spelled_in_the_error_is_the_readmes_and_the_projects() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'pip install "autoplan[png]"' in readme and 'pip install ".[png]"' in readme
    assert re.search(r'^png = \["matplotlib', pyproject, re.M)
    assert re.search(r'^name = "autoplan"', pyproject, re.M)


@pytest.mark.parametrize("args", [(*SMALL, "--plot", "front.pdf"), (*SERVE, "--plot", "front.jpg")])
def test_a_plot_neither_svg_nor_png_is_refused(args: tuple[str, ...]) -> None:
    _refused(*args, needles=("--plot: expected a .svg or .png file",), megabytes=None)


def test_search_and_serve_plot_their_fronts_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for args in ((*SMALL[:-2], "--gpus", "8,16", "--train-tokens", "1e11", "--top", "1"), SERVE):
        plot = tmp_path / f"{args[0]}.png"
        r = autoplan(*args, "--plot", plot)
        assert r.returncode in (0, 1), r.stderr
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_png_fronts_draw_names_as_written_not_as_mathtext() -> None:
    pytest.importorskip("matplotlib")
    from autoplan.api.png import training_front_png
    from autoplan.whatif.economics import Objective
    from autoplan.whatif.sweep import sweep
    from tests.helpers import make_plan

    plan = make_plan()
    result = sweep(plan.model, [plan.cluster], plan.job, _space(), train_tokens=1e11,
                   objective=Objective.COST, price_per_gpu_hour=2.0, top_k=1)
    png = training_front_png(result.points, result.front, result.points[0], {8: "$x$ \u202e \\frac"},
                             "a $title$ with $ signs \x1b[2J", budget_usd=1e3)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def _space() -> Any:
    from autoplan.descriptors.space import load_space

    return load_space("megatron")


# --------------------------------------------------------------------------- --device


@pytest.mark.parametrize("command", ["bench", "validate"])
def test_device_shows_its_choices_in_help_and_refuses_others(command: str) -> None:
    text = autoplan(command, "--help", env={"COLUMNS": "200"}).stdout
    assert re.search(r"--device\s+-d\s+<cpu\|cuda>", text), text
    args = ("bench", "--device", "tpu") if command == "bench" else ("validate", BEST, "--device", "tpu")
    _refused(*args, needles=("--device: expected one of cpu, cuda, got 'tpu'",), megabytes=None)


def test_exports_choices_in_help_are_the_targets_launchers_and_engines() -> None:
    from autoplan.cli.commands.export import EXPORT_TARGETS, SLURM_LAUNCHERS
    from autoplan.export import Launcher, Target
    from autoplan.export.deploy import TARGETS
    from autoplan.serving.engine import Engine

    assert EXPORT_TARGETS.strip("<>").split("|") == ([t.value for t in Target] + [e.value for e in Engine]
                                                     + list(TARGETS))
    assert SLURM_LAUNCHERS.strip("<>").split("|") == [launcher.value for launcher in Launcher]


def test_bench_refuses_an_unknown_preset_before_measuring() -> None:
    _refused("bench", "--preset", "huge", needles=("--preset: expected one of tiny, default, full",),
             megabytes=None)


# --------------------------------------------------------------------------- a repeated flag


@pytest.mark.parametrize(("args", "needle"), [
    (("search", "-m", "llama3-8b", "--top", "3", "--top", "-5"), "--top: expected a value >= 1, got '-5'"),
    (("search", "-m", "llama3-8b", "-k3", "-k-5"), "--top: expected a value >= 1, got '-5'"),
    (("search", "-m", "llama3-8b", "--top=3", "--top=x"), "--top: expected a whole number, got 'x'"),
    (("serve", "--top", "2", "--top", "0"), "--top: expected a value >= 1, got '0'"),
    (("tune", "-m", "llama3-8b", "--gpus", "3", "--gpus", "0"), "--gpus: expected a value >= 1, got '0'"),
    (("tune", "-m", "llama3-8b", "-n", "3", "-n0"), "--gpus: expected a value >= 1, got '0'"),
])
def test_a_repeated_flag_quotes_the_value_refused_the_last(args: tuple[str, ...], needle: str) -> None:
    err = _refused(*args, needles=(needle,), megabytes=None)
    assert "got '3'" not in err and "got '2'" not in err


def test_a_repeated_legal_flag_takes_the_last() -> None:
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "64", "-s", "4096",
                 "--top", "7", "--top", "2", "-f", "json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["plans"]) == 2


# --------------------------------------------------------------------------- errors name their flag


RUNS_HEADER = "model,cluster,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s\n"


@pytest.mark.parametrize("command", ["check", "evaluate"])
@pytest.mark.parametrize("content", [
    "a,b\n1,2\n",  # unknown columns
    RUNS_HEADER + "llama3-8b,/dev/zero,64,4096,8,1,1,1,1.0\n",  # a row's cluster a device
    RUNS_HEADER + "llama3-8b,dgx-h100,64,4096,8,1,1,1,nan\n",
])
def test_a_bad_runs_log_is_refused_naming_runs_and_the_log(tmp_path: Path, command: str,
                                                           content: str) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text(content)
    err = _refused(command, BEST, "--runs", runs, needles=(f"--runs: {runs}: ",))
    assert all(line.startswith(f"autoplan: error: --runs: {runs}: ") for line in err.strip().splitlines())


@pytest.mark.parametrize("command", ["check", "evaluate"])
def test_a_special_file_as_runs_is_refused_naming_the_flag(command: str) -> None:
    _refused(command, BEST, "--runs", "/dev/zero", needles=("--runs: /dev/zero: not a regular file",))


SEARCH = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "64", "-s", "4096")


@pytest.mark.parametrize("args", [
    SEARCH, ("evaluate", BEST), ("check", BEST), ("explain", BEST),
])
def test_a_special_file_as_stack_is_refused_fast_naming_stack_and_the_path(args: tuple[str, ...]) -> None:
    _refused(*args, "--stack", "/dev/zero", needles=("--stack: /dev/zero: not a regular file",))


def test_a_stack_file_that_is_not_yaml_names_the_flag(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text("stack: [\n")
    _refused(*SEARCH, "--stack", bad, needles=(f"--stack: {bad}: line",))


SERVE_DRAFT = ("serve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--input-len", "512",
               "--output-len", "64", "--rate", "2", "--requests", "20", "--speculative", "draft",
               "--spec-tokens", "3", "--acceptance-rate", "0.7")


@pytest.mark.parametrize("content", [None, "x: [\n", '{"x": 1}'])
def test_a_bad_draft_model_file_is_refused_naming_draft_model(tmp_path: Path, content: str | None) -> None:
    if content is None:
        path = Path("/dev/zero")
    else:
        path = tmp_path / ("config.json" if content.startswith("{") else "draft.yaml")
        path.write_text(content)
    _refused(*SERVE_DRAFT, "--draft-model", path, needles=(f"--draft-model: {path}: ",))


def test_a_bad_profile_names_the_flag(tmp_path: Path) -> None:
    _refused("explain", BEST, "--profile", "/dev/zero", needles=("--profile: /dev/zero: not a regular file",))


# --------------------------------------------------------------------------- explain


def test_explain_json_is_evaluates_json_with_the_explanation() -> None:
    r = autoplan("explain", BEST, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ev = json.loads(autoplan("evaluate", BEST, "--format", "json").stdout)
    plan = doc["plans"][0]
    explanation = plan.pop("explanation")
    assert plan == ev["plans"][0]
    pp = plan["layout"]["pp"]
    assert [s["stage"] for s in explanation["stages"]] == list(range(pp))
    timeline = explanation["timeline"]
    assert len(timeline["stages"]) == pp and timeline["makespan_s"] > 0
    assert all(0 <= s["idle_share"] < 1 for s in timeline["stages"])


def test_explain_takes_stack_and_profile_as_evaluate_does() -> None:
    profile = REPO / "examples" / "cpu" / "profile.csv"
    plan = REPO / "examples" / "cpu" / "plan-pp2.yaml"
    for extra in (("--stack", "torchtitan"), ("--profile", profile)):
        ex = json.loads(autoplan("explain", plan, *extra, "-f", "json").stdout)["plans"][0]
        ev = json.loads(autoplan("evaluate", plan, *extra, "-f", "json").stdout)["plans"][0]
        assert ex["prediction"] == ev["prediction"], extra
    torchtitan = json.loads(autoplan("explain", plan, "--stack", "torchtitan", "-f", "json").stdout)
    assert torchtitan["plans"][0]["prediction"]["stack"] == "torchtitan"


def test_explain_of_a_serving_plan_takes_json_and_refuses_stack() -> None:
    plan = REPO / "examples" / "serving" / "chat-plan.yaml"
    r = autoplan("explain", plan, "-f", "json")
    assert r.returncode in (0, 1) and json.loads(r.stdout)["plans"][0]["kind"] == "serving"
    _refused("explain", plan, "--stack", "torchtitan", needles=("--stack: sets a training plan's",),
             megabytes=None)


# --------------------------------------------------------------------------- labels and columns


def test_evaluate_runs_labels_the_predicted_and_the_corrected_step_time() -> None:
    r = autoplan("evaluate", "examples/cpu/plan-pp2.yaml", "--runs", "examples/runs/tiny-llama-2cpu.csv")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("step time:"))
    assert re.search(r"step time: [0-9.]+ s predicted by the cost model \(above\); [0-9.]+ s corrected by "
                     r"the 3 measured runs of examples/runs/tiny-llama-2cpu.csv", line), line


def test_the_serve_sweeps_front_table_has_a_gpu_column() -> None:
    r = autoplan(*SERVE)
    front = r.stdout[r.stdout.index("front: throughput per GPU"):]
    header = next(x for x in front.splitlines() if "deployment" in x)
    assert re.search(r"GPUs\s*\S\s*deployment", header), header
    rows = [x for x in front.splitlines() if re.search(r"\dx ", x)]
    assert rows and all(re.search(r"^\W*(4|8)\s", x) for x in rows), rows


def test_one_counts_front_table_stays_as_it_was() -> None:
    r = autoplan("serve", "examples/serving/chat-job.yaml", "--requests", "50")
    front = r.stdout[r.stdout.index("front: throughput per GPU"):]
    header = next(x for x in front.splitlines() if "deployment" in x)
    assert "GPUs" not in header


if __name__ == "__main__":
    sys.stdout.write(table_markdown())


@pytest.mark.parametrize(("args", "flag", "value"), [
    (("search", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "6_4", "-s", "4096"),
     "--global-batch", "6_4"),
    ((*SEARCH, "--min-headroom", "1_0"), "--min-headroom", "1_0"),
    ((*SEARCH, "--top", "\u0663"), "--top", "\u0663"),  # ARABIC-INDIC DIGIT THREE: int() reads 3
    (("serve", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--input-len", "1_024",
      "--output-len", "128", "--rate", "1"), "--input-len", "1_024"),
])
def test_a_number_flag_written_with_an_underscore_or_other_digits_is_refused(args, flag, value):
    # int("6_4") is 64 and float("1_0") is 10: a typo would run silently as another number
    err = _refused(*args, needles=(f"autoplan: error: {flag}: expected a number in plain ASCII digits",),
                   megabytes=None)
    assert repr(value) in err or value in err
