"""The analytic cost model: compute, communication and memory of one plan."""
