"""Studies shared by several workers: threads of one process (--workers N), processes on one host
(journal storage), and processes on a real PostgreSQL server. Trials run the FAKE engine
(tests/fake_engine.py): what is under test is the sharing, not vLLM."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from autotune.run import devices

from autotune.study import storage
from autotune.core.candidate import Candidate, Settings
from autotune.core.errors import BadInput
from autotune.study.optuna_private import stale_trial_ids
from autotune.study.pareto import pareto_trials
from autotune.results.files import write_results
from autotune.core.space import load_space
from autotune.core.attrs import BASELINE
from autotune.measure.config import StudyConfig
from autotune.study.loop import _fail_stale, run_study
from autotune.study.opening import open_study
from autotune.study.view import StudyView
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload

from conftest import ROOT, TESTS

SPACE = str(TESTS / "data" / "fake_space_ok.yaml")


def _cfg(tmp_path, **kw):
    base = dict(name="shared", results_dir=tmp_path / "shared", settings=Settings(model="fake-model"),
                n_trials=6, trial_timeout_s=60, engine_module="fake_engine",
                strategy="tpe")  # the budget used in full: predict would stop once nothing can win
    base.update(kw)
    return StudyConfig(**base)


def _check_shared(study: optuna.Study, n_trials: int) -> list[str]:
    """No trial lost or measured twice; returns the worker of each finished trial."""
    trials = study.get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
                and "duplicate_of" not in t.user_attrs and not t.user_attrs.get("interrupted")]
    assert len(finished) == n_trials and all(t.state == TrialState.COMPLETE for t in finished), \
        [(t.number, t.state.name, t.user_attrs.get("label"), t.user_attrs.get("failure")) for t in trials]
    keys = Counter(Candidate(t.user_attrs["candidate"]).key() for t in finished)
    assert max(keys.values()) == 1, keys  # never the same config twice
    assert sum(t.user_attrs.get("role") == BASELINE for t in finished) == 1
    return [t.user_attrs["worker"] for t in finished]


def _front_by_hand(study: optuna.Study) -> set[int]:
    """Non-dominated feasible trials on (max tok/s, min e2e): the Pareto front computed over all trials."""
    ok = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if all(c <= 0 for c in t.constraints.values())]
    def dominates(a, b):
        return (a.values[0] >= b.values[0] and a.values[1] <= b.values[1]) and a.values != b.values
    return {t.number for t in ok if not any(dominates(o, t) for o in ok)}


def test_worker_env_reaches_the_trial_process(tmp_path, fake_engine_env):
    job = {"engine_kwargs": {"model": "m"}, "requests": [], "replay": {"load": {"kind": "batch"}},
           "engine_module": "fake_engine"}
    out = run_trial(job, tmp_path / "t", timeout_s=30, env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert out.raw["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_partition_gives_each_worker_its_own_devices(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert devices.partition(1, "cpu") == [{}]
    assert devices.partition(2, "cpu") == [{"VLLM_CPU_OMP_THREADS_BIND": "0,1"}, {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert devices.partition(2, "cuda", per_worker=2) == [{"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    with pytest.raises(BadInput, match="--workers 3: this host has 4 GPUs"):
        devices.partition(3, "cuda", per_worker=2)
    with pytest.raises(BadInput, match="--workers 6: this host has 5 cores"):
        devices.partition(6, "cpu")


def test_two_worker_threads_share_one_study(tmp_path, fake_engine_env, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_FAKE_DELAY_S", "1")  # trials overlap, as real ones do
    c = _cfg(tmp_path, storage=f"journal:{tmp_path / 'journal.log'}")
    envs = [{"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"}]
    study = run_study(c, load_workload("examples/smoke.jsonl"), load_space(SPACE, platform="cpu", models=set()),
                      worker_envs=envs)
    workers = _check_shared(study, c.n_trials)
    assert len(set(workers)) == 2, workers  # both threads measured trials
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        thread = int(t.user_attrs["worker"].rsplit("/", 1)[1])
        assert t.user_attrs["devices"] == envs[thread]  # each trial ran on its worker's cores


def test_a_live_workers_trial_is_left_alone_a_dead_ones_is_failed(tmp_path, monkeypatch):
    c = _cfg(tmp_path)
    c.results_dir.mkdir(parents=True)
    study = open_study(c)
    gone = subprocess.Popen(["true"])
    gone.wait()
    live, dead = study.ask(), study.ask()
    live.set_user_attr("worker", storage.worker_id())
    dead.set_user_attr("worker", f"{socket.gethostname()}:{gone.pid}/0")
    assert _fail_stale(study, StudyView.of(study)) == 1
    t = study.get_trials(deepcopy=False)
    assert t[0].state == TrialState.RUNNING
    assert t[1].state == TrialState.FAIL and t[1].user_attrs["interrupted"]


def test_a_remote_worker_without_heartbeat_is_failed_after_the_grace_period(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(storage, "GRACE_S", 2)
    c = _cfg(tmp_path)
    c.results_dir.mkdir(parents=True)
    study = open_study(c)
    quiet, beating = study.ask(), study.ask()
    for tr in (quiet, beating):  # another host: its pid means nothing here
        tr.set_user_attr("worker", "elsewhere:1/0")
        study._storage.record_heartbeat(tr._trial_id)
    # Wait for the storage itself to call the silent trial stale (the grace period passed by its
    # clock), not for a guessed time; then the other one beats again.
    deadline = time.monotonic() + 30
    while quiet._trial_id not in stale_trial_ids(study):
        assert time.monotonic() < deadline, "the storage never found the silent trial stale"
        time.sleep(0.05)
    study._storage.record_heartbeat(beating._trial_id)
    assert _fail_stale(study, StudyView.of(study)) == 1
    t = study.get_trials(deepcopy=False)
    assert t[0].state == TrialState.FAIL and "no heartbeat" in t[0].user_attrs["failure"]
    assert t[1].state == TrialState.RUNNING


def _postgres_url() -> str:
    url = os.environ.get("AUTOTUNE_TEST_POSTGRES")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("AUTOTUNE_TEST_POSTGRES is not set: scripts/test.sh starts PostgreSQL and sets it")
        pytest.skip("no PostgreSQL server (scripts/test.sh starts one and sets AUTOTUNE_TEST_POSTGRES)")
    return url


def test_two_processes_share_one_study_on_postgresql(tmp_path, fake_engine_env, monkeypatch):
    url = _postgres_url()
    name = f"shared-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AUTOTUNE_FAKE_DELAY_S", "1")
    procs = [subprocess.Popen([sys.executable, str(TESTS / "fake_study_worker.py"), url, name,
                               str(tmp_path / f"w{i}"), "6"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    try:
        study = optuna.load_study(study_name=name, storage=url)
        workers = _check_shared(study, 6)
        pids = {w.split(":")[1].split("/")[0] for w in workers}
        assert pids == {str(p.pid) for p in procs}, workers  # both processes contributed
        # Results from the shared study: the front is computed over both workers' trials.
        c = _cfg(tmp_path, name=name, storage=url, results_dir=tmp_path / "results")
        report = write_results(study, c.results_dir, settings=c.settings, platform={"platform": "cpu"},
                               objectives=list(c.objectives), storage_url=url)
        assert {t.number for t in pareto_trials(StudyView.of(study))} == _front_by_hand(study)
        assert {e["trial"] for e in report["pareto"]} == _front_by_hand(study)
        frame = pd.read_csv(c.results_dir / "trials.csv")
        assert len(frame) == 6 and frame["worker"].nunique() == 2
        assert "autotune:***@" in report["storage"]  # the password never reaches the results
    finally:
        optuna.delete_study(study_name=name, storage=url)


def test_search_cli_with_two_workers_prints_json(tmp_path, fake_engine_env, monkeypatch):
    """`autotune search --workers 2 --json` end to end through the CLI, trials on the FAKE engine."""
    from typer.testing import CliRunner

    from autotune.cli.app import app

    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("AUTOTUNE_FAKE_DELAY_S", "0.5")  # trials overlap, as real ones do
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space", SPACE,
                                 "--trials", "4", "--workers", "2", "--json", "--results", str(tmp_path),
                                 "--storage", f"journal:{tmp_path / 'journal.log'}", "--samples", "0",
                                 "--no-remeasure"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)  # stdout holds the JSON alone; progress went to stderr
    assert report["best"] and report["trials"]["finished"] == 4
    assert report["storage"] == f"journal:{tmp_path / 'journal.log'}"
    frame = pd.read_csv(tmp_path / "smoke" / "trials.csv")
    assert frame["worker"].str.rsplit("/", n=1).str[1].nunique() == 2  # both worker threads measured


def test_ctrl_c_with_two_workers_marks_both_running_trials_and_resume_finishes(tmp_path, fake_engine_env, monkeypatch):
    import _thread
    import threading

    monkeypatch.setenv("AUTOTUNE_FAKE_DELAY_S", "6")  # each trial stays in its worker that long (3 s flaked on CI)
    c = _cfg(tmp_path, n_trials=4, storage=f"journal:{tmp_path / 'journal.log'}")
    space, wl = load_space(SPACE, platform="cpu", models=set()), load_workload("examples/smoke.jsonl")
    both_running = threading.Event()

    def press_ctrl_c_when_both_workers_measure(deadline_s: float = 120.0) -> None:
        # The event, not a timer: two trials RUNNING in the storage, each handed to its worker
        # process ("devices" is set just before the worker starts). Then Ctrl-C, which reaches the
        # main thread only, as in a terminal. Past the deadline it presses anyway (the test fails).
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                seen = optuna.load_study(study_name=c.name, storage=storage.open_storage(c.storage_url))
                running = [t for t in seen.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                           if "devices" in t.user_attrs]
            except KeyError:  # the study is not created yet
                running = []
            if len(running) == 2:
                both_running.set()
                break
            time.sleep(0.1)
        _thread.interrupt_main()

    # Ctrl-C reaches Python as KeyboardInterrupt only through the default SIGINT handler; in the
    # full suite (real-engine tests first, in this process) the study twice ran to its end here
    # as if no Ctrl-C came, so the test installs the default handler for its own run.
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=press_ctrl_c_when_both_workers_measure, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_study(c, wl, space, worker_envs=[{}, {}])
    finally:
        signal.signal(signal.SIGINT, before)
    assert both_running.is_set(), "the two workers never had a trial running at the same time"
    trials = optuna.load_study(study_name=c.name, storage=storage.open_storage(c.storage_url)).trials
    assert not [t for t in trials if t.state == TrialState.RUNNING], [(t.number, t.state.name, t.user_attrs.get("failure"), t.user_attrs.get("wall_s")) for t in trials]
    stopped = [t for t in trials if t.user_attrs.get("interrupted")]
    assert len(stopped) == 2 and all(t.user_attrs["failure"] == "interrupted by the user" for t in stopped)
    monkeypatch.setenv("AUTOTUNE_FAKE_DELAY_S", "0")
    study = run_study(c, wl, space, resume=True, worker_envs=[{}, {}])
    _check_shared(study, 4)
