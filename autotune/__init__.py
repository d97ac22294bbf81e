"""autotune: find the fastest correct vLLM configuration for your own workload."""

from __future__ import annotations

__version__ = "0.1.0"

from autotune.core.candidate import Candidate, Settings  # noqa: E402
from autotune.core.errors import AutotuneError, BadInput, StudyFailed  # noqa: E402
from autotune.core.space import SearchSpace, load_space  # noqa: E402
from autotune.core.workload import Request, Workload, load_workload  # noqa: E402

__all__ = ["AutotuneError", "BadInput", "Candidate", "Request", "SearchSpace", "Settings", "StudyFailed",
           "Workload", "__version__", "load_space", "load_workload"]
