"""The data flow (docs/ARCHITECTURE.md: layers only call downwards) and what start-up loads.

- the package's modules import each other without a cycle, and every import runs down
  the floors of ``FLOORS`` (docs/ARCHITECTURE.md draws them), never up;
- no two of its packages import each other (``autoplan.serving`` and ``autoplan.export`` did:
  the engines' files imported the export's shell quoting, and the exports the engines' costs),
  lazy imports inside functions counted, and no loop of packages runs round either (serving,
  whatif, search and export did); the serving package imports nothing of the exports;
- every module is on exactly one floor, named in ``FLOORS``;
- ``autoplan.cost`` knows nothing of what corrects it (``autoplan.measured``), of the
  search, of the command line, or of measuring (``autoplan.bench``, torch);
- ``autoplan.measured`` (profiles, the machine fit, the learned correction) never
  imports torch or ``autoplan.bench``: fitting and applying a profile needs no torch;
- a command that needs no profile and no CP-SAT model loads none of OR-Tools, pandas,
  scikit-learn, numpy or scipy (together ~0.45 s of every start, ``--help`` included).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autoplan"
HEAVY = ("ortools", "pandas", "sklearn", "numpy", "scipy")


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth (inside functions and
    ``if TYPE_CHECKING:`` too); ``from a import b`` yields both ``a`` and ``a.b``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            assert node.module is not None
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at any depth, lazy imports and
    ``TYPE_CHECKING`` ones included: a cycle held together by a lazy import is still a
    cycle). ``from a import b`` counts ``a.b`` where that is a module, else ``a``."""
    modules = {module_name(p, package.parent): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = {m for _, m in imported_modules(path) if m in modules and m != name}
        # ``from autoplan.kernels import comm`` names the package and the module: keep the module
        graph[name] = {m for m in found if not any(o.startswith(m + ".") for o in found)}
    return graph


def package_of(module: str) -> str:
    """The package directly under ``autoplan`` that holds a module (``autoplan.serving`` for
    ``autoplan.serving.engines.vllm``; a top-level module is its own)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import (:func:`import_graph`'s edges, lazy
    ones included)."""
    out: dict[str, set[str]] = {}
    for module, imported in graph.items():
        mine = package_of(module)
        out.setdefault(mine, set()).update(p for p in map(package_of, imported) if p != mine)
    return out


def importing_each_other(packages: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The pairs of packages that import each other, each pair once, in order."""
    return sorted((a, b) for a, outs in packages.items() for b in outs if a < b and a in packages.get(b, ()))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


# The floors, lowest first: a module imports its own floor and those below, never above.
# Within a floor modules may import each other (without a cycle). Membership is exact: a
# top-level module is named (``autoplan`` is the package's ``__init__`` alone), a package
# holds itself and the modules under it (``autoplan.search`` and ``autoplan.search.*``), so a
# new top-level module is on no floor until it is named here.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("autoplan", "autoplan.units", "autoplan.errors", "autoplan.vocab",
              "autoplan.resources", "autoplan.caches", "autoplan.registry", "autoplan.text",
              "autoplan.shell", "autoplan.forking", "autoplan.svg")),
    ("schedules", ("autoplan.schedules",)),  # operation orders, in-flight counts, the simulator
    ("descriptors", ("autoplan.descriptors", "autoplan.plan")),  # data-only types, loaded strictly
    ("kernels", ("autoplan.kernels",)),  # collectives, GEMM/attention kernels, memory, FLOPs, a layer
    ("axes", ("autoplan.parallel",)),  # one module per parallel axis
    ("cost", ("autoplan.cost",)),  # per-stage sums, the plan's evaluation, the search's bounds
    ("measured", ("autoplan.measured",)),  # profiles and what is fitted on them
    ("plans", ("autoplan.plans",)),  # a plan file read strictly and written (plans/file.py)
    # the training search, serving, launchers, sweeps, microbenchmarks, tuning
    ("planners", ("autoplan.search", "autoplan.serving", "autoplan.export", "autoplan.whatif",
                  "autoplan.bench", "autoplan.tune")),
    ("commands", ("autoplan.commands",)),  # the search request, the CI gate, the diff: read several planners
    ("api", ("autoplan.api",)),  # the commands as functions (autoplan.api): what the command line calls
    ("cli", ("autoplan.cli",)),
)
# imports allowed to run upwards, as (importer, imported): at most one, each with its reason
UPWARD: frozenset[tuple[str, str]] = frozenset()
ROOT_MODULE = "autoplan"  # the package's __init__: on the base floor, a prefix of nothing


def floor_of(module: str, floors: tuple[tuple[str, tuple[str, ...]], ...] = FLOORS) -> int | None:
    """The index of the floor ``module`` is on, None where it is on none: the floor that
    names it, or names the package under ``autoplan`` holding it (never ``autoplan`` itself
    as a prefix)."""
    found = sorted({i for i, (_, names) in enumerate(floors) for name in names
                    if module == name or (name != ROOT_MODULE and module.startswith(name + "."))})
    assert len(found) <= 1, f"{module} is on floors {[floors[i][0] for i in found]}"
    return found[0] if found else None


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """The graph's modules on no floor."""
    return sorted(m for m in graph if floor_of(m) is None)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports (importer, imported) that run up the floors, less those in ``UPWARD``
    (modules on no floor are :func:`unplaced`'s)."""
    out = []
    for m, outs in graph.items():
        for o in outs:
            mine, theirs = floor_of(m), floor_of(o)
            if mine is not None and theirs is not None and theirs > mine and (m, o) not in UPWARD:
                out.append((m, o))
    return sorted(out)


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_held_by_a_lazy_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_packages_import_each_other():
    graph = import_graph()
    pairs = importing_each_other(package_graph(graph))
    assert pairs == [], "\n".join(
        f"{a} <-> {b}: " + ", ".join(sorted(f"{m} imports {o}" for m, outs in graph.items() for o in outs
                                            if {package_of(m), package_of(o)} == {a, b}))
        for a, b in pairs)


def test_the_packages_import_each_other_without_a_cycle():
    """Not only pairs: serving -> whatif -> search -> export -> serving was a loop of four
    (serving.plot drew with whatif.plot's axes, now autoplan.svg's; the exporters read
    whatif.reliability's checkpoint interval, now autoplan.cost.reliability's)."""
    graph = import_graph()
    found = cycles(package_graph(graph))
    assert found == [], "\n".join(
        " <-> ".join(c) + ": " + ", ".join(sorted(f"{m} imports {o}" for m, outs in graph.items()
                                                  for o in outs if package_of(m) != package_of(o)
                                                  and {package_of(m), package_of(o)} <= set(c)))
        for c in found)


def test_a_loop_of_four_packages_is_a_package_cycle_though_no_two_import_each_other():
    graph = {"autoplan.serving.plot": {"autoplan.whatif.plot"},
             "autoplan.whatif.plot": {"autoplan.whatif.sweep"},
             "autoplan.whatif.sweep": {"autoplan.search.engine"},
             "autoplan.search.engine": {"autoplan.export.launcher"},
             "autoplan.export.launcher": {"autoplan.serving.engine"},
             "autoplan.serving.engine": set()}
    assert cycles(graph) == []
    packages = package_graph(graph)
    assert importing_each_other(packages) == []
    assert cycles(packages) == [["autoplan.export", "autoplan.search", "autoplan.serving",
                                 "autoplan.whatif"]]


def test_the_serving_package_imports_nothing_of_the_exports():
    """The exports read serving plans and the engines' costs; an engine's launch (its flags,
    its scripts' text) sits beside them (autoplan/export/engines/), shell quoting on the base
    floor (autoplan.shell)."""
    assert offending_imports("serving", ("autoplan.export",)) == []


def test_a_function_level_import_that_ties_two_packages_together_is_caught(tmp_path):
    """serving <-> export as it was: no module cycle (the engine's file imported the export's
    shell module, which imports nothing back), a package cycle all the same, held by an import
    inside a function."""
    files = {"__init__.py": "", "serving/__init__.py": "", "export/__init__.py": "",
             "serving/engine.py": "def args():\n    from autoplan.export.shell import quote\n",
             "export/shell.py": "import shlex\n",
             "export/serving.py": "from autoplan.serving.engine import args\n"}
    for name, text in files.items():
        (tmp_path / "autoplan" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "autoplan" / name).write_text(text)
    graph = import_graph(tmp_path / "autoplan")
    assert graph["autoplan.serving.engine"] == {"autoplan.export.shell"}
    assert cycles(graph) == []
    assert importing_each_other(package_graph(graph)) == [("autoplan.export", "autoplan.serving")]


def test_the_deployment_targets_share_kube_and_only_deploy_dispatches_to_them():
    """``export --to dynamo | llm-d | k8s``: each target imports kube; kube and the launch
    scripts import none of them (autoplan/export/deploy.py picks one by name)."""
    targets = {"autoplan.export.dynamo", "autoplan.export.llmd", "autoplan.export.k8s"}
    graph = import_graph()
    assert all("autoplan.export.kube" in graph[t] for t in targets)
    importers = sorted(m for m, outs in graph.items() if outs & targets)
    assert importers == ["autoplan.export.deploy"]


def floor_name(module: str) -> str:
    found = floor_of(module)
    return "no floor" if found is None else FLOORS[found][0]


def test_every_import_runs_down_the_floors():
    upward = upward_imports(import_graph())
    assert upward == [], "\n".join(f"{m} ({floor_name(m)}) imports {o} ({floor_name(o)})"
                                    for m, o in upward)
    assert len(UPWARD) <= 1


def test_every_module_is_on_a_floor():
    assert unplaced(import_graph()) == [], "add them to FLOORS"


def test_a_new_top_level_module_is_on_no_floor_until_floors_names_it():
    """The base floor names its modules: ``autoplan`` is the package's ``__init__``, no
    prefix of every module (it was, and the test above could not fail)."""
    graph = {**import_graph(), "autoplan.newthing": {"autoplan.units"}}
    assert unplaced(graph) == ["autoplan.newthing"]
    assert floor_of("autoplan.newthing") is None
    assert floor_of("autoplan") == 0
    assert floor_of("autoplan.searchlight") is None  # a package's name is no bare prefix
    planners = floor_of("autoplan.search")
    assert floor_of("autoplan.search.engine") == planners == floor_of("autoplan.serving.cost")
    assert floor_of("autoplan.plan") < floor_of("autoplan.plans.file") < floor_of("autoplan.search")
    assert floor_of("autoplan.search") < floor_of("autoplan.commands.check") < floor_of("autoplan.api")


def test_a_planner_that_reads_a_command_is_reported():
    """The commands read the planners and the planners read plan files, never the other
    way: a search that imports the search request, or a plan reader that imports the runs
    log, runs up a floor."""
    graph = {"autoplan.search.engine": {"autoplan.commands.request"}, "autoplan.commands.request": set(),
             "autoplan.tune.runs": {"autoplan.plans.file"}, "autoplan.plans.file": {"autoplan.tune.runs"}}
    assert upward_imports(graph) == [("autoplan.plans.file", "autoplan.tune.runs"),
                                     ("autoplan.search.engine", "autoplan.commands.request")]


def test_an_import_from_the_base_floor_up_to_a_command_is_reported():
    graph = {"autoplan.units": {"autoplan.commands.check"}, "autoplan.commands.check": {"autoplan.units"},
             "autoplan.cli.main": {"autoplan.search.engine"}}
    assert upward_imports(graph) == [("autoplan.units", "autoplan.commands.check")]


def test_a_real_module_moved_to_a_wrong_floor_fails_the_floors_checks(tmp_path):
    """The package's own files, with one module deliberately misplaced: the CI gate
    (commands/check.py, which reads the search, serving and the runs log) dropped into the
    kernels, and a new top-level module nobody named. Both checks that guard the floors
    fail on the copy, naming the module."""
    import shutil

    copy = tmp_path / "autoplan"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "commands" / "check.py").rename(copy / "kernels" / "check.py")
    (copy / "stray.py").write_text("from autoplan.units import GiB\n")
    graph = import_graph(copy)
    upward = upward_imports(graph)
    assert upward and {m for m, _ in upward} == {"autoplan.kernels.check"}
    assert {o for _, o in upward} >= {"autoplan.search.engine", "autoplan.plans.file"}
    assert unplaced(graph) == ["autoplan.stray"]
    assert upward_imports(import_graph()) == [] and unplaced(import_graph()) == []  # the real tree


def test_a_module_on_two_floors_is_refused():
    floors = (("low", ("autoplan", "autoplan.x")), ("high", ("autoplan.x",)))
    with pytest.raises(AssertionError, match="autoplan.x.y is on floors"):
        floor_of("autoplan.x.y", floors)


def offending_imports(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    return found


def test_the_cost_model_imports_nothing_above_it_nor_torch():
    forbidden = ("autoplan.measured", "autoplan.search", "autoplan.cli", "autoplan.commands.request",
                 "autoplan.bench", "torch")
    assert offending_imports("cost", forbidden) == []


def test_the_measured_package_imports_neither_torch_nor_bench_nor_the_layers_above():
    forbidden = ("torch", "autoplan.bench", "autoplan.cli", "autoplan.commands.request", "autoplan.search")
    assert offending_imports("measured", forbidden) == []


def test_the_import_scan_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from autoplan.bench import run\n    import torch.nn\n")
    assert [m for _, m in imported_modules(source)] == ["autoplan.bench", "autoplan.bench.run",
                                                        "torch.nn"]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOPLAN_DEBUG"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300, check=False)


def test_a_profile_is_fitted_and_applied_with_torch_blocked():
    # a finder first on the meta path makes every `import torch` raise ImportError (and
    # leaves sys.modules alone: scipy looks there for torch before it looks at arrays)
    code = """if True:
        import sys

        class BlockTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError(f"torch is blocked here: {name}")
                return None

        sys.meta_path.insert(0, BlockTorch())
        from pathlib import Path
        from autoplan.cost.evaluate import evaluate
        from autoplan.descriptors.strict import read_yaml
        from autoplan.measured.profile import read_profile
        from autoplan.measured.surrogate import calibrate, predict_with_band
        from autoplan.plans.file import read_plan
        import dataclasses
        path = Path("examples/cpu/plan-pp2.yaml")
        plan = read_plan(read_yaml(path), str(path))
        corrected = dataclasses.replace(
            plan, cluster=calibrate(plan.cluster, read_profile(Path("examples/cpu/profile.csv"))))
        pred = predict_with_band(corrected)
        assert pred.uncertainty is not None
        assert pred.step_time_s != evaluate(plan).step_time_s
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def loaded_after(code: str) -> list[str]:
    """The heavy modules in sys.modules when ``code`` has run (a command line: at exit)."""
    probe = f"""if True:
        import atexit, json, sys
        atexit.register(lambda: sys.__stderr__.write(
            "\\nLOADED " + json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)) + "\\n"))
        {code}
    """
    result = run_python(probe)
    assert result.returncode == 0, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("LOADED "), result.stderr
    return list(json.loads(line.removeprefix("LOADED ")))


def cli(*args: str) -> str:
    return f"sys.argv = ['autoplan', *{list(args)!r}]; from autoplan.cli.main import main; main()"


@pytest.mark.parametrize("code", [
    "import autoplan.cli.main",
    "import autoplan.search.engine",
    cli("--help"),
    cli("search", "--help"),
    cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
        "--global-batch", "64", "--seq-len", "4096", "--format", "json"),
    cli("evaluate", "examples/plans/llama3-8b-32xh100-1f1b.yaml", "--format", "json"),
], ids=["import cli", "import engine", "--help", "search --help", "search", "evaluate"])
def test_start_up_and_a_search_without_a_profile_load_no_ortools_pandas_sklearn_or_numpy(code):
    # (a profile shipped for h100-sxm under profiles/measured/ would correct this search and
    # evaluate, and rightly load pandas and scikit-learn: then pick a device without one)
    assert loaded_after(code) == []


def test_a_profile_loads_what_it_needs():
    """The probe above sees the heavy modules when they are used."""
    loaded = loaded_after(cli("evaluate", "examples/cpu/plan-pp2.yaml", "--profile",
                              "examples/cpu/profile.csv", "--format", "json"))
    assert {"pandas", "sklearn", "numpy"} <= set(loaded)


# the distributions that install what ``autoplan`` imports, by import name: the
# pyproject's dependencies, then its extras (each imported lazily, where the extra is used)
DECLARED = {"typer": "typer", "rich": "rich", "yaml": "pyyaml", "numpy": "numpy", "pandas": "pandas",
            "sklearn": "scikit-learn", "scipy": "scipy", "ortools": "ortools"}
EXTRAS = {"torch": "bench", "matplotlib": "png"}
# imported only under contextlib.suppress(ImportError): older typer's click, which recent
# typer vendors (cli.main._usage_errors)
GUARDED = {("autoplan.cli.main", "click")}


def test_every_module_autoplan_imports_is_the_standard_librarys_or_a_declared_dependencys():
    """A fresh ``pip install .`` has only what the pyproject names: an import of a package
    some other dependency happens to install (click, once typer's) fails there, while the
    test environment, which has the extras' dozens of packages, hides it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower()
             for d in project["dependencies"]}
    extras = {k: " ".join(v).lower() for k, v in project["optional-dependencies"].items()}
    assert set(DECLARED.values()) <= names, names
    for module, extra in EXTRAS.items():
        assert module in extras[extra]
    stray = []
    for path in PACKAGE.rglob("*.py"):
        for line, imported in imported_modules(path):
            top = imported.split(".")[0]
            if top == "autoplan" or top in sys.stdlib_module_names or top in DECLARED or top in EXTRAS:
                continue
            if (module_name(path), top) not in GUARDED:
                stray.append(f"{path.relative_to(ROOT)}:{line}: {imported}")
    assert stray == [], "\n".join(stray)
