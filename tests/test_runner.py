"""Which model runner vLLM runs a config on (autotune.core.runner), held to vLLM's own
``VllmConfig.use_v2_model_runner``: the user's VLLM_USE_V2_MODEL_RUNNER first, then Triton, then what
V2 lacks. (The whole configs, built as the CUDA build builds them: tests/test_gpu_space_cuda.py.)"""

from types import SimpleNamespace

import pytest

from autotune.core import runner

SPECS = [None, {"method": "ngram"}, {"method": "suffix"}, {"method": "draft_model"},
         {"method": "draft_model", "use_heterogeneous_vocab": True}, {"method": "eagle3", "parallel_drafting": True},
         {"method": "dflash", "parallel_drafting": True}, {"method": "eagle3"}]


@pytest.mark.parametrize("env", [None, "0", "1"])
@pytest.mark.parametrize("triton", [True, False])
def test_the_runner_is_the_one_vllms_own_property_picks(monkeypatch, env, triton):
    import vllm.config.vllm as vc

    monkeypatch.setattr(vc, "HAS_TRITON", triton)
    if env is None:
        monkeypatch.delenv(runner.ENV, raising=False)
    else:
        monkeypatch.setenv(runner.ENV, env)
    for spec in SPECS:
        # vLLM's property, on a stand-in holding what it reads: no hisparse, no watermark, V2's gaps
        # as autotune lists them (their wording is held to vLLM's in tests/test_gpu_space_cuda.py)
        stand_in = SimpleNamespace(attention_config=SimpleNamespace(hisparse_config=None), watermark_config=None,
                                   _get_v2_model_runner_unsupported_features=lambda s=spec: runner.v2_unsupported(s))
        got = runner.V2 if vc.VllmConfig.use_v2_model_runner.fget(stand_in) else runner.V1
        want, why = runner.expected(spec, triton=triton, env={} if env is None else {runner.ENV: env})
        assert got == want, (spec, env, triton, why)


def test_on_a_gpu_ngram_runs_v2_and_suffix_v1_unless_the_user_says():
    assert runner.expected({"method": "ngram"}, triton=True, env={})[0] == runner.V2
    assert runner.expected({"method": "suffix"}, triton=True, env={}) == (
        runner.V1, "Model Runner V2 does not yet support speculative method 'suffix'")
    assert runner.expected({"method": "ngram"}, triton=False, env={})[0] == runner.V1  # the CPU build
    assert runner.expected({"method": "ngram"}, triton=True, env={runner.ENV: "0"}) == (
        runner.V1, "VLLM_USE_V2_MODEL_RUNNER=0 (set by the user)")


def test_a_space_across_runners_says_so_in_one_line():
    (line,) = runner.runner_lines(["ngram", "suffix", "draft_model"], platform="cuda", env={})
    assert line.startswith("model runner: the baseline runs Model Runner V2; suffix on Model Runner V1 "
                           "(Model Runner V2 does not yet support speculative method 'suffix')")
    assert runner.runner_lines(["ngram", "suffix"], platform="cpu", env={}) == []  # all V1 there
    assert runner.runner_lines(["ngram", "suffix"], platform="cuda", env={runner.ENV: "0"}) == []


def test_the_runner_is_read_from_the_servers_log_else_the_engines_config():
    from autotune.run.served_engine import model_runner

    gpu = "(Worker pid=7) INFO 12-05 [gpu_worker.py:518] Using V2 Model Runner\n"
    cpu = "(APIServer pid=9) WARNING [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.\n"
    suffix = ("WARNING [vllm.py:733] Model Runner V2 does not yet support speculative method 'suffix'; using the V1 "
              "model runner instead.\n")
    assert model_runner(None, gpu) == {"runner": "v2", "from": "server log ('Using V2 Model Runner')"}
    assert model_runner(None, cpu)["runner"] == model_runner(None, suffix)["runner"] == "v1"
    # VLLM_USE_V2_MODEL_RUNNER=0 logs nothing: the engine's config says
    said = model_runner(SimpleNamespace(use_v2_model_runner=False), "INFO nothing about runners\n")
    assert said == {"runner": "v1", "from": "the engine's config (VllmConfig.use_v2_model_runner)"}
    assert model_runner(None, "") is None


def test_a_candidate_on_another_runner_than_the_baseline_says_so():
    from autotune.core.candidate import Candidate, Settings
    from autotune.core.load import LoadPattern
    from autotune.measure.config import StudyConfig
    from autotune.run.evaluate import Evaluation, Reference, measure

    cfg = StudyConfig(name="r", results_dir=None, settings=Settings(model="m"), load=LoadPattern("concurrency", concurrency=1))
    req = {"id": "a", "start": 0.0, "end": 1.0, "chunks": [[0.1, 1], [0.2, 1]], "token_ids": [1, 2], "text": "x",
           "finish_reason": "length", "error": None, "prompt_tokens": 3}
    window = {"window_s": 1.0, "requests": [req], "spec_counters": {
        "vllm:spec_decode_num_drafts": 1, "vllm:spec_decode_num_draft_tokens": 3,
        "vllm:spec_decode_num_accepted_tokens": 1, "vllm:spec_decode_num_accepted_tokens_per_pos": [1, 0, 0]}}
    raw = {"windows": [window], "levels": {}, "model_runner": "v1", "model_runner_from": "server log"}
    m = measure(raw, [{"id": "a", "sampling": {}}], Candidate({"method": "suffix", "num_speculative_tokens": 3}), cfg)
    assert m["model_runner"] == "v1"

    def line(base_runner):
        return Evaluation(m, SimpleNamespace(status="ok", reason=""), Reference(), {}, [], [1.0], base_runner=base_runner).summary()

    assert line("v2").endswith("; ran on Model Runner V1, the baseline on Model Runner V2: the speedup includes the "
                               "runner change (as serving this config would)")
    assert "runner" not in line("v1") and "runner" not in line(None)  # one runner, or a study from before
