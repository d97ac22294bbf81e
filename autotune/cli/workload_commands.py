"""`autotune workload inspect|convert`: look at a workload before tuning on it, or convert it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.cli.edge import (_TURNS_HELP, _turns, _workload_format, app, console, err)
from autotune.core.formats import FORMATS
from autotune.cli.present import categories_table, inspect_table


workload_app = typer.Typer(no_args_is_help=True, help="Look at a workload before tuning on it, or convert it.")
app.add_typer(workload_app, name="workload")


@workload_app.command("inspect", epilog="Examples:\n\n  autotune workload inspect examples/json_edit.jsonl\n\n"
                      "  autotune workload inspect batch.jsonl --format openai-batch --json\n\n"
                      "  autotune workload inspect question.jsonl --model meta-llama/Llama-3.1-8B-Instruct "
                      "--max-model-len 4096")
def workload_inspect(
    file: Annotated[Path, typer.Argument(help="Workload file.")],
    format: Annotated[str, typer.Option("--format", help=f"Workload format: {', '.join(FORMATS)}.")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none.")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
    model: Annotated[Optional[str], typer.Option(help="Count prompt tokens with this model's tokenizer. Default: "
                                                      "the bundled demo model.", envvar="AUTOTUNE_MODEL")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(min=1, help="The context to check prompts against "
                                                                   "(default: the model's).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the model repo's own tokenizer code.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Request count, prompt/output lengths (in the model's tokens), sampling mix, arrivals, categories,
    prompts over the context, and whether ngram lookup may help."""
    from autotune import demo
    from autotune.core.context import load_tokenizer, model_context
    from autotune.core.inspection import summarize
    from autotune.core.workload import load_workload

    wl = load_workload(file, format=_workload_format(format), output_len=output_len, turns=_turns(turns))
    tok, context, source = None, None, "--model"
    if model is None and demo.available():
        model, max_model_len, source = str(demo.TARGET), max_model_len or demo.MAX_MODEL_LEN, "demo"
    if model is not None:
        try:
            tok = load_tokenizer(model, trust_remote_code=trust_remote_code)
            context = model_context(model, max_model_len)
        except Exception as e:  # noqa: BLE001 - lengths in words instead, and say why
            from rich.markup import escape as plain

            err.print(f"[yellow]warning:[/yellow] could not load the tokenizer of {plain(model)} "
                      f"({plain(f'{type(e).__name__}: {str(e)[:160]}')}); lengths in words", highlight=False)
    info = summarize(wl, tokenizer=tok, context=context)
    info["tokenizer"] = model if tok is not None else None
    info["tokenizer_source"] = source if tok is not None else None  # "demo": not the user's model
    info["notes"], info["endpoint"] = list(wl.notes), wl.endpoint
    if json_out:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return
    console.print(inspect_table(info))
    for note in wl.notes:  # what the replay leaves out of the log, or takes a default for
        console.print(f"workload: {note}", highlight=False, markup=False, soft_wrap=True)
    if info["categories"]:
        console.print(categories_table(info))


@workload_app.command("convert", epilog="Examples:\n\n  autotune workload convert sharegpt.json -o workload.jsonl\n\n"
                      "  autotune workload convert question.jsonl --turns all -o spec_bench.jsonl")
def workload_convert(
    file: Annotated[Path, typer.Argument(help="Workload file in any supported format.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the native JSONL.")],
    format: Annotated[str, typer.Option("--format", help=f"Workload format: {', '.join(FORMATS)}.")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none.")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
) -> None:
    """Write a workload in the native JSONL form."""
    from autotune.core.workload import load_workload

    wl = load_workload(file, format=_workload_format(format), output_len=output_len, turns=_turns(turns))
    output.write_text("".join(json.dumps(r.to_json()) + "\n" for r in wl.requests))
    console.print(f"wrote {len(wl.requests)} requests to {output}", highlight=False)


