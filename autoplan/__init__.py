"""autoplan: choose a parallel execution plan for large-model training."""

__version__ = "0.1.0"
