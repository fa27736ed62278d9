"""Periodic jobs: when a schedule is due (timing.py) and the loop that fires it (scheduler.py)."""
