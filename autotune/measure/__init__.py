"""Turning what an engine did into numbers and verdicts: metrics, intervals, correctness, SLOs.

Pure functions over records; imports only core."""
