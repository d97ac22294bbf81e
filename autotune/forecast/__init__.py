"""Forecasts that cost no engine: replaying the baseline's tokens through each method's acceptance rule."""
