"""The house's rules that code review keeps forgetting: no import cycles inside glassbox, no oversized
source files without a stated reason, config.json parsed in one module, the CLI importable without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "glassbox"
MAX_LINES = 400
# Files allowed past MAX_LINES, each with its reason.
LONG_FILES: dict[str, str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run (or, under TYPE_CHECKING, are type-checked) when the module loads: module level,
    inside if/try blocks, not inside functions or classes."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []):
                    stack.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    return found


def _imported(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if node.module and node.level == 0:
        return {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return set()


def import_graph(lazy: bool = True) -> dict[str, set[str]]:
    """module -> the glassbox modules it imports (``from pkg import mod`` loads both): at the top level and,
    with ``lazy``, inside functions too (an import deferred to a call still ties the two modules)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        nodes = (
            [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
            if lazy
            else _top_level_imports(tree)
        )
        for node in nodes:
            graph[name] |= {t for t in _imported(node) if t in modules and t != name}
    return graph


# Third-party modules a function may import when called rather than at load: the heavy or optional ones
# that the torch-free CLI paths (plan, bench) and the servers' optional features must not pay for.
LAZY_THIRD_PARTY = frozenset(
    {"torch", "triton", "rich", "opentelemetry", "matplotlib", "uvicorn", "httpx", "platform"}
)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_no_import_cycle_inside_glassbox() -> None:
    """No cycle among glassbox's modules, counting the imports inside functions too."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_lazy_imports_are_of_the_short_list() -> None:
    """An import inside a function is of glassbox itself (counted by the cycle test) or of LAZY_THIRD_PARTY."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        top = {id(n) for n in _top_level_imports(tree)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top:
                for target in _imported(node) or {"(relative)"}:
                    root = target.split(".")[0]
                    if root != "glassbox" and root not in LAZY_THIRD_PARTY:
                        offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {target}")
    assert not offenders, f"imports inside functions of modules not in LAZY_THIRD_PARTY: {offenders}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_source_files_stay_small() -> None:
    long = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".c"):
            rel = str(path.relative_to(PACKAGE))
            n = len(path.read_text().splitlines())
            if n > MAX_LINES and rel not in LONG_FILES:
                long[rel] = n
    assert not long, f"files over {MAX_LINES} lines without a reason in LONG_FILES: {long}"


def test_config_json_is_parsed_in_one_module() -> None:
    """Only models/config_reader.py names the file config.json as a path (messages and docs may mention it);
    models/sentence_transformers.py reads the sentence-transformers modules' own config.json files (Pooling,
    Dense: their settings, not the model's)."""
    users = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "config.json":
                users.add(str(path.relative_to(PACKAGE)))
    assert users == {"models/config_reader.py", "models/sentence_transformers.py"}


def test_plan_and_bench_start_without_torch() -> None:
    code = (
        "import sys; import glassbox.cli, glassbox.perf.plan_cli, glassbox.perf.planner, "
        "glassbox.bench.bench_cli, glassbox.models.facts; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_api_schema_lists_every_reported_metric() -> None:
    from glassbox.anatomy import METRIC_KEYS
    from glassbox.server.protocol import RequestAnatomy

    assert tuple(RequestAnatomy.model_fields) == METRIC_KEYS


def test_no_stream_synchronizing_host_copies_in_the_step_code() -> None:
    """``torch.tensor(values, device=...)`` copies from pageable memory, which makes the host wait for the
    CUDA stream; the code a step runs (engine/, layers/, models/, quant/, kernels/) sends host values through
    layers/host.py's pinned, non-blocking copies instead."""
    offenders = []
    for sub in ("engine", "layers", "models", "quant", "kernels"):
        for path in sorted((PACKAGE / sub).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("tensor", "as_tensor")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"
                    and any(k.arg == "device" for k in node.keywords)
                ):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, f"torch.tensor(..., device=...) in step code: {offenders}"
