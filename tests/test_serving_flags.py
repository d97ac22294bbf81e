"""The user's own `vllm serve` flags (issue 41): parsed by vLLM's parser before any engine, each
collision rule one line and exit 2, fixed in every trial (FAKE engine, tests/fake_engine.py), part of
the fingerprint, placed on devices, and carried by serve.sh through vLLM's parser."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core.errors import BadInput
from autotune.run import devices

runner = CliRunner()
SPACE = """name: flags
baseline: {method: none, kv_cache_dtype: auto, max_num_seqs: 2}
params:
  method: {choices: [none, ngram]}
  num_speculative_tokens: {int: [2, 3], when: {method: [ngram]}}
  kv_cache_dtype: {choices: [auto]}
  max_num_seqs: {choices: [2, 4]}
"""


def _search(tmp_path, monkeypatch, *args: str, flags: tuple[str, ...] = (), study: str = "s"):
    """`autotune search` through the CLI, trials on the FAKE engine."""
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("COLUMNS", "1000")  # each record whole on one line, to read it (a pipe wraps at 100)
    tmp_path.mkdir(exist_ok=True)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return runner.invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space", str(space),
                               "--results", str(tmp_path / "results"), "--study", study, "--samples", "0",
                               "--repeats", "1", "--max-repeats", "0", "--no-remeasure", "--no-launcher", *args,
                               *(["--", *flags] if flags else [])])


def _refused(r, tmp_path, *fragments: str) -> None:
    """Exit 2, one line naming the flag, and no worker started (nothing under results/)."""
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("worker.log"))


@pytest.mark.parametrize("flags, fragments", [
    (("--tensor-paralel-size", "2"), ("unrecognized arguments: --tensor-paralel-size",)),  # misspelt
    (("--max-num-seqs", "many"), ("--max-num-seqs", "invalid int value")),
    (("--port", "8001"), ("--port", "autotune sets this itself")),  # owned
    (("--seed", "3"), ("--seed", "use --seed")),
    (("--speculative-config", '{"method": "ngram"}'), ("--speculative-config", "search space")),
    (("--compilation-config", '{"cudagraph_mode": "NONE"}'), ("--compilation-config", "autotune sets this itself")),
    # duplicates of autotune's own options: the message says where to put it, with its value (issue 52)
    (("--dtype", "float16"), ("--dtype", "give it before `--` as --dtype float16")),
    (("--max-model-len", "512"), ("--max-model-len", "give it before `--` as --max-model-len 512")),
    (("--gpu-memory-utilization", "0.5"), ("give it before `--` as --gpu-memory-utilization 0.5",)),
    (("--trust-remote-code",), ("give it before `--` as --trust-remote-code",)),
    (("--kv-cache-memory-bytes", "1G"), ("--kv-cache-memory-bytes", "give --gpu-memory-utilization before `--`")),
])
def test_a_bad_or_colliding_flag_is_one_line_exit_2_before_any_engine(tmp_path, monkeypatch, fake_engine_env,
                                                                      flags, fragments):
    _refused(_search(tmp_path, monkeypatch, flags=flags), tmp_path, *fragments)


@pytest.mark.cpu_only(reason="-tp 2 placed as on CPU: a core list per rank (VLLM_CPU_OMP_THREADS_BIND), said and "
                             "exported with the pick; on a GPU the ranks are devices (test_search_places_workers_...)")
def test_a_flag_for_a_searched_knob_removes_it_and_every_trial_and_serve_sh_carry_the_flags(
        tmp_path, monkeypatch, fake_engine_env):
    r = _search(tmp_path, monkeypatch, "--trials", "3", "--strategy", "grid",
                flags=("--max-num-seqs", "8", "--enable-prefix-caching", "-tp", "2"))
    assert r.exit_code == 0, r.output
    assert "--max-num-seqs: fixed by your serving flags, so the space no longer searches max_num_seqs" in r.output
    out = tmp_path / "results" / "s"
    trials = sorted(out.glob("trials/*/job.json"))
    assert len(trials) >= 2
    for job in trials:  # the job each worker ran: the baseline and every candidate
        kw = json.loads(job.read_text())["engine_kwargs"]
        assert (kw["max_num_seqs"], kw["enable_prefix_caching"], kw["tensor_parallel_size"]) == (8, True, 2), kw
    best = json.loads((out / "best.json").read_text())
    assert "max_num_seqs" not in best["best"]["candidate"]
    sh = (out / "serve.sh").read_text()
    assert all(f in sh.splitlines()[-1] for f in ("--max-num-seqs 8", "--enable-prefix-caching",
                                                   "--tensor-parallel-size 2"))
    # tensor parallel 2 on CPU: a core list per rank, said in one line and exported with the pick
    assert "2 ranks on CPU: VLLM_CPU_OMP_THREADS_BIND=" in r.output
    assert best["serve_env"] == {devices.BIND: sh.split("VLLM_CPU_OMP_THREADS_BIND:-")[1].split("}")[0]}


def test_serve_config_good_and_bad(tmp_path, monkeypatch, fake_engine_env):
    good = tmp_path / "serve.yaml"
    good.write_text("max-num-seqs: 8\nenable-prefix-caching: true\n")
    r = _search(tmp_path, monkeypatch, "--trials", "2", "--serve-config", str(good), flags=("--max-num-seqs", "6"))
    assert r.exit_code == 0, r.output
    kw = json.loads((tmp_path / "results" / "s" / "best.json").read_text())["baseline"]["engine_kwargs"]
    assert (kw["max_num_seqs"], kw["enable_prefix_caching"]) == (6, True)  # after -- wins over the file
    for text, fragment in [("max-num-seqz: 8\n", "unrecognized arguments: --max-num-seqz"),
                           ("- 1\n- 2\n", "expected a mapping of `vllm serve` flags"),
                           ("a: [\n", "not valid YAML")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        _refused(_search(tmp_path / "b", monkeypatch, "--serve-config", str(bad)), tmp_path / "b", fragment)
    _refused(_search(tmp_path / "c", monkeypatch, "--serve-config", str(tmp_path / "none.yaml")), tmp_path / "c",
             "--serve-config", "no such file")


def test_a_run_with_other_flags_may_not_join_the_study(tmp_path, monkeypatch, fake_engine_env):
    r = _search(tmp_path, monkeypatch, "--trials", "1", flags=("--max-num-seqs", "8"))
    assert r.exit_code == 0, r.output
    r = _search(tmp_path, monkeypatch, "--trials", "2", "--resume", flags=("--max-num-seqs", "6"))
    assert r.exit_code == 2, r.output
    assert "serving flags (after --, or --serve-config): study 's' was made with serve_flags=" in r.output
    r = _search(tmp_path, monkeypatch, "--trials", "2", "--resume", flags=("--max-num-seqs", "8"))
    assert r.exit_code == 0, r.output


def test_workers_times_tensor_parallel_are_placed_on_gpus_or_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert devices.partition(2, "cuda", 2) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,7")
    with pytest.raises(BadInput, match=r"--workers 2: this host has 3 GPUs \(4,5,7\), not enough for 2 worker\(s\) "
                                       r"of 2 each \(tensor x pipeline x data parallel 2\)"):
        devices.partition(2, "cuda", 2)
    with pytest.raises(BadInput, match="this host has 3 GPUs"):
        devices.partition(1, "cuda", 4)
    assert devices.partition(1, "cuda", 2) == [{}]


@pytest.mark.parametrize("visible, placed", [("0,1,2,3", ["0,1", "2,3"]), ("0,1,2", None)])
def test_search_places_workers_times_tensor_parallel_on_a_faked_gpu_host(tmp_path, monkeypatch, visible, placed):
    from autotune.cli.search import SearchOptions, prepare
    from autotune.run import hardware

    from autotune.run import gpu_memory

    monkeypatch.setattr(hardware, "detect", lambda: "cuda")  # a GPU host, faked: no GPU here
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")  # "fake-model" is no model to fetch
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    checked = []  # the memory preflight (NVML, tests/test_gpu_memory.py) sees each worker's devices and T
    monkeypatch.setattr(gpu_memory, "preflight", lambda envs, util, devices: checked.append((envs, devices)))
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    o = SearchOptions(workload="examples/smoke.jsonl", model="fake-model", space=str(space), workers=2,
                      serve_flags=("--tensor-parallel-size", "2"), results=tmp_path)
    if placed is None:
        with pytest.raises(BadInput, match=r"--workers 2: this host has 3 GPUs \(0,1,2\), not enough"):
            prepare(o)
    else:
        assert prepare(o).envs == [{"CUDA_VISIBLE_DEVICES": d} for d in placed]
        assert checked == [([{"CUDA_VISIBLE_DEVICES": d} for d in placed], 2)]


def test_ranks_on_cpu_get_a_core_list_each(monkeypatch):
    monkeypatch.delenv(devices.BIND, raising=False)
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    envs, line = devices.bind_ranks([{}], "cpu", 2)
    assert envs == [{devices.BIND: "0,1|2,3"}] and "VLLM_CPU_OMP_THREADS_BIND=0,1|2,3" in line
    envs, _ = devices.bind_ranks(devices.partition(2, "cpu"), "cpu", 2)
    assert envs == [{devices.BIND: "0|1"}, {devices.BIND: "2|3"}]
    with pytest.raises(BadInput, match="8 ranks"):
        devices.bind_ranks([{}], "cpu", 8)
    monkeypatch.setenv(devices.BIND, "3|2")  # the user's own binding is kept
    assert devices.bind_ranks([{}], "cpu", 2) == ([{}], None)


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_serve_sh_reads_back_through_vllms_parser_with_the_flags(platform):
    from autotune.core.candidate import Candidate, Settings
    from autotune.run.serving_flags import parse
    from autotune.serve.export import serve_script, written_by_export
    from autotune.vllm_cli import parse_serve_args

    flags = parse("m", ["-tp", "2", "--enable-prefix-caching", "--served-model-name", "a", "b",
                        "--limit-mm-per-prompt", '{"image": 1}', "--chat-template", "{{ x }}"])
    kw = Candidate({"method": "ngram", "num_speculative_tokens": 3}).engine_kwargs(
        Settings(model="m", serve_flags=flags.values))
    env = {devices.BIND: "0|1"}
    script = serve_script(kw, platform=platform, python="/venv/bin/python", env=env)
    assert written_by_export(script, kw, platform=platform, env=env)
    assert 'export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0|1}"' in script
    line = script.splitlines()[-1]
    words = shlex.split(line)
    assert words[:4] == ["$PYTHON", "-m", {"cpu": "autotune.vllm_cli", "cuda": "vllm.entrypoints.cli.main"}[platform],
                         "serve"] and 'PYTHON="${AUTOTUNE_PYTHON:-/venv/bin/python}"' in script
    args = parse_serve_args(words[4:-1])  # without "$@"
    assert (args.tensor_parallel_size, args.enable_prefix_caching, args.served_model_name,
            args.limit_mm_per_prompt, args.chat_template) == (2, True, ["a", "b"], {"image": 1}, "{{ x }}")
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}


def test_export_and_serve_carry_the_servers_environment(tmp_path, monkeypatch):
    kw = {"model": "/m/t", "seed": 0, "tensor_parallel_size": 2}
    (tmp_path / "best.json").write_text(json.dumps({"schema_version": 3, "best": {"engine_kwargs": kw},
                                                    "serve_env": {devices.BIND: "0|1"}}))
    r = runner.invoke(app, ["export", str(tmp_path)])
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "VLLM_CPU_OMP_THREADS_BIND='0|1' vllm serve /m/t " \
                                                             "--seed 0 --tensor-parallel-size 2"
    r = runner.invoke(app, ["export", str(tmp_path), "--format", "yaml"])
    assert r.stdout.startswith("# serve with VLLM_CPU_OMP_THREADS_BIND='0|1' in the environment\n")
    started = {}
    monkeypatch.setattr("os.execve", lambda path, argv, env: started.update(argv=argv, env=env))
    monkeypatch.delenv(devices.BIND, raising=False)
    r = runner.invoke(app, ["serve", str(tmp_path), "--port", "8001"])
    assert r.exit_code == 0, r.output
    assert started["argv"][-4:] == ["--tensor-parallel-size", "2", "--port", "8001"]
    assert started["env"][devices.BIND] == "0|1"


def _cached_model(hub, repo: str) -> None:
    """A model in a Hugging Face cache laid out as huggingface_hub keeps it: the demo target's config."""
    from autotune import demo

    sha = "0123456789abcdef0123456789abcdef01234567"
    root = hub / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    (root / "snapshots" / sha).mkdir(parents=True)
    (root / "snapshots" / sha / "config.json").write_text((demo.TARGET / "config.json").read_text())


def test_the_flags_are_checked_with_the_users_model_offline(tmp_path, monkeypatch):
    """parse sets the model as `vllm serve MODEL` does, so vLLM's checks see the user's model, not its
    default (Qwen/Qwen3-0.6B): with HF_HUB_OFFLINE=1 vLLM resolves the model from the local cache,
    which holds the user's (a hub id, or a local folder) and nothing else."""
    import huggingface_hub.constants as hf

    from autotune import demo
    from autotune.run import serving_flags

    _cached_model(tmp_path / "hub", "acme/tiny")
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert serving_flags.parse("acme/tiny", ["--max-num-seqs", "8"]).values == {"max_num_seqs": 8}
    assert serving_flags.parse(str(demo.TARGET), ["--max-num-seqs", "8"]).values == {"max_num_seqs": 8}
    with pytest.raises(BadInput, match="model acme/other: not in the local Hugging Face cache, and HF_HUB_OFFLINE"):
        serving_flags.parse("acme/other", ["--max-num-seqs", "8"])
