"""Experiments whose question is still open, one line each in README.md; run as `python -m benchmarks.research.NAME`
from the repository root. One whose question is answered goes (git keeps it; docs/BENCHMARKS.md keeps its numbers).
"""
