"""The study floor reads a study once (issue 45): the helpers take a StudyView
(autotune/study/view.py) and none queries the Optuna study itself; the Pareto front is computed
locally over the current records and agrees with Optuna's own ``Study.best_trials``.

The AST check lists the modules it covers; every module of autotune/study/ is either covered or
left out below with the reason. Where a helper writes (ask, tell, enqueue, set an attribute) it
keeps the Optuna study under the name ``study``, and only those writes may be made through it.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from conftest import ROOT

from autotune.study.pareto import pareto_front, pareto_trials
from autotune.study.view import StudyView

PACKAGE = ROOT / "autotune"
COVERED = [PACKAGE / "study" / f"{m}.py" for m in (
    "budget", "figures", "head_trace", "holdout", "opening", "pareto", "record", "remeasure", "schedule", "select", "storage",
    "strategy", "trials")] + [
    PACKAGE / "results" / "files.py", PACKAGE / "results" / "started.py", PACKAGE / "gate" / "deployed.py"]
LEFT_OUT = {
    "__init__.py": "empty",
    "view.py": "the one reader: StudyView.of queries the study, once",
    "loop.py": "the ask/tell loop: it builds the views it passes down, and reads a trial it just asked",
    "optuna_private.py": "Optuna's private API (heartbeats, stale trials), tests/test_optuna_private.py",
    "importance.py": "Optuna's importance evaluator takes a real Study, which it loads from the storage file",
    "plan.py": "reads no study: the plan is a function of the study's config alone",
}
STUDY_NAMES = {"study", "st"}  # what the floor calls an Optuna study
WRITES = {"ask", "tell", "enqueue_trial", "set_user_attr", "add_trial"}  # what may be done through one
STORES = {"sampler"}  # attributes of a study that may be set (a loaded study's sampler)
# Attributes only an Optuna study (or its storage) has: a query wherever it appears.
QUERIES = {"get_trials", "get_all_trials", "best_trial", "best_trials", "best_value", "best_params",
           "direction", "study_name", "trials_dataframe"}


def _is_study_type(annotation: ast.expr | None) -> bool:
    text = ast.unparse(annotation) if annotation is not None else ""
    return text in ("optuna.Study", "Study", "optuna.study.Study")


def study_queries(path: Path, tree: ast.AST) -> list[str]:
    """Every place in ``tree`` that reads an Optuna study other than through StudyView."""
    where = path.relative_to(ROOT)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            bad += [f"{where}:{node.lineno}: parameter {a.arg!r} is an Optuna study not named study"
                    for a in args if _is_study_type(a.annotation) and a.arg != "study"]
        elif isinstance(node, ast.Attribute):
            if node.attr in QUERIES:
                bad.append(f"{where}:{node.lineno}: .{node.attr}")
            elif isinstance(node.value, ast.Name) and node.value.id in STUDY_NAMES:
                allowed = STORES if isinstance(node.ctx, ast.Store) else WRITES
                if node.attr not in allowed:
                    bad.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return bad


def _trees() -> dict[Path, ast.AST]:
    return {p: ast.parse(p.read_text(), str(p)) for p in COVERED}


def test_every_study_module_is_covered_or_left_out_with_a_reason() -> None:
    names = {p.name for p in (PACKAGE / "study").glob("*.py")}
    covered = {p.name for p in COVERED if p.parent.name == "study"}
    assert names == covered | set(LEFT_OUT), names ^ (covered | set(LEFT_OUT))
    assert not covered & set(LEFT_OUT)


def test_no_covered_helper_queries_the_optuna_study() -> None:
    assert [bad for path, tree in _trees().items() for bad in study_queries(path, tree)] == []


@pytest.mark.parametrize("line", [
    "n = len(study.get_trials(deepcopy=False))",
    "objectives = study.user_attrs['objectives']",
    "maximize = st.directions[0]",
    "front = anything.best_trials",
    "name = view_or_study.study_name",
    "def f(s: optuna.Study) -> None: ...",
    "study.trials",
])
def test_a_planted_query_is_caught(line: str) -> None:
    planted = PACKAGE / "study" / "remeasure.py"
    tree = ast.parse(planted.read_text() + "\n" + line + "\n")
    assert study_queries(planted, tree), line


def test_writes_and_a_fresh_view_are_allowed() -> None:
    planted = PACKAGE / "study" / "remeasure.py"
    lines = ("study.enqueue_trial({})", "study.set_user_attr('k', 1)", "view = StudyView.of(study)",
             "study.sampler = None", "x = view.user_attrs", "t.user_attrs.get('role')")
    tree = ast.parse(planted.read_text() + "\n" + "\n".join(lines) + "\n")
    assert study_queries(planted, tree) == []


# --- the Pareto front, locally --------------------------------------------------------------

def _random_study(seed: int, directions: list[str]) -> optuna.Study:
    """Trials with values on a coarse grid (ties and equal points happen) and random constraints."""
    rng = random.Random(seed)
    study = optuna.create_study(directions=directions)
    for _ in range(40):
        study.add_trial(create_trial(state=TrialState.COMPLETE,
                                     values=[float(rng.randint(0, 6)) for _ in directions],
                                     system_attrs={"constraints": [rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0])]}))
    study.add_trial(create_trial(state=TrialState.FAIL))  # never on the front
    return study


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("directions", [["maximize"], ["maximize", "minimize"],
                                        ["minimize", "maximize", "maximize"]])
def test_the_local_front_is_optunas_best_trials(seed: int, directions: list[str]) -> None:
    study = _random_study(seed, directions)
    want = {t.number for t in study.best_trials}  # Optuna's public front: feasible trials only
    assert {t.number for t in pareto_trials(StudyView.of(study))} == want
    assert want  # the comparison is not vacuous


def test_equal_points_are_both_on_the_front_and_a_dominated_one_is_not() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ([10.0, 5.0], [10.0, 5.0], [9.0, 5.0], [12.0, 9.0]):
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=values))
    front = pareto_front(StudyView.of(study).completed, StudyView.of(study).directions)
    assert [t.number for t in front] == [0, 1, 3]


def test_the_view_is_read_once() -> None:
    """A view is the study as read at one moment: a later trial is in the next view only."""
    study = optuna.create_study(directions=["maximize"])
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={"role": "baseline"}))
    view = StudyView.of(study)
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[2.0], user_attrs={"remeasure_of": 0}))
    study.set_user_attr("objectives", ["output_tok_s"])
    assert len(view.trials) == 1 and view.reference.number == 0 and "objectives" not in view.user_attrs
    again = StudyView.of(study)
    assert again.baseline.number == 0 and again.reference.number == 1 and again.superseded == {0: 1}
    assert [t.number for t in again.record_chain(again.trial(1))] == [0, 1]
