"""The search: the only floor that imports Optuna. The loop, the strategies, the Pareto choice, depth schedules and storages."""
