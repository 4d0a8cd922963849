"""Enumerate plans over a search space, prune, evaluate, rank."""
