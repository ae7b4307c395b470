"""Pictures of SDFGs a person can open offline: `gradflow show X.sdfg -o X.svg|X.html`.

- `.svg`: gradflow's own drawing of the control-flow structure, with the forward sweep and the backward
  region (`gradflow_backward`) side by side: loops, conditionals and regions as nested boxes, and one line
  per operation of each state (a map with its ranges and code, a library node, a copy, a nested SDFG).
  Needs nothing but this module.
- `.html`: DaCe's own interactive viewer (SDFV) with the SDFG embedded; its scripts are read from the
  installed `dace` package, so it opens without a network on the machine that wrote it.
"""

from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path

import attrs
import dace
from dace.sdfg import nodes as nd
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion, SDFGState

from gradflow.autodiff.emit import map_ranges
from gradflow.core.errors import InvalidArgumentError

LINE = 15  # px per text line
PAD = 6
INDENT = 14
WIDTH = 620  # px per column
CHARS = 92  # characters that fit a line at the top level
BACKWARD = "gradflow_backward"


@attrs.frozen
class Box:
    """A laid-out block: its title, its own text lines, its children (nested boxes), and their edges."""

    title: str
    lines: tuple[str, ...]
    children: tuple["Box", ...] = ()
    links: tuple[str, ...] = ()  # text on the edge into each child (conditions, assignments), same order
    kind: str = "state"

    def height(self) -> int:
        inner = sum(c.height() + PAD for c in self.children) + LINE * sum(1 for t in self.links if t)
        return LINE * (1 + len(self.lines)) + inner + 2 * PAD


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _data_flow(state: SDFGState, head: nd.Node) -> str:
    """` (A, B -> C)`: the arrays an operation (a top-level node, or a map scope) reads and writes."""
    tail = state.exit_node(head) if isinstance(head, nd.MapEntry) else head
    reads = sorted({e.data.data for e in state.in_edges(head) if not e.data.is_empty()})
    writes = sorted({e.data.data for e in state.out_edges(tail) if not e.data.is_empty()})
    return f"  ({', '.join(reads)} -> {', '.join(writes)})"


def _operation_lines(state: SDFGState) -> list[str]:
    scope = state.scope_dict()
    lines = []
    for node in state.nodes():
        if scope.get(node) is not None:
            continue
        if isinstance(node, nd.MapEntry):
            ranges = ", ".join(f"{p}={r}" for p, r in map_ranges(node).items())
            body = [n for n in state.scope_subgraph(node).nodes() if isinstance(n, (nd.Tasklet, nd.LibraryNode,
                                                                                   nd.NestedSDFG))]
            codes = "; ".join(n.code.as_string if isinstance(n, nd.Tasklet) else type(n).__name__ for n in body)
            lines.append(f"map [{ranges}]: {codes}{_data_flow(state, node)}")
        elif isinstance(node, nd.Tasklet):
            lines.append(f"tasklet: {node.code.as_string}{_data_flow(state, node)}")
        elif isinstance(node, nd.LibraryNode):
            ins = ", ".join(e.data.data for e in state.in_edges(node) if not e.data.is_empty())
            outs = ", ".join(e.data.data for e in state.out_edges(node) if not e.data.is_empty())
            lines.append(f"{type(node).__name__}({ins}) -> {outs}")
        elif isinstance(node, nd.NestedSDFG):
            lines.append(f"nested SDFG {node.sdfg.name}")
    for e in state.edges():
        if isinstance(e.src, nd.AccessNode) and isinstance(e.dst, nd.AccessNode):
            lines.append(f"copy {e.src.data} -> {e.dst.data}[{e.data.subset}]")
    return lines


def _ordered(region: ControlFlowRegion) -> list[tuple[object, str]]:
    """The blocks of `region` from its start, breadth first, each with the text of the edge into it."""
    if not region.nodes():
        return []
    start = region.start_block
    order, seen, queue = [(start, "")], {start}, [start]
    while queue:
        block = queue.pop(0)
        for e in region.out_edges(block):
            if e.dst in seen:
                continue
            seen.add(e.dst)
            parts = [] if e.data.is_unconditional() else [f"if {e.data.condition.as_string}"]
            parts += [f"{k} = {v}" for k, v in e.data.assignments.items()]
            order.append((e.dst, "; ".join(parts)))
            queue.append(e.dst)
    order += [(b, "(unreachable)") for b in region.nodes() if b not in seen]
    return order


def layout(block, depth: int = 0) -> Box:
    limit = max(30, CHARS - 2 * depth)
    if isinstance(block, SDFGState):
        return Box(_short(f"state {block.label}", limit), tuple(_short(t, limit) for t in _operation_lines(block)))
    if isinstance(block, ConditionalBlock):
        children, links = [], []
        for cond, branch in block.branches:
            children.append(_region_box(branch, f"case {cond.as_string if cond is not None else 'else'}",
                                        depth + 1, "branch"))
            links.append("")
        return Box(_short(f"if {block.label}", limit), (), tuple(children), tuple(links), "conditional")
    if isinstance(block, LoopRegion):
        if block.loop_variable and block.init_statement is not None:
            head = (f"for {block.init_statement.as_string}; {block.loop_condition.as_string}; "
                    f"{block.update_statement.as_string if block.update_statement else ''}")
        else:
            head = f"while {block.loop_condition.as_string}"
        return _region_box(block, f"loop {block.label}: {head}", depth, "loop")
    if isinstance(block, ControlFlowRegion):
        return _region_box(block, f"region {block.label}", depth, "region")
    return Box(_short(f"{type(block).__name__} {block.label}", limit), ())


def _region_box(region: ControlFlowRegion, title: str, depth: int, kind: str) -> Box:
    pairs = _ordered(region)
    children = tuple(layout(b, depth + 1) for b, _ in pairs)
    links = tuple(_short(t, max(30, CHARS - 2 * depth)) for _, t in pairs)
    return Box(_short(title, max(30, CHARS - 2 * depth)), (), children, links, kind)


_FILL = {"state": "#f5f8ff", "loop": "#fff6e8", "conditional": "#f1fbf1", "branch": "#ffffff",
         "region": "#f8f8f8", "column": "#ffffff"}


def _draw(box: Box, x: int, y: int, width: int, out: list[str]) -> int:
    height = box.height()
    out.append(f'<rect x="{x}" y="{y}" width="{width}" height="{height}" rx="4" fill="{_FILL.get(box.kind, "#fff")}" '
               'stroke="#6b7a99" stroke-width="1"/>')
    cy = y + PAD + LINE - 3
    out.append(f'<text x="{x + PAD}" y="{cy}" font-weight="bold">{escape(box.title)}</text>')
    for line in box.lines:
        cy += LINE
        out.append(f'<text x="{x + PAD + 4}" y="{cy}">{escape(line)}</text>')
    cy += PAD
    for child, link in zip(box.children, box.links):
        if link:
            cy += LINE
            out.append(f'<text x="{x + INDENT}" y="{cy - 3}" fill="#8a4b08">&#8595; {escape(link)}</text>')
        cy += 3
        _draw(child, x + INDENT, cy, width - 2 * INDENT, out)
        cy += child.height() + PAD - 3
    return height


def render_svg(sdfg: dace.SDFG) -> str:
    """The SVG drawing of `sdfg`: forward (and, for a differentiated SDFG, backward) control flow."""
    pairs = _ordered(sdfg)
    forward = [(b, t) for b, t in pairs if b.label != BACKWARD]
    backward = [b for b, _ in pairs if b.label == BACKWARD]
    columns = [Box(f"forward: {sdfg.name}", (), tuple(layout(b, 1) for b, _ in forward),
                   tuple(t for _, t in forward), "column")]
    if backward:
        columns.append(_region_box(backward[0], f"backward: {BACKWARD}", 1, "column"))
    height = max(c.height() for c in columns) + 2 * PAD
    total = len(columns) * (WIDTH + PAD) + PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<rect width="{total}" height="{height}" fill="white"/>']
    for k, column in enumerate(columns):
        _draw(column, PAD + k * (WIDTH + PAD), PAD, WIDTH, out)
    out.append("</svg>")
    return "\n".join(out)


def render_html(sdfg: dace.SDFG) -> str:
    """DaCe's interactive viewer with `sdfg` embedded (scripts from the installed dace package)."""
    import jinja2

    base = Path(os.path.realpath(dace.__file__)).parent / "viewer"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(base / "templates")), autoescape=False)
    # a JS string literal; "</" is escaped so that no label can close the <script> element it sits in
    text = json.dumps(dace.serialize.dumps(sdfg.to_json())).replace("</", "<\\/")
    return env.get_template("sdfv.html").render(sdfg=text, dir=base.as_uri() + "/")


def save_picture(sdfg: dace.SDFG, path: str | os.PathLike) -> Path:
    """Write the picture of `sdfg` to `path`; the suffix (.svg or .html) chooses the kind."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        text = render_svg(sdfg)
    elif suffix in (".html", ".htm"):
        text = render_html(sdfg)
    else:
        raise InvalidArgumentError(f"cannot draw into '{path}': the suffix must be .svg or .html")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
