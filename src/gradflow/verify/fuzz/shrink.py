"""Shrinking a failing fuzz program: the smallest program (by greedy one-step reductions) that still fails
the same way, so a bug report reads like a test case.

One step removes a statement, puts a branch's or a while loop's body in its place, replaces an expression
by one of its operands or by a constant, or drops a term of the loss. A candidate that no longer parses, or
whose twin fails, simply does not fail the same way and is discarded; `still_fails` decides (the campaign
runs candidates in its worker processes, so a crash while shrinking is harmless).
"""

from __future__ import annotations

from typing import Callable, Iterator

import attrs

from gradflow.verify.fuzz.program import (
    Arange, Assign, Call, Define, For, If, Map, MatMul, Num, Op, Program, Read, Reduce, Stop, Transpose, While,
)

_EXPRESSIONS = (Num, Arange, Read, Call, Op, Reduce, MatMul, Transpose, Stop)


def _operands(expr) -> list:
    if isinstance(expr, Call):
        return [expr.arg]
    if isinstance(expr, (Op, MatMul)):
        return [expr.left, expr.right]
    if isinstance(expr, (Reduce, Transpose, Stop)):
        return [expr.arg]
    return []


def _splices(stmt) -> list[tuple]:
    if isinstance(stmt, If):
        return [stmt.then, stmt.orelse]
    if isinstance(stmt, While):
        return [stmt.body]
    return []


def _statement_lists(body: tuple) -> Iterator[tuple]:
    for k in range(len(body)):
        yield body[:k] + body[k + 1:]
    for k, stmt in enumerate(body):
        for inner in _splices(stmt):
            yield body[:k] + tuple(inner) + body[k + 1:]
    for k, stmt in enumerate(body):
        for smaller in _node(stmt):
            yield body[:k] + (smaller,) + body[k + 1:]


def _expressions(expr) -> Iterator:
    for operand in _operands(expr):
        yield operand
    if not isinstance(expr, Num):
        yield Num(1.0)
    for name in ("arg", "left", "right"):
        child = getattr(expr, name, None)
        if isinstance(child, _EXPRESSIONS):
            for smaller in _expressions(child):
                yield attrs.evolve(expr, **{name: smaller})


def _node(node) -> Iterator:
    """One-step reductions of a statement (its expressions and nested bodies; never its targets)."""
    if isinstance(node, Assign):
        for smaller in _expressions(node.value):
            yield attrs.evolve(node, value=smaller)
    elif isinstance(node, Define) and node.value is not None:
        for smaller in _expressions(node.value):
            yield attrs.evolve(node, value=smaller)
    elif isinstance(node, (For, Map)):
        for body in _statement_lists(node.body):
            yield attrs.evolve(node, body=body)
    elif isinstance(node, If):
        for body in _statement_lists(node.then):
            yield attrs.evolve(node, then=body)
        for body in _statement_lists(node.orelse):
            yield attrs.evolve(node, orelse=body)
        for smaller in _expressions(node.cond.left):
            yield attrs.evolve(node, cond=attrs.evolve(node.cond, left=smaller))
    elif isinstance(node, While):
        for body in _statement_lists(node.body):
            yield attrs.evolve(node, body=body)


def reductions(program: Program) -> Iterator[Program]:
    """Every program one reduction step smaller than `program` (largest steps first)."""
    for body in _statement_lists(program.body):
        yield attrs.evolve(program, body=body)
    for k in range(len(program.loss)):
        yield attrs.evolve(program, loss=program.loss[:k] + program.loss[k + 1:])
    for h, helper in enumerate(program.helpers):
        for body in _statement_lists(helper.body):
            helpers = program.helpers[:h] + (attrs.evolve(helper, body=body),) + program.helpers[h + 1:]
            yield attrs.evolve(program, helpers=helpers)


def size(program: Program) -> int:
    return len(program.render(False))


def shrink(program: Program, still_fails: Callable[[Program], bool], attempts: int = 80) -> Program:
    """Greedily the smallest program reachable from `program` by reductions for which `still_fails` holds,
    within `attempts` calls of `still_fails`."""
    current = program
    tried: set[str] = set()
    while attempts > 0:
        for candidate in sorted(reductions(current), key=size):
            text = candidate.render(False)
            if text in tried or size(candidate) >= size(current):
                continue
            tried.add(text)
            attempts -= 1
            if still_fails(candidate):
                current = candidate
                break
            if attempts <= 0:
                break
        else:
            break
    return current

