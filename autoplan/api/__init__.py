"""autoplan as a library: each command of the command line as a function taking the same
descriptors and options (paths, built-in names or objects) and returning a typed result
whose ``to_dict()`` is the document the command's ``--format json`` prints, ``to_json()``
its text, and, where a table is natural, ``to_frame()`` a pandas DataFrame.

Bad input raises the errors the command reports (:class:`InputError`, exit 2 there, naming
the option or the file and field); nothing prints, nothing exits. docs/API.md has each
function with an example."""

from autoplan.api.loop import (
    CalibrationResult,
    ServingTuneJob,
    ServingTuneResult,
    TuneJob,
    TuneResult,
    calibrate,
    prepare_tune,
    prepare_tune_serving,
    tune,
    tune_serving,
)
from autoplan.api.plans import (
    CheckResult,
    Evaluated,
    EvaluateResult,
    ExplainResult,
    ExportResult,
    check,
    evaluate,
    explain,
    export,
)
from autoplan.api.search import RankedPlan, SearchJob, SearchResult, prepare_search, search
from autoplan.api.serve import ServeJob, ServeResult, prepare_serve, serve
from autoplan.errors import AutoplanError, InputError, NoFeasiblePlan, Problem

__all__ = [
    "AutoplanError", "CalibrationResult", "CheckResult", "EvaluateResult", "Evaluated", "ExplainResult",
    "ExportResult", "InputError", "NoFeasiblePlan", "Problem", "RankedPlan", "SearchJob", "SearchResult",
    "ServeJob", "ServeResult", "ServingTuneJob", "ServingTuneResult", "TuneJob", "TuneResult", "calibrate",
    "check", "evaluate", "explain", "export", "prepare_search", "prepare_serve", "prepare_tune",
    "prepare_tune_serving", "search", "serve", "tune", "tune_serving",
]
