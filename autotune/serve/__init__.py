"""Serving a config as users do: the exported `vllm serve` command, server processes and the bench client."""
