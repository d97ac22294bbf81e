"""One exception base for the whole tool; the CLI turns it into an exit code."""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""

    exit_code = 1


class BadInput(AutotuneError):
    """The user's input (workload, search space, flags, results) is not what was expected.

    The message names the file, the line or key, and what was expected.
    """

    exit_code = 2


class StudyFailed(AutotuneError):
    """The study could not produce a result (for example, the baseline itself failed)."""

    exit_code = 1
