from autotune.worker import failure_reason


def test_failure_reason_keeps_the_telling_lines():
    e = ValueError("1 validation error for VllmConfig\n  Value error, torch.float32 is not supported for "
                   "quantization method fp8. [type=value_error, input_value=ArgsKwargs(...)]\n"
                   "    For further information visit https://errors.pydantic.dev/2/v/value_error")
    assert failure_reason(e) == ("ValueError: 1 validation error for VllmConfig | Value error, torch.float32 is "
                                 "not supported for quantization method fp8.")
    assert failure_reason(RuntimeError("")) == "RuntimeError: "
    assert len(failure_reason(RuntimeError("x" * 5000))) == 600


def test_a_known_vllm_fault_in_the_worker_log_is_explained(tmp_path):
    from autotune.worker import explain

    log = tmp_path / "worker.log"
    log.write_text("...\n  File \"gpu_model_runner.py\", line 3502\n    gen.set_offset(gen.get_offset() - 4)\n"
                   "RuntimeError: CPU Generator does not use offset\n")
    why = explain(log)
    assert why.startswith("; cause: vLLM's CPU model runner cannot rewind a seeded request's generator")
    assert "give the sampled requests no seed" in why and "\n" not in why
    log.write_text("RuntimeError: something else\n")
    assert explain(log) == "" and explain(tmp_path / "missing.log") == "" and explain(None) == ""
