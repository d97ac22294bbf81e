"""After the study: confirm as served, check against a deployed config, watch live traffic."""
