"""Imports go one way: between layers, between the rooms of a layer, and between modules.

Layers: api → engine → (models, sampling, tokenizer) → kernels. Every module of every package
is parsed (imports under ``TYPE_CHECKING`` and inside functions count too) and each
``pagedserve`` import becomes an edge between layers. An edge that points up or sideways
fails, and so does any cycle between packages. Leaf modules (``pagedserve.common``: the
SamplingParams, the errors, the load-hint wire format, the tiktoken encodings) import no other
layer, and every layer may import them.

Rooms: the API, the engine, the client and the kernels are folders of rooms, each named in
``ROOMS`` with the rooms it may import; a new folder fails until it is given a place there.

Modules: no circle of imports between two modules, except the type-only references a part
makes back to the object that owns it (``BACK_REFERENCES``, each with its reason).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pagedserve"
LEAF_MODULES = ("pagedserve.common",)

# Each layer and the layers below it that it may import (besides itself and the leaves).
ALLOWED: dict[str, set[str]] = {
    "leaf": set(),
    "kernels": set(),
    "models": {"kernels"},
    "sampling": {"kernels"},
    "tokenizer": set(),
    "engine": {"models", "sampling", "tokenizer", "kernels"},
    "api": {"engine", "models", "sampling", "tokenizer", "kernels"},
    "offline": {"engine", "models", "sampling", "tokenizer", "kernels"},
    "cli": {"api", "offline", "engine", "models", "sampling", "tokenizer", "kernels",
            "client", "loadgen", "server", "router"},
    "server": {"offline"},  # the package's lazy exports
    "top": {"server", "offline"},  # pagedserve's own lazy exports
    "client": set(),
    "loadgen": {"client"},
    "router": set(),  # no model, no torch: only the shared leaves
}

# The rooms of each layer that has them (folders under pagedserve/), and the rooms of the
# same layer each may import. The folder of the layer itself holds what sits on top.
ROOMS: dict[str, set[str]] = {
    # The HTTP API: the app factory, the info routes and shutdown on top.
    "server/api": {"server/api/serving", "server/api/protocol", "server/api/telemetry",
                   "server/api/config", "server/api/http", "server/api/tools",
                   "server/api/web"},
    # The handlers: one pipeline, each route's protocol, logprobs and response shaping.
    "server/api/serving": {"server/api/protocol", "server/api/telemetry", "server/api/config",
                           "server/api/http", "server/api/tools"},
    # The wire types: request bodies, read and type-checked.
    "server/api/protocol": {"server/api/tools"},
    # Metrics, traces, the server's log, load hints and the throughput curve.
    "server/api/telemetry": {"server/api/config", "server/api/http", "server/api/web"},
    # The server's settings and the app keys every room reads.
    "server/api/config": {"server/api/http", "server/api/tools"},
    # Connections, limits, admission, forwarded addresses, JSON, SSE, OpenAI-shaped errors.
    "server/api/http": {"server/api/web"},
    # Tool-call parsers and the outputs of tool grammars.
    "server/api/tools": set(),
    # The page at / (static files) and the engine-state endpoint it reads.
    "server/api/web": set(),
    # The engine: LLMEngine and AsyncEngine, the output processor and the engine's stats.
    "server/engine": {"server/engine/parallel", "server/engine/logits", "server/engine/worker",
                      "server/engine/core", "server/engine/config"},
    "server/engine/parallel": {"server/engine/worker", "server/engine/core",
                               "server/engine/config"},
    "server/engine/logits": {"server/engine/core"},
    "server/engine/worker": {"server/engine/core", "server/engine/config"},
    "server/engine/core": {"server/engine/config"},
    "server/engine/config": set(),
    # The client: its public names and the batch CLI on top.
    "client": {"client/batch", "client/adaptive", "client/budget", "client/api"},
    "client/batch": {"client/adaptive", "client/budget", "client/api"},
    "client/adaptive": {"client/budget", "client/api"},
    "client/budget": {"client/api"},
    "client/api": set(),
    "kernels": {"kernels/triton"},
    "kernels/triton": set(),
}

# Type-only references from a part back to the object that owns it; every other circle
# between two modules fails.
BACK_REFERENCES: dict[tuple[str, str], str] = {
    ("pagedserve.server.engine.core.scheduler_updates", "pagedserve.server.engine.core.scheduler"):
        "StepUpdater applies a step's tokens to the scheduler it belongs to",
    ("pagedserve.server.engine.core.scheduler_stats", "pagedserve.server.engine.core.scheduler"):
        "SchedulerStats.of reads a snapshot of its scheduler",
    ("pagedserve.server.engine.core.integrity", "pagedserve.server.engine.core.scheduler"):
        "the consistency checks read the scheduler they check",
    ("pagedserve.server.engine.core.integrity", "pagedserve.server.engine.core.block_manager"):
        "the consistency checks read the block manager they check",
    ("pagedserve.server.engine.parallel.runner", "pagedserve.server.engine.parallel.launcher"):
        "rank 0's runner steps the worker group that owns it",
    ("pagedserve.server.tokenizer.chat_encoding", "pagedserve.server.tokenizer.base"):
        "chat encoding is Tokenizer.encode_chat's body and reads its tokenizer",
    ("pagedserve.client.api.models", "pagedserve.client.api.client"):
        "client.models holds its client, as openai-python's resources do",
    ("pagedserve.client.api.resources", "pagedserve.client.api.client"):
        "client.completions and client.chat hold their client, as openai-python's do",
}


def layer_of(module: str) -> str:
    if module.startswith(LEAF_MODULES):
        return "leaf"
    parts = module.split(".")
    if len(parts) == 1:
        return "top"
    if parts[1] == "__main__":
        return "cli"
    if parts[1] != "server":
        return parts[1]
    if len(parts) == 2:
        return "server"
    if parts[2] == "llm":
        return "offline"
    return parts[2]


@cache
def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(ROOT).with_suffix("").parts
        if relative[-1] == "__init__":
            relative = relative[:-1]
        modules[".".join(relative)] = path
    return modules


def _package_of(path: Path) -> list[str]:
    """The package a module at ``path`` belongs to (itself for an ``__init__.py``)."""
    return list(path.parent.relative_to(ROOT).parts)


def _type_only_nodes(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            found.update(id(child) for statement in node.body for child in ast.walk(statement))
    return found


@cache
def module_imports(path: Path) -> dict[str, bool]:
    """Every module of ours that ``path`` imports, and whether only under ``TYPE_CHECKING``:
    absolute and relative imports, and a string that names a module
    (``importlib.import_module("pagedserve...")``, the CLI's dispatch). ``from pkg import
    module`` names the module, not its package."""
    found: dict[str, bool] = {}
    modules = module_files()
    tree = ast.parse(path.read_text(), str(path))
    type_only = _type_only_nodes(tree)
    # A logger's or tracer's name, or a package whose data files are read, is spelled like a
    # module but imports nothing.
    names = {id(arg) for call in ast.walk(tree) if isinstance(call, ast.Call)
             and isinstance(call.func, ast.Attribute)
             and call.func.attr in ("getLogger", "get_tracer", "files") for arg in call.args}

    def add(name: str, node: ast.AST) -> None:
        if name in modules:
            found[name] = found.get(name, True) and id(node) in type_only

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(path)
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            submodules = [f"{base}.{alias.name}" for alias in node.names
                          if f"{base}.{alias.name}" in modules]
            for name in submodules:
                add(name, node)
            if len(submodules) < len(node.names):
                add(base, node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("pagedserve.") and id(node) not in names:
            add(node.value, node)
    return found


def imports_of(path: Path) -> set[str]:
    return set(module_imports(path))


def test_relative_imports_and_module_strings_count() -> None:
    kernels = imports_of(PACKAGE / "kernels" / "triton" / "__init__.py")
    assert "pagedserve.kernels.triton.decode" in kernels  # ``from . import decode``
    cli = imports_of(PACKAGE / "cli" / "main.py")
    assert {"pagedserve.client.cli", "pagedserve.loadgen.cli"} <= cli  # importlib strings


def test_type_only_imports_are_told_apart() -> None:
    imports = module_imports(PACKAGE / "server" / "engine" / "core" / "scheduler_updates.py")
    assert imports["pagedserve.server.engine.core.scheduler"] is True
    assert imports["pagedserve.server.engine.core.sequence"] is False


@cache
def edges() -> list[tuple[str, str]]:
    return [(module, target) for module, path in sorted(module_files().items())
            for target in sorted(imports_of(path))]


def test_every_module_maps_to_a_layer() -> None:
    layers = {layer_of(module) for module in module_files()}
    assert layers <= set(ALLOWED), layers - set(ALLOWED)


def test_imports_follow_the_layer_order() -> None:
    wrong = []
    for module, target in edges():
        source_layer, target_layer = layer_of(module), layer_of(target)
        if source_layer == target_layer or target_layer == "leaf":
            continue
        if target_layer not in ALLOWED[source_layer]:
            wrong.append(f"{module} ({source_layer}) imports {target} ({target_layer})")
    assert wrong == []


def test_leaf_modules_import_only_leaves() -> None:
    wrong = [(module, target) for module, target in edges()
             if layer_of(module) == "leaf" and layer_of(target) != "leaf"]
    assert wrong == []


def room_of(module: str) -> str:
    """The folder of ``module`` under pagedserve/ (``server/api/http``)."""
    return module_files()[module].parent.relative_to(PACKAGE).as_posix()


def test_every_room_is_named() -> None:
    families = {room.split("/")[0] if room.startswith(("client", "kernels"))
                else "/".join(room.split("/")[:2]) for room in ROOMS}
    folders = {room_of(module) for module in module_files()}
    unnamed = {folder for folder in folders
               if folder.startswith(tuple(families)) and folder not in ROOMS}
    assert unnamed == set()


def test_rooms_import_one_way() -> None:
    wrong = []
    for module, target in edges():
        source, dest = room_of(module), room_of(target)
        if source != dest and source in ROOMS and dest in ROOMS \
                and layer_of(module) == layer_of(target) and dest not in ROOMS[source]:
            wrong.append(f"{module} ({source}) imports {target} ({dest})")
    assert wrong == []


def test_the_room_table_has_no_cycle() -> None:
    assert _find_cycle(ROOMS) is None


def test_no_cycle_between_packages() -> None:
    files = module_files()

    def package(module: str) -> str:
        if files[module].name == "__init__.py":
            return module
        return module.rpartition(".")[0]

    graph: dict[str, set[str]] = {}
    for module, target in edges():
        if package(module) != package(target):
            graph.setdefault(package(module), set()).add(package(target))
    cycle = _find_cycle(graph)
    assert cycle is None, " → ".join(cycle or [])


def test_no_cycle_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for module, target in edges():
        if module != target and (module, target) not in BACK_REFERENCES:
            graph.setdefault(module, set()).add(target)
    cycle = _find_cycle(graph)
    assert cycle is None, " → ".join(cycle or [])


@pytest.mark.parametrize(("module", "owner"), sorted(BACK_REFERENCES))
def test_each_back_reference_is_type_only(module: str, owner: str) -> None:
    assert module_imports(module_files()[module]).get(owner) is True


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}}) is None


@pytest.mark.parametrize("module", ["pagedserve.common.sampling_params",
                                    "pagedserve.common.errors",
                                    "pagedserve.common.engine_errors",
                                    "pagedserve.common.load_hints",
                                    "pagedserve.common.encoding",
                                    "pagedserve.common.running_buckets",
                                    "pagedserve.common.http.connection_guard"])
def test_a_leaf_imports_without_torch_or_the_engine(module: str) -> None:
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'torch' or "
            f"m.startswith(('pagedserve.server.engine', 'pagedserve.server.api', "
            f"'pagedserve.client'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "[]"
