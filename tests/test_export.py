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
