"""Only the scheduler and the block manager change sequences, requests and blocks.

Every engine module outside them is parsed; an assignment to a sequence's, request's or
block's state, a mutating call on one of their lists, or a call of a method that changes
them fails the test, and so does the same change made through a local name bound to that
state (``hashes = seq.block_hashes; hashes.append(h)``). (The output processor's own record,
``seq.text``, is not scheduler state: it writes that and nothing else.)
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from pagedserve.server.engine.core.block import KVCacheBlock
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup

ENGINE = Path(__file__).resolve().parents[2] / "pagedserve" / "server" / "engine"
# The scheduler and its step updater, the block manager with its pools and blocks, and Sequence's
# own methods.
OWNERS = {"scheduler.py", "scheduler_updates.py", "block_manager.py", "block_pool.py",
          "block.py", "sequence.py"}

STATE = (set(Sequence.__slots__) | set(SequenceGroup.__slots__)
         | {f.name for f in fields(KVCacheBlock)}) - {"text"}
SEQUENCE_METHODS = {"append_token", "reset_for_recompute"}
HOLDER_METHODS = {"fork", "add", "remove"}  # on a sequence or a request
HOLDER_NAMES = {"seq", "parent", "child", "beam", "group", "seq_group"}
BLOCK_MANAGER_METHODS = {"allocate", "free", "append_slots", "fork", "swap_in", "swap_out",
                         "cache_computed_blocks"}
LIST_METHODS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"}


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return node.targets
    return []


def _is_state(node: ast.expr | None) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in STATE
            and _last_name(node.value) != "self")


def _aliases(scope: ast.AST) -> set[str]:
    """Local names bound to a piece of state in ``scope`` (``table = seq.block_table``)."""
    names = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and _is_state(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _scopes(tree: ast.Module) -> list[ast.AST]:
    """The module and each function: an alias counts in the scope that binds it."""
    functions = [node for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]
    return [tree, *functions]


def _changes_state(target: ast.expr, aliases: set[str]) -> bool:
    """An assignment to ``target`` changes state: a state attribute (or an item of one), an
    item or attribute of an alias, or an alias itself in place (``+=``)."""
    while isinstance(target, ast.Subscript):
        if isinstance(target.value, ast.Name) and target.value.id in aliases:
            return True
        target = target.value
    if isinstance(target, ast.Attribute):
        return _is_state(target) or _last_name(target.value) in aliases
    return False


def violations(source: str, filename: str = "<module>") -> list[str]:
    found = set()
    tree = ast.parse(source, filename)
    for scope in _scopes(tree):
        aliases = _aliases(scope)
        for node in ast.walk(scope):
            for target in _targets(node):
                in_place = (isinstance(node, ast.AugAssign) and isinstance(target, ast.Name)
                            and target.id in aliases)
                if in_place or _changes_state(target, aliases):
                    found.add(f"{filename}:{node.lineno} sets {ast.unparse(target)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method, receiver = node.func.attr, node.func.value
                name = _last_name(receiver)
                if (method in SEQUENCE_METHODS
                        or (method in HOLDER_METHODS and name in HOLDER_NAMES)
                        or (method in BLOCK_MANAGER_METHODS and name == "block_manager")
                        or (method in LIST_METHODS
                            and (_is_state(receiver) or (isinstance(receiver, ast.Name)
                                                         and receiver.id in aliases)))):
                    found.add(f"{filename}:{node.lineno} calls {ast.unparse(node.func)}()")
    return sorted(found)


def test_only_the_scheduler_and_block_manager_change_state() -> None:
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name not in OWNERS:
            found.extend(violations(path.read_text(), path.name))
    assert found == []


@pytest.mark.parametrize("line", [
    "seq.status = SequenceStatus.RUNNING",
    "item.seq.num_computed_tokens += 1",
    "group.seqs.append(child)",
    "seq.block_table[0] = 3",
    "seq.append_token(5, 0.0)",
    "child = parent.fork(7)",
    "self.scheduler.block_manager.free(seq)",
    "group.prompt_logprobs.extend(positions)",
    "hashes = seq.block_hashes\nhashes.append(block_hash)",
    "def f(seq):\n    table = seq.block_table\n    table[0] = 3",
    "if (table := seq.block_table):\n    table.pop()",
    "metrics = group.metrics\nmetrics.first_token_time = now",
    "ids = seq.output_token_ids\nids += [5]",
])
def test_the_check_finds_each_kind_of_change(line: str) -> None:
    assert len(violations(line)) == 1


def test_the_output_record_and_reads_are_allowed() -> None:
    allowed = ("text.text += emit\nseq.text.logprobs.extend(p)\n"
               "n = len(seq.block_table)\ntext.detokenizer.fork()\nself.status = 1\n"
               "table = list(seq.block_table)\ntable.append(3)\n"
               "def f(seq):\n    ids = seq.token_ids\n    return ids[-1]\n")
    assert violations(allowed) == []
