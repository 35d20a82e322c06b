"""Layers import one way: api → engine → (models, sampling, tokenizer) → kernels.

Every module of every package is parsed (imports under ``TYPE_CHECKING`` and inside functions
count too) and each ``pagedserve`` import becomes an edge between layers. An edge that points
up or sideways fails, and so does any cycle between packages. Leaf modules (SamplingParams,
errors, the load-hint wire format, the tiktoken encodings) import no other layer, and every
layer may import them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pagedserve"
LEAF_MODULES = ("pagedserve.common.engine_errors", "pagedserve.common.sampling_params")

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


def layer_of(module: str) -> str:
    if module.startswith("pagedserve.common") or module.startswith(LEAF_MODULES):
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


def imports_of(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports: absolute and relative imports, and a string
    that names a module (``importlib.import_module("pagedserve...")``, the CLI's dispatch)."""
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    # A logger's or tracer's name is spelled like a module but imports nothing.
    names = {id(arg) for call in ast.walk(tree) if isinstance(call, ast.Call)
             and isinstance(call.func, ast.Attribute)
             and call.func.attr in ("getLogger", "get_tracer") for arg in call.args}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(path)
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            found.add(base)
            # ``from pagedserve.server import errors`` names a module too.
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("pagedserve.") and id(node) not in names:
            found.add(node.value)
    modules = module_files()
    return {name for name in found if name in modules}


def test_relative_imports_and_module_strings_count() -> None:
    kernels = imports_of(PACKAGE / "kernels" / "triton" / "__init__.py")
    assert "pagedserve.kernels.triton.decode" in kernels  # ``from . import decode``
    cli = imports_of(PACKAGE / "cli" / "main.py")
    assert {"pagedserve.client.cli", "pagedserve.loadgen.cli"} <= cli  # importlib strings


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


def test_no_cycle_between_packages() -> None:
    files = module_files()

    def package(module: str) -> str:
        if module in LEAF_MODULES or files[module].name == "__init__.py":
            return module
        return module.rpartition(".")[0]

    graph: dict[str, set[str]] = {}
    for module, target in edges():
        if package(module) != package(target):
            graph.setdefault(package(module), set()).add(package(target))
    cycle = _find_cycle(graph)
    assert cycle is None, " → ".join(cycle or [])


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
                                    "pagedserve.common.running_buckets"])
def test_a_leaf_imports_without_torch_or_the_engine(module: str) -> None:
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'torch' or "
            f"m.startswith(('pagedserve.server.engine', 'pagedserve.server.api', "
            f"'pagedserve.client'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "[]"
