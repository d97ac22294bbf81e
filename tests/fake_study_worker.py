"""One worker process of a shared study with the FAKE engine (tests/fake_engine.py), for
tests/test_workers.py: ``python tests/fake_study_worker.py STORAGE STUDY RESULTS_DIR N_TRIALS``.

It joins (or starts) the study as ``autotune search --resume`` would and prints its pid's trials.
"""

import sys
from pathlib import Path

from autotune.core.candidate import Settings
from autotune.core.space import load_space
from autotune.measure.config import StudyConfig
from autotune.study.loop import run_study
from autotune.core.workload import load_workload

if __name__ == "__main__":
    storage, name, results, n = sys.argv[1:5]
    cfg = StudyConfig(name=name, results_dir=Path(results), settings=Settings(model="fake-model"),
                      storage=storage, n_trials=int(n), trial_timeout_s=60, engine_module="fake_engine",
                      strategy="tpe")  # the budget used in full (predict would stop once nothing can win)
    space = load_space(str(Path(__file__).parent / "data" / "fake_space_ok.yaml"), platform="cpu", models=set())
    run_study(cfg, load_workload("examples/smoke.jsonl"), space, resume=True)
