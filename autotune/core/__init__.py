"""The ground floor: what a candidate, a search space and a workload are, and how files are read.

No Optuna, vLLM, Rich or subprocess here; everything above may import it."""
