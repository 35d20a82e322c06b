"""The docs cite what exists.

Every code name docs/internals.md cites in backticks is looked up in the code: a file path must
exist, a ``pagedserve.`` path must import (and its attribute be found), ``Class.method`` must be
a member of that class (or of a base), any other name must occur in the code as a name or a
string. The step it prints must be the step's code. Every relative link in README.md and
docs/*.md must point at a file. README's layout and docs/internals.md's room tables name every
folder of the package, and the Python floor is one number wherever it is written.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import keyword
import re
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.test_import_direction import ROOMS

ROOT = Path(__file__).resolve().parent.parent
INTERNALS = ROOT / "docs" / "internals.md"
# The kernel table's shape letters, defined in the doc itself ("Shapes use: `T` tokens ...").
SHAPE_SYMBOLS = {"T", "S", "H", "Hkv", "D", "N", "B", "M"}
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
CALL = re.compile(r"([A-Za-z_][\w.]*)\(.*\)")
PATH = re.compile(r"[\w.*-]+(/[\w.*-]*)+")
FILE_NAME = re.compile(r"\w+\.(py|c)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass
class CodeIndex:
    """What the code defines, read with ``ast``: each class's members and bases, each
    module's top-level names, and every name and string that occurs anywhere."""

    classes: dict[str, set[str]] = field(default_factory=dict)
    bases: dict[str, set[str]] = field(default_factory=dict)
    modules: dict[str, set[str]] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)

    def members(self, cls: str) -> set[str]:
        seen, todo, found = set(), [cls], set()
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                found |= self.classes.get(name, set())
                todo.extend(self.bases.get(name, ()))
        return found


@cache
def code_index() -> CodeIndex:
    index = CodeIndex()
    for folder in ("pagedserve", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__).resolve():  # its own examples are not the code
                continue
            tree = ast.parse(path.read_text(), str(path))
            index.modules.setdefault(path.stem, set()).update(_top_level(tree))
            index.names.add(path.stem)
            for node in ast.walk(tree):
                _index_node(index, node)
    return index


def _top_level(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _index_node(index: CodeIndex, node: ast.AST) -> None:
    if isinstance(node, ast.ClassDef):
        index.classes.setdefault(node.name, set()).update(_class_members(node))
        index.bases.setdefault(node.name, set()).update(
            b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
            if isinstance(b, ast.Name | ast.Attribute))
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        index.names.add(node.name)
    elif isinstance(node, ast.Name):
        index.names.add(node.id)
    elif isinstance(node, ast.Attribute):
        index.names.add(node.attr)
    elif isinstance(node, ast.arg | ast.keyword) and node.arg:
        index.names.add(node.arg)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        index.names.add(node.value)


def _class_members(node: ast.ClassDef) -> set[str]:
    members = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            members.add(item.name)
            for sub in ast.walk(item):  # self.x = ... in a method
                if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                    members.add(sub.attr)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
        elif isinstance(item, ast.Assign):
            members.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.ClassDef):
            members.add(item.name)
    return members


def inline_code(text: str) -> list[str]:
    """The backticked spans outside fenced blocks."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def resolve_module_path(dotted: str) -> str | None:
    """None when ``dotted`` (``pagedserve....``) imports, else why not."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:cut])} has no {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no module of it imports"


def check_name(span: str) -> str | None:
    """None when the code name ``span`` exists, else why it does not; spans that are not a
    code name (expressions, signatures, values) pass."""
    index = code_index()
    span = span.rstrip("/") if PATH.fullmatch(span) else span
    if (call := CALL.fullmatch(span)) is not None:
        span = call.group(1)
    if PATH.fullmatch(span):
        return None if list(ROOT.glob(span)) else "no such file"
    if FILE_NAME.fullmatch(span):
        return None if list((ROOT / "pagedserve").rglob(span)) else "no such file"
    if span.startswith("pagedserve.") and DOTTED.fullmatch(span):
        return resolve_module_path(span)
    if DOTTED.fullmatch(span):
        owner, *attrs = span.split(".")
        if owner in index.classes:
            missing = [a for a in attrs[:1] if a not in index.members(owner)]
            return f"{owner} has no member {missing[0]!r}" if missing else None
        if owner in index.modules:
            top = index.modules[owner]
            return None if attrs[0] in top else f"module {owner} has no {attrs[0]!r}"
        members = set().union(*index.classes.values())
        return None if attrs[-1] in members else f"no class has a member {attrs[-1]!r}"
    if span.startswith("--") and IDENTIFIER.fullmatch(span[2:].replace("-", "_")):
        span = span[2:].replace("-", "_")
    if re.fullmatch(r'"\w+"', span) or re.fullmatch(r"/\w+", span):
        span = span.strip('"')
    if IDENTIFIER.fullmatch(span) or re.fullmatch(r"/\w+", span):
        known = (span in index.names or span in SHAPE_SYMBOLS or keyword.iskeyword(span)
                 or hasattr(builtins, span))
        return None if known else "not a name or string in the code"
    return None


def test_every_code_name_in_internals_exists() -> None:
    wrong = {span: why for span in inline_code(INTERNALS.read_text())
             if (why := check_name(span)) is not None}
    assert wrong == {}


def test_the_printed_step_is_the_engine_step() -> None:
    text = INTERNALS.read_text()
    block = re.search(r"## The step \(`LLMEngine.step`.*?```python\n(.*?)```", text, re.S)
    assert block is not None, "docs/internals.md lost its step section"
    source = (ROOT / "pagedserve/server/engine/llm_engine.py").read_text()
    tree = ast.parse(source)
    step = next(node for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == "step")
    body = [ast.unparse(statement) for statement in step.body[1:]]  # after the docstring
    printed = ast.unparse(ast.parse(block.group(1))).splitlines()
    assert printed == "\n".join(body).splitlines()


@pytest.mark.parametrize("span,ok", [
    ("LLMEngine.step", True), ("LLMEngine.no_such_method", False),
    ("Scheduler.update_from_output(out, sampled)", True),  # a base class's method
    ("pagedserve.server.engine.llm_engine.LLMEngine", True),
    ("pagedserve.server.engine.no_such_module", False),
    ("pagedserve/server/engine/llm_engine.py", True), ("pagedserve/nowhere.py", False),
    ("step_message.py", True), ("gone_module.py", False),
    ("max_tokens", True), ("no_such_name_anywhere", False), ("--seed", True),
    ("seed + i", True),  # an expression, not a name
])
def test_the_name_check_tells_names_apart(span: str, ok: bool) -> None:
    assert (check_name(span) is None) is ok


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files(doc: Path) -> None:
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)):
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z]+:", path):  # an anchor in the page, or a URL
            continue
        if not (doc.parent / path).exists():
            broken.append(target)
    assert broken == []


def _package_folders() -> set[str]:
    """Every folder of modules under pagedserve/, relative to it (``server/api/http``)."""
    package = ROOT / "pagedserve"
    return {init.parent.relative_to(package).as_posix()
            for init in package.rglob("__init__.py") if init.parent != package}


def test_the_readme_layout_names_every_folder() -> None:
    block = re.search(r"## Layout\n\n```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None, "README.md lost its layout"
    named = set(re.findall(r"([\w/]+)/(?=[\s,)]|$)", block.group(1)))
    folders = _package_folders()
    missing = {f for f in folders if f not in named and f.rsplit("/", 1)[-1] not in named
               and not any(n.startswith(f + "/") for n in named)}
    known = folders | {f.rsplit("/", 1)[-1] for f in folders} | {"pagedserve"}
    unknown = {n for n in named if n not in known and not (ROOT / n).is_dir()
               and not any((ROOT / "deploy").glob(n))}
    assert (missing, unknown) == (set(), set())


def test_internals_names_every_room() -> None:
    text = INTERNALS.read_text()
    spellings = ("`pagedserve/{}/`", "`pagedserve/{}`", "`pagedserve.{}`")
    assert [room for room in sorted(ROOMS) if not any(
        s.format(room if "/" in s else room.replace("/", ".")) in text
        for s in spellings)] == []


def test_the_python_floor_is_one_number() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=(\d+)\.(\d+)", config["project"]["requires-python"])
    assert floor is not None
    major, minor = int(floor.group(1)), int(floor.group(2))
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert f"Python ≥ {major}.{minor}" in (ROOT / "README.md").read_text()
    assert sys.version_info >= (major, minor)
