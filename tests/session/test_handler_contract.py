"""The contract between a session and its protocol handlers holds in both directions: a handler
uses only what ``HandlerSession`` declares, reads its attributes, and changes the session only
through its methods (no ``s.out.append``, ``s.closing = ...``, ``s.pending.clear()``, no
popping of ``s.open_reads``' ids)."""

from __future__ import annotations

import ast

import pytest

from ..helpers import REPO

SESSION = REPO / "kestrel_actors" / "session"
"""The modules are read as source: in the compiled build they are extensions, with no source
for ``inspect`` and no ``property`` objects on a compiled class."""


def _declared() -> tuple[set[str], set[str]]:
    """``HandlerSession``'s public members, and those of them that are read-only properties."""
    tree = ast.parse((SESSION / "_handler.py").read_text())
    [cls] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "HandlerSession"]
    members, read_only = set(), set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            members.add(node.name)
            if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                read_only.add(node.name)
    return members, read_only


MEMBERS, READ_ONLY = _declared()
READS = {"get"}
"""What a handler may call on a read-only attribute (a mapping's lookup)."""


def session_uses(module: str) -> list[tuple[int, str, ast.AST, ast.AST | None]]:
    """Each use of the handler's session (``s.x`` or ``self.s.x``): line, name, node, parent."""
    tree = ast.parse((SESSION / f"{module}.py").read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "s") or (
                isinstance(owner, ast.Attribute) and owner.attr == "s"
                and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            uses.append((node.lineno, node.attr, node, parents.get(node)))
    return uses


@pytest.mark.parametrize("module", ["_memcache", "_text", "_thrift"])
def test_a_handler_changes_its_session_only_through_its_verbs(module):
    uses = session_uses(module)
    assert uses
    undeclared = [(line, name) for line, name, _, _ in uses if name not in MEMBERS]
    written = [(line, name) for line, name, node, _ in uses if not isinstance(node.ctx, ast.Load)]  # type: ignore[attr-defined]
    mutated = [(line, f"{name}.{parent.attr}") for line, name, _, parent in uses
               if name in READ_ONLY and isinstance(parent, ast.Attribute) and parent.attr not in READS]
    assert (undeclared, written, mutated) == ([], [], [])


def test_the_session_actor_has_every_verb():
    from kestrel_actors.session import SessionActor

    missing = [name for name in MEMBERS if name not in READ_ONLY and not callable(getattr(SessionActor, name, None))]
    assert missing == []
