"""The rewrite driver: a pass stated as a pattern and its rewrite (the role of xDSL's pattern-rewrite walker).

A `RewritePass` says where it applies in one SDFG (`matches`) and how to apply one match (`rewrite`); the
driver walks the SDFGs of the graph, copies the graph only when something matches, and hands the matches
to the rewrite. The guarantees every such pass gets from here once: no match means the same graph (not
a copy), the caller's graph is never touched, and the rewrite sees matches found in the copy it edits.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Iterator

import dace
from returns.result import Success

from gradflow.core.graph import Graph
from gradflow.core.passes import Pass, PassResult

#: all matches of an SDFG are found once and rewritten in turn (a rewrite leaves the others valid)
EACH = "each"
#: after each rewrite the pattern is matched again (a rewrite may create, remove or change matches)
ONE_AT_A_TIME = "one_at_a_time"


class RewritePass(Pass):
    """A pass made of `matches` and `rewrite` (subclasses are attrs-frozen like every pass)."""

    #: `EACH` or `ONE_AT_A_TIME`
    strategy: ClassVar[str] = EACH
    #: walk the nested SDFGs too (else the top-level SDFG only, or `matches` walks them itself)
    nested: ClassVar[bool] = True
    #: renumber the control-flow graphs afterwards (for rewrites that add or remove regions)
    resets_cfg: ClassVar[bool] = False
    #: an `EACH` pass whose matches are names (of arrays, symbols), as valid in a deep copy as in the graph
    #: they were found in: the driver finds them once, not again in the copy it edits
    matches_are_names: ClassVar[bool] = False

    def matches(self, sdfg: dace.SDFG) -> Iterable[Any]:
        """The places in `sdfg` (not in its nested SDFGs) where the rewrite applies: a sequence, or for
        `ONE_AT_A_TIME` also a generator (only its first match is taken before matching again)."""
        raise NotImplementedError

    def rewrite(self, sdfg: dace.SDFG, match: Any) -> None:
        """Apply one match, in place."""
        raise NotImplementedError

    def run(self, graph: Graph) -> PassResult:
        return drive(graph, self)


def at_data_nodes(sdfg: dace.SDFG, match_at: Callable[[dace.SDFG, dace.SDFGState, Any], Any]) -> Iterator[Any]:
    """`match_at(sdfg, state, node)` at every access node of every state of `sdfg`, where it is not None: the
    `matches` of a rewrite anchored at one array node (lazy, for `ONE_AT_A_TIME`)."""
    for state in sdfg.states():
        for node in state.data_nodes():
            match = match_at(sdfg, state, node)
            if match is not None:
                yield match


def _sdfgs(sdfg: dace.SDFG, nested: bool) -> Iterable[dace.SDFG]:
    return sdfg.all_sdfgs_recursive() if nested else (sdfg,)


def _first(matches: Iterable[Any]) -> Any:
    """The first match (None when there is none), without finding the others when `matches` is lazy."""
    return next(iter(matches), None)


def _by_name(graph: Graph, rewriter: RewritePass) -> PassResult:
    """`drive` for a pass whose matches are names: found once in `graph`, rewritten in the copy (a deep copy
    lists its nested SDFGs in the same order)."""
    found = [list(rewriter.matches(sub)) for sub in _sdfgs(graph.sdfg, rewriter.nested)]
    if not any(found):
        return Success(graph)
    sdfg = graph.editable()
    for sub, matches in zip(_sdfgs(sdfg, rewriter.nested), found, strict=True):
        for match in matches:
            rewriter.rewrite(sub, match)
    if rewriter.resets_cfg:
        sdfg.reset_cfg_list()
    return Success(Graph.adopt(sdfg, graph.meta))


def drive(graph: Graph, rewriter: RewritePass) -> PassResult:
    """Run `rewriter` over `graph` (see the module doc)."""
    if rewriter.matches_are_names and rewriter.strategy == EACH:
        return _by_name(graph, rewriter)
    if not any(_first(rewriter.matches(sub)) is not None for sub in _sdfgs(graph.sdfg, rewriter.nested)):
        return Success(graph)
    sdfg = graph.editable()
    for sub in _sdfgs(sdfg, rewriter.nested):
        if rewriter.strategy == ONE_AT_A_TIME:  # only the first match is used: `matches` may be lazy
            while (found := _first(rewriter.matches(sub))) is not None:
                rewriter.rewrite(sub, found)
        else:
            for match in list(rewriter.matches(sub)):  # all found before the first rewrite
                rewriter.rewrite(sub, match)
    if rewriter.resets_cfg:
        sdfg.reset_cfg_list()
    return Success(Graph.adopt(sdfg, graph.meta))
