"""Pipeline schedules as per-stage operation orders, and their simulator."""
