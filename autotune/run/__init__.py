"""Running one candidate: the engine (the only place that imports vLLM, with the served engine), the worker process and the evaluation of its run."""
