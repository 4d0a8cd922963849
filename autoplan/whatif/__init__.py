"""Before a run: how many GPUs, for how long, at what cost and energy (``search --train-tokens``)."""
