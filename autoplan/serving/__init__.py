"""Serving plans: which deployment (replicas x TP x PP x EP, batching limits, precision) of a
model answers given traffic within latency SLOs (``autoplan serve``)."""

# the built-in engines register themselves (autoplan/serving/engine.py): importing any part
# of serving registers them first
from autoplan.serving import engines  # noqa: E402,F401
