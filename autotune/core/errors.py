"""One exception base for the whole tool; the CLI turns it into an exit code."""

from __future__ import annotations


# The CLI's exit codes, one each, so that a script (nightly CI) tells a crash from a regression.
OK = 0
FAILED = 1  # check: a regression; search/confirm: no result (the baseline failed, nothing feasible)
BAD_INPUT = 2
INTERNAL = 3  # an exception no module meant for the user: a bug
UNDECIDED = 4  # check: the pairs measured do not decide at the tolerance yet; more are needed to tell
DRIFT = 5  # watch: live traffic has left what the study measured for the deployed config
UNREACHABLE = 6  # watch: the server could not be reached for --retry-s seconds (an outage, not bad input)
IDLE = 7  # watch: the window saw no traffic: nothing was judged (a gate pointed at the wrong server must not pass)
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
EXIT_CODES = {
    OK: "done (check: no regression)",
    FAILED: "a regression (check) or a study without a result (the baseline failed, no feasible config; "
            "confirm: a server or the client failed)",
    BAD_INPUT: "bad input (workload, space, flags, results): one line naming the file, line or key",
    INTERNAL: "an internal error (a bug): one line saying where, --verbose for the traceback",
    UNDECIDED: "cannot tell (check): the pairs measured do not decide at the tolerance (gate rounds cut short, or "
               "two runs' interval across the line), or an objective has no interval (a point decides nothing); "
               "rerun with more rounds, or --warm-start for pairs",
    DRIFT: "drift (watch): live acceptance or load left the study's interval for the deployed config; also a busy "
           "window with no drafts, or a metric without a band to judge it (never ok on nothing)",
    UNREACHABLE: "unreachable (watch): the server's /metrics did not answer for --retry-s seconds",
    IDLE: "idle (watch): the window saw no output tokens, so nothing was judged (--allow-idle: exit 0 instead)",
    INTERRUPTED: "interrupted (Ctrl-C or SIGTERM): the running trial is recorded as interrupted; --resume continues",
}


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""

    exit_code = FAILED


class BadInput(AutotuneError):
    """The user's input (workload, search space, flags, results) is not what was expected.

    The message names the file, the line or key, and what was expected.
    """

    exit_code = BAD_INPUT


class Unreachable(AutotuneError):
    """A server that does not answer (refused, timed out, 5xx): an outage to retry, then its own exit code."""

    exit_code = UNREACHABLE


class StudyFailed(AutotuneError):
    """The study could not produce a result (for example, the baseline itself failed)."""

    exit_code = FAILED
