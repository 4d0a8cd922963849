"""Serving plans: which deployment (replicas x TP x PP x EP, batching limits, precision) of a
model answers given traffic within latency SLOs (``autoplan serve``)."""
