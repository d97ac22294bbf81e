from autotune.worker import failure_reason


def test_failure_reason_keeps_the_telling_lines():
    e = ValueError("1 validation error for VllmConfig\n  Value error, torch.float32 is not supported for "
                   "quantization method fp8. [type=value_error, input_value=ArgsKwargs(...)]\n"
                   "    For further information visit https://errors.pydantic.dev/2/v/value_error")
    assert failure_reason(e) == ("ValueError: 1 validation error for VllmConfig | Value error, torch.float32 is "
                                 "not supported for quantization method fp8.")
    assert failure_reason(RuntimeError("")) == "RuntimeError: "
    assert len(failure_reason(RuntimeError("x" * 5000))) == 600
