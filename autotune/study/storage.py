"""Optuna storages from a URL, with live-worker detection; URLs are never printed with their password.

- ``sqlite:///path``, ``postgresql://...``, ``mysql://...``: Optuna's RDBStorage with heartbeats, so a
  trial whose worker died (killed, machine lost) is failed by whoever looks next, while trials of live
  workers elsewhere are left alone.
- ``journal:PATH``: Optuna's JournalStorage on a file (file locks), for several processes on one
  machine. It has no heartbeat; a running trial is judged by its worker's pid on this host instead.
"""

from __future__ import annotations

import os
import re
import socket
import time
from typing import TYPE_CHECKING, Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from autotune.core.errors import BadInput

if TYPE_CHECKING:
    from autotune.study.view import StudyView

# A trial's parent records a heartbeat this often; a trial silent for GRACE_S is stale. Generous:
# the parent only polls a worker process, but a loaded CI machine can stall it for seconds.
HEARTBEAT_S = 10
GRACE_S = 60
JOURNAL = "journal:"

def redact(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _rdb(url: str, kwargs: dict[str, Any], tries: int = 3) -> BaseStorage:
    """Optuna's RDBStorage. On a new database, workers started together race to create its tables:
    PostgreSQL then refuses all but one ("duplicate key value violates unique constraint
    pg_type_typname_nsp_index"). The tables exist by the next try."""
    for attempt in range(tries):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S)
        except Exception as e:  # sqlalchemy.exc.IntegrityError, ProgrammingError ("already exists")
            text = str(e)
            if attempt + 1 == tries or not ("UniqueViolation" in text or "already exists" in text):
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def open_storage(url: str) -> BaseStorage:
    """The Optuna storage for ``url``; a bad URL or an unreachable server is a BadInput naming --storage."""
    if url.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = url[len(JOURNAL):].removeprefix("//")
        if not path:
            raise BadInput("--storage: expected journal:PATH (a journal file for several processes on one machine)")
        try:
            return JournalStorage(JournalFileBackend(path))
        except OSError as e:
            raise BadInput(f"--storage {url}: cannot open the journal file ({e.strerror})") from None
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several workers write one file: wait for its lock rather than fail with "database is locked".
        kwargs["connect_args"] = {"timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True  # a long trial outlives idle server connections
    try:
        return _rdb(url, kwargs)
    except Exception as e:  # SQLAlchemy's ArgumentError, OperationalError, a missing driver, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"--storage {redact(url)}: cannot open ({type(e).__name__}: {first[:200]})") from None


def has_heartbeat(storage: BaseStorage) -> bool:
    # A study wraps its RDBStorage in a cache that passes heartbeats through; ask Optuna.
    from autotune.study.optuna_private import heartbeat_enabled

    return heartbeat_enabled(storage)


def worker_id(thread: int = 0) -> str:
    """Who runs a trial: ``host:pid/thread``; kept on the trial so others can tell whether it is alive."""
    return f"{socket.gethostname()}:{os.getpid()}/{thread}"


def _alive_here(worker: str | None) -> bool | None:
    """True/False for a worker on this host, None when it ran elsewhere (can't tell)."""
    if not worker:
        return None  # just asked, its owner not yet recorded
    host, _, rest = worker.partition(":")
    if host != socket.gethostname():
        return None
    try:
        os.kill(int(rest.split("/")[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def dead_here(view: StudyView) -> list[FrozenTrial]:
    """RUNNING trials whose worker ran on this host and is gone (its pid is dead). Workers on other
    hosts are judged by heartbeats (RDB storages, Optuna's ``fail_stale_trials``), after GRACE_S."""
    return [t for t in view.running if _alive_here(t.user_attrs.get("worker")) is False]


def load_saved(name: str, url: str, flag: str = "--study") -> optuna.Study:
    """A saved study, read-only use (predict, report, check, watch); a missing one is bad input
    naming ``flag``. Optuna's chatter and its heartbeat's experimental warning are silenced."""
    import warnings

    from autotune.core.errors import BadInput

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        raise BadInput(f"{flag}: no study {name!r} in {redact(url)}") from None
