"""The contract between a session and its protocol handlers holds in both directions: a handler
uses only what ``HandlerSession`` declares, reads its attributes, and changes the session only
through its methods (no ``s.out.append``, ``s.closing = ...``, ``s.pending.clear()``, no
popping of ``s.open_reads``' ids)."""

from __future__ import annotations

import ast
import inspect

import pytest

from kestrel_actors.session import _memcache, _text, _thrift
from kestrel_actors.session._handler import HandlerSession

MEMBERS = {name: value for name, value in vars(HandlerSession).items() if not name.startswith("_")}
READ_ONLY = {name for name, value in MEMBERS.items() if isinstance(value, property)}
READS = {"get"}
"""What a handler may call on a read-only attribute (a mapping's lookup)."""


def session_uses(module: object) -> list[tuple[int, str, ast.AST, ast.AST | None]]:
    """Each use of the handler's session (``s.x`` or ``self.s.x``): line, name, node, parent."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
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


@pytest.mark.parametrize("module", [_memcache, _text, _thrift], ids=lambda module: module.__name__)
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
