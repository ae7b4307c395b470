"""Checking one fuzz program: its numpy twin is the reference for values, central differences of the twin for
gradients, and gradflow is run on every configuration asked for.

Verdicts (`Verdict.kind`):
- `ok`: every configuration's values and gradients agree with the twin (and with each other);
- `WRONG`: a value or gradient disagrees while DaCe's own forward agrees with the twin (gradflow's fault);
- `refused`: gradflow raised a typed error about the program (`NotDifferentiableError`,
  `InvalidArgumentError`, `ResourceLimitError`): a documented limit, counted by class;
- `crash`: any other exception (a failed pass, a failed C++ build, an internal error) or, in a campaign, a
  dead or hung worker process;
- `dace`: DaCe's own forward (no gradflow pass) disagrees with the twin, or DaCe cannot build it: reported
  apart, the program tests nothing of gradflow's;
- `invalid`: the twin itself fails (overflow, an invalid value): the generator's fault, reported apart;
- `unstable`: two configurations' gradients disagree, but by no more than the first configuration's own
  gradient moves when the float inputs are nudged by `NUDGE_ULPS` units in the last place: the gradient is
  ill-conditioned at rounding level (a chaotic iteration), so configurations that round differently (a
  stored value against a recomputed one, a vectorized `tanh` against a scalar one) may disagree that much
  with both right. Reported apart, with the measured spread; any disagreement beyond it stays WRONG. Forward
  mode is `unstable` likewise when its tangent differs from the gradient by no more than its own rounding,
  measured as how far the tangent is from linear in the direction (`_jvp_problem`).

A `torch` configuration (`verify.routes`: a `gradflow.torch.function` of the program, differentiated by
`torch.autograd`; `torch_cpp` through its C++ dispatcher) runs last, on the same data except `S`: the function allocates its output, which starts
at 0, so its value and gradients are compared with the twin's from `S = 0` (their own central
differences), not with the other configurations'; its inputs must be unchanged after the call.

Every configuration is run twice on the same data: the second call must return what the first did (what
a call leaves in a state handle's persistent temporaries, or an output not zeroed anew, shows only then),
to rounding: values to 1e-9 relative, gradients as two configurations' must agree (`unstable` within the
nudged spread). Bit for bit would be too much: a sum's order may follow where its temporary lands.

Once the configurations agree, forward mode is checked too (config `JVP`): the tangent of `S` along a random
direction must equal the first configuration's (checked) gradient dotted with that direction; a refusal or a
crash of forward mode alone is reported under that config. Then second order (config `HVP`): `hvp` along a
random direction must equal central differences of that gradient along it (its `while` loops bounded as
the budget configuration bounds them).

Gradients are compared element by element with central differences at two step sizes; an element where
the two disagree (the program is not smooth there: a kink of `abs`, a tie, a jump of an integer
conversion or of a branch) is not compared with them, only across configurations. An element that
disagrees is taken again at a step that rounding at the twin's largest magnitude cannot hide (a value of
1e13 is 0.002 apart from its neighbours, so a step of 1e-5 moves nothing that passes through it): compared
there if the step and its double agree, skipped like a rough element if they do not.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs
import dace
import numpy as np

from gradflow.core.graph import as_sdfg
from gradflow.verify.fuzz import frozen
from gradflow.verify.fuzz.program import plain_maps

#: (route, policy, optimize) triples; the first is what `gradflow.grad` does by default
CONFIGS = tuple((route, policy, optimize) for route in ("grad", "vjp")
                for policy in ("store_all", "recompute_all", "budget") for optimize in (True, False)) + tuple(
    ("torch", policy, True) for policy in ("store_all", "recompute_all", "budget")) + (
    ("torch_cpp", "store_all", True),) + tuple(  # torch functions are optimized; the C++ dispatcher's build is slow
    ("value_and_grad", "budget", optimize) for optimize in (True, False))  # its budget planned at the call
DEFAULT = ("grad", "store_all", True)
#: the configs under which forward mode's and second order's verdicts are reported
JVP = ("jvp", "-", True)
HVP = ("hvp", "store_all", True)

REFUSALS = ("NotDifferentiableError", "NoRuleError", "UnsupportedCode", "InvalidArgumentError",
            "UnknownArrayError", "ResourceLimitError")


@attrs.frozen
class Verdict:
    kind: str  # ok, WRONG, refused, crash, dace, invalid, unstable
    config: tuple = ()
    error: str = ""  # the exception class (refused, crash)
    detail: str = ""
    seconds: float = 0.0
    skipped: int = 0  # gradient elements not compared with central differences (not smooth there)

    def as_json(self) -> dict:
        return {"kind": self.kind, "config": list(self.config), "error": self.error, "detail": self.detail,
                "seconds": round(self.seconds, 3), "skipped": self.skipped}

    @staticmethod
    def from_json(data: Mapping) -> "Verdict":
        return Verdict(data["kind"], tuple(data["config"]), data["error"], data["detail"], data["seconds"],
                       data.get("skipped", 0))


def spec_of(program, configs=(DEFAULT,), seed: int = 0) -> dict:
    """What a worker needs to check `program` (a `fuzz.program.Program`): plain data, JSON-ready."""
    return {"dace": program.render(True), "twin": program.render(False),
            "arguments": [[a.name, list(a.dims), a.role, list(a.values)] for a in program.arguments],
            "symbols": program.symbols(), "wrt": list(program.wrt), "configs": [list(c) for c in configs],
            "seed": seed, "reads_S": any("S[0]" in line for line in program.body_lines()[:-1]),
            **({"hvp": False} if program.stops() else {})}


def twin_source(source: str, sizes: Mapping[str, int]) -> str:
    """The numpy twin of a DaCe module's source: no `dace` import, no decorators or annotations, the size
    symbols as integers, `dace.map` loops as `range` loops, `stop_gradient` from `fuzz.frozen`. Lets a bug
    found by the fuzzer be kept as its DaCe source alone."""
    tree = ast.parse(plain_maps(source))
    body = []
    for node in tree.body:
        if isinstance(node, ast.Import) and any(a.name == "dace" for a in node.names):
            continue
        if (isinstance(node, ast.ImportFrom) and node.module == "gradflow"
                and [a.name for a in node.names] == ["stop_gradient"]):
            # the twin's stops are held while differences are taken, as a drawn program's twin imports them
            node = ast.ImportFrom(module="gradflow.verify.fuzz.frozen", names=node.names, level=0)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func) == "dace.symbol":
            name = node.targets[0].id
            node = ast.Assign(targets=node.targets, value=ast.Constant(sizes[name]), lineno=node.lineno)
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = []
            for arg in node.args.args:
                arg.annotation = None
        body.append(node)
    tree.body = body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def spec_from_source(source: str, sizes: Mapping[str, int], wrt: Sequence[str], integers: Mapping[str, Any] = (),
                     configs=(DEFAULT,), seed: int = 0) -> dict:
    """A spec (`spec_of`) for a DaCe module's source defining `program(..., S)`: `wrt` names the inputs, the
    other float arrays are the loss's weights, `integers` gives the integer arguments (arrays, or a scalar
    trip count)."""
    integers = dict(integers)
    function = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "program")
    arguments = []
    for arg in function.args.args:
        note = ast.unparse(arg.annotation)
        dims = [d.strip() for d in note[note.find("[") + 1:-1].split(",")] if "[" in note else []
        dims = [int(d) if d.isdigit() else d for d in dims]
        if arg.arg in integers:
            value = integers[arg.arg]
            role = "trips" if np.ndim(value) == 0 else "index"
            arguments.append([arg.arg, dims, role, list(np.atleast_1d(value).tolist())])
        else:
            role = "output" if arg.arg == "S" else "input" if arg.arg in wrt else "weight"
            arguments.append([arg.arg, dims, role, []])
    symbols = {**dict(sizes), **{k: int(v) for k, v in integers.items() if np.ndim(v) == 0}}
    return {"dace": source, "twin": twin_source(source, sizes), "arguments": arguments, "symbols": symbols,
            "wrt": list(wrt), "configs": [list(c) for c in configs], "seed": seed,
            "reads_S": "S[0]" in "".join(ast.unparse(s) for s in function.body[:-1])}


_MODULES = 0


def _load(source: str, folder: Path, tag: str):
    """Import `source` from a file (DaCe reads a program's source from its file)."""
    global _MODULES
    _MODULES += 1
    name = f"gradflow_fuzz_{tag}_{_MODULES}"
    path = folder / f"{name}.py"
    path.write_text(source)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


def make_data(spec: Mapping, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    sizes = spec["symbols"]
    data = {}
    for name, dims, role, values in spec["arguments"]:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
        if role == "trips":
            data[name] = int(values[0])
        elif role in ("index", "count"):
            data[name] = np.array(values, dtype=np.int64)
        elif role == "output":
            data[name] = rng.normal(size=shape) * 0.3
        else:
            data[name] = rng.normal(size=shape) * (0.8 if role == "input" else 1.0)
    return data


def run_twin(function, data: Mapping[str, Any]) -> dict[str, Any]:
    """The twin's `program` function on copies of `data`: every argument afterwards."""
    copies = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in data.items()}
    frozen.restart()
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        function(**copies)
    return copies


def _scalar(twin, data, name: str, flat: int, value: float) -> float:
    """S with `name[flat]` moved to `value` (NaN where the stopped values cannot be held: `frozen.Diverged`)."""
    moved = dict(data)
    moved[name] = np.array(data[name], copy=True)
    moved[name].reshape(-1)[flat] = value
    try:
        return float(run_twin(twin, moved)["S"][0])
    except frozen.Diverged:
        return float("nan")


def central_differences(twin, data: Mapping[str, Any], wrt, base: float | None = None) -> tuple[dict, dict]:
    """(d S / d x by central differences at step h, the same at 2h) for each x in `wrt`; the second is NaN
    (no usable difference) at a kink exactly at the point (`_kink`). `base`: S at `data`, where the caller
    ran the twin already."""
    first, second = {}, {}
    base = float(run_twin(twin, data)["S"][0]) if base is None else base
    for name in wrt:
        flat = np.asarray(data[name], dtype=np.float64).reshape(-1)
        d1, d2 = np.zeros_like(flat), np.zeros_like(flat)
        for k, x in enumerate(flat):
            h = 1e-5 * max(1.0, abs(x))
            near = (_scalar(twin, data, name, k, x + h), _scalar(twin, data, name, k, x - h))
            far = (_scalar(twin, data, name, k, x + 2 * h), _scalar(twin, data, name, k, x - 2 * h))
            d1[k] = (near[0] - near[1]) / (2 * h)
            d2[k] = float("nan") if _kink(base, near, far, h) else (far[0] - far[1]) / (4 * h)
        first[name], second[name] = d1.reshape(np.shape(data[name])), d2.reshape(np.shape(data[name]))
    return first, second


def _kink(base: float, near: tuple[float, float], far: tuple[float, float], h: float) -> bool:
    """Whether S has a kink exactly at the point along this element: its right and left slopes differ by
    the same amount at steps h and 2h (a jump of the derivative), where on a smooth S the gap grows with
    the step (curvature: about S'' h, then S'' 2h). Central differences read the mean of the two slopes
    at every step there, so comparing steps h and 2h cannot see it: a tie of a maximum with a stopped copy
    of itself (fuzz seeds 14592 and 4185) has no derivative to check, and torch's and gradflow's
    convention was called WRONG."""
    gap = (near[0] - 2 * base + near[1]) / h
    gap2 = (far[0] - 2 * base + far[1]) / (2 * h)
    noise = 64 * np.finfo(np.float64).eps * max(1.0, abs(base), *map(abs, near), *map(abs, far)) / h
    slope = abs(near[0] - near[1]) / (2 * h)
    return bool(abs(gap) > 1e-4 * max(1.0, slope) + noise and abs(gap2 - gap) <= 0.25 * abs(gap))


def magnitude(twin, data: Mapping[str, Any]) -> float:
    """The largest absolute float the twin holds at any line it runs (its arguments, `S` and temporaries,
    in helpers too): each value rounds to within half a unit of its last place, so this bounds how finely
    a difference of `S` can resolve a derivative."""
    filename = twin.__code__.co_filename
    largest = [0.0]

    def look(frame, event, arg):
        if frame.f_code.co_filename != filename:
            return None
        if event in ("line", "return"):
            for value in list(frame.f_locals.values()):
                if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
                    finite = np.abs(value[np.isfinite(value)])
                    if finite.size:
                        largest[0] = max(largest[0], float(finite.max()))
                elif isinstance(value, float) and np.isfinite(value):
                    largest[0] = max(largest[0], abs(value))
        return look

    previous = sys.gettrace()
    sys.settrace(look)
    try:
        run_twin(twin, data)
    finally:
        sys.settrace(previous)
    return largest[0]


#: how many roundings at the twin's largest magnitude a difference of `S` is assumed to carry
ROUNDINGS = 8


def resolved_difference(twin, data: Mapping[str, Any], name: str, flat: int, tol: float,
                        largest: float) -> float | None:
    """d S / d name[flat] by central differences at a step large enough that rounding at the twin's largest
    magnitude (`largest`) costs at most a tenth of `tol`, or None when that step and its double disagree (the
    program is not linear enough at that scale to resolve the element) or the twin fails there."""
    x = float(np.asarray(data[name], dtype=np.float64).reshape(-1)[flat])
    step = max(1e-5 * max(1.0, abs(x)), 10 * ROUNDINGS * np.finfo(np.float64).eps * largest / tol)
    try:
        near, far = ((_scalar(twin, data, name, flat, x + s) - _scalar(twin, data, name, flat, x - s)) / (2 * s)
                     for s in (step, 2 * step))
    except (FloatingPointError, ZeroDivisionError, OverflowError, ValueError):
        return None
    return near if np.isfinite(near) and abs(near - far) <= 0.1 * tol else None


#: the trip-count bound the budget configuration gives `while` loops
WHILE_BOUND = 64


def _forwarding(policy: str, program, wrt, symbols):
    from gradflow.api import grad_graph
    from gradflow.autodiff.forwarding import RECOMPUTE_ALL, STORE_ALL, Forwarding

    if policy == "store_all":
        return STORE_ALL
    if policy == "recompute_all":
        return RECOMPUTE_ALL
    plan = grad_graph(program, list(wrt), "S", optimize=False).meta["ad"].forwarding_plan
    kept = plan.total_bytes(dict(symbols)) if plan is not None else 0
    # a byte budget cannot price a `while` loop, whose trip count is known only while it runs: as the user
    # guide says, it needs a bound (the grammar's `while` loops run at most 6 times)
    return Forwarding.budget(int(kept * 0.6), sizes=dict(symbols), loop_bounds={"*": WHILE_BOUND})


def _resolver(twin, data: Mapping[str, Any]) -> Callable[[str, int, float], float | None]:
    """`resolved_difference` of the twin at `data`, the twin's largest magnitude measured once, at the first
    difference in doubt."""
    largest: list[float] = []

    def resolve(name: str, flat: int, tol: float) -> float | None:
        if not largest:
            largest.append(magnitude(twin.program, data))
        return resolved_difference(twin.program, data, name, flat, tol, largest[0])
    return resolve


def _classify(exc: BaseException) -> str:
    names = {type(exc).__name__} | {c.__name__ for c in type(exc).__mro__}
    return "refused" if names & set(REFUSALS) and "PassError" not in names else "crash"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _values_agree(got: Mapping, want: Mapping, names) -> str | None:
    for name in names:
        a, b = np.asarray(got[name], dtype=np.float64), np.asarray(want[name], dtype=np.float64)
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-9, atol=1e-11 * scale):
            worst = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("nan")
            return f"value of '{name}' differs from numpy (max abs error {worst:.3g})"
    return None


def _dace_forward_agrees(program, data, want, names, symbols) -> bool:
    """Whether DaCe's own build of the program (no gradflow pass) computes what the twin does."""
    from gradflow.core.graph import Graph
    from gradflow.runtime.invoke import Invoker
    from gradflow.verify.routes import _copies, _used

    given = _copies(data)
    try:
        graph = Graph.of(program)
        out, _ = Invoker(graph)(**given, **_used(symbols, graph.sdfg, given))
    except Exception:  # DaCe cannot build or run its own forward: not gradflow's to judge
        return False
    return _values_agree(out, want, names) is None


def _gradients_agree(got: Mapping, fd1: Mapping, fd2: Mapping, value: float,
                     resolve: Callable[[str, int, float], float | None] | None = None) -> tuple[str | None, int]:
    """(what disagrees, or None; how many elements were skipped as not smooth).

    An element that disagrees is first handed to `resolve(name, flat index, tolerance)`, which may answer a
    difference taken where rounding cannot hide the derivative (`resolved_difference`), or None when no step
    resolves it: such an element is skipped like a rough one."""
    skipped = 0
    peak = max([1.0] + [float(np.max(np.abs(v))) for v in fd1.values() if v.size])

    def tolerance(d):
        return 1e-5 * np.abs(d) + 1e-6 * peak + 1e-9 * max(1.0, abs(value))

    for name, d1 in fd1.items():
        g = np.asarray(got[name], dtype=np.float64).reshape(d1.shape)
        tol = tolerance(d1)
        rough = ~(np.abs(d1 - fd2[name]) <= 0.1 * tol)  # NaN (no difference taken) counts as rough
        skipped += int(rough.sum())
        for k in np.flatnonzero(((np.abs(g - d1) > tol) & ~rough).reshape(-1)):
            mine, theirs = g.reshape(-1)[k], d1.reshape(-1)[k]
            if resolve is not None:
                again = resolve(name, int(k), float(tolerance(theirs)))
                if again is None:
                    skipped += 1
                    continue
                if abs(mine - again) <= tolerance(again):
                    continue
                theirs = again
            where = ", ".join(str(int(i)) for i in np.unravel_index(k, d1.shape))
            return f"d S / d {name}[{where}] = {float(mine)!r}, central differences {float(theirs)!r}", skipped
    return None, skipped


def _second_call_differs(run: Callable, data: Mapping[str, Any], names: Sequence[str], after: Mapping,
                         grads: Mapping) -> tuple[str | None, bool]:
    """(what a second call of `run` on the same data returned otherwise than the first, or None; whether
    that difference is within how far the gradient moves when the inputs are nudged by `NUDGE_ULPS` ulps).
    Rounding may differ between calls: a vectorized sum or a BLAS dot product takes another order where its
    temporary lands at another alignment (fuzz seed 4120: 1 ulp of a gradient, alternating call by call),
    so values must agree to 1e-9 relative and gradients as two configurations' do."""
    again_after, again_grads = run(data)
    problem = _values_agree(again_after, after, [n for n in names if n in after])
    if problem is not None:
        return f"a second call on the same data: {problem.replace('from numpy', 'from the first')}", False
    problem = _configs_agree(grads, again_grads)
    if problem is None:
        return None, False
    # the spread of later calls (nudged) around the second: a call that sees what an earlier one left is
    # off at every later call alike, so its spread stays small and the first call stands apart
    within = _configs_agree(grads, again_grads, _spread(_rerun(run), data, names, again_grads)) is None
    return f"a second call on the same data: {problem.replace('between configurations', 'from the first')}", within


def _configs_agree(first: Mapping, other: Mapping, spread: Mapping | None = None) -> str | None:
    """What differs between two configurations' gradients (relative 1e-8), or None; with `spread` (per
    array, how far the first's gradient moves under a nudge of the inputs) a difference within it is
    accepted."""
    for name, a in first.items():
        b = other[name]
        scale = max(1.0, float(np.max(np.abs(a)))) if np.size(a) else 1.0
        tol = 1e-8 * np.abs(a) + 1e-10 * scale + (spread[name] if spread is not None else 0.0)
        if np.any(np.abs(np.asarray(b) - np.asarray(a)) > tol):
            return f"d S / d {name} differs between configurations"
    return None


#: how far (units in the last place) the float inputs are nudged to measure a gradient's conditioning
NUDGE_ULPS = 8


def _nudged(data: Mapping[str, Any], names: Sequence[str], sign: int) -> dict[str, Any]:
    factor = 1.0 + sign * NUDGE_ULPS * np.finfo(np.float64).eps
    return {k: (np.asarray(v) * factor if k in names else v) for k, v in data.items()}


def _spread(run, data: Mapping[str, Any], names: Sequence[str], grads: Mapping) -> dict[str, np.ndarray]:
    """Per gradient array, the largest change of `grads` when the inputs `names` are nudged up or down."""
    moved = [run(_nudged(data, names, sign)) for sign in (1, -1)]
    return {k: np.maximum(*(np.abs(np.asarray(m[k]) - np.asarray(g)) for m in moved)) for k, g in grads.items()}


def _rerun(run: Callable[[Mapping[str, Any]], tuple]) -> Callable[[Mapping[str, Any]], Mapping]:
    """The gradients of one configuration on other data: its program as built for the first data
    (`routes.gradient_function`), neither differentiated nor looked up again."""
    return lambda data: run(data)[1]


#: how many random splits of the direction measure forward mode's rounding (`_jvp_problem`)
SPLITS = 2


def _jvp_problem(program, wrt: Sequence[str], data: Mapping[str, Any], symbols: Mapping, grads: Mapping,
                 rerun=None) -> tuple[str, str] | None:
    """Forward mode against a checked gradient: d S . v must equal the gradient dotted with v. Answers
    (verdict, detail) or None.

    A difference is `unstable` rather than WRONG when it is within twice forward mode's own rounding, measured
    as how far the tangent is from linear (the tangent of v against those of a random split v = a + b: exact
    arithmetic gives equal) plus, with `rerun`, how far the gradient moves when the inputs are nudged by
    `NUDGE_ULPS`. That is a tangent cancelling at rounding level (`t - (t + u)` with `t` far larger than `u`),
    which reverse mode need not see; a wrong tangent rule is still linear, so it stays WRONG."""
    from gradflow.forward import value_and_jvp

    rng = np.random.default_rng(20261201)
    direction = {x: rng.standard_normal(np.shape(data[x])) for x in wrt}
    f = value_and_jvp(program, wrt=list(wrt), of=["S"])
    taken = f.arguments
    extra = {k: v for k, v in symbols.items() if k in taken and k not in data}
    given = {k: v for k, v in data.items() if k in taken}

    def tangent_of_S(tangents: Mapping[str, np.ndarray]) -> float:
        copies = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in given.items()}
        _, tangent = f(**copies, **extra, **{f"tan_{x}": tangents[x] for x in wrt})
        return float(np.asarray(tangent["S"]).reshape(-1)[0])

    def dotted(gradient: Mapping) -> float:
        return float(sum(np.sum(np.asarray(gradient[x], dtype=np.float64) * direction[x]) for x in wrt))

    got, want = tangent_of_S(direction), dotted(grads)
    scale = float(sum(np.sum(np.abs(np.asarray(grads[x], dtype=np.float64) * direction[x])) for x in wrt))
    tol = 1e-8 * scale + 1e-12
    if abs(got - want) <= tol:
        return None
    detail = f"jvp: the tangent of S is {got!r}, the gradient dotted with the direction {want!r}"
    nonlinear = 0.0
    for _ in range(SPLITS):
        part = {x: v * rng.uniform(0.0, 1.0, np.shape(v)) for x, v in direction.items()}
        rest = {x: direction[x] - part[x] for x in wrt}
        nonlinear = max(nonlinear, abs(got - tangent_of_S(part) - tangent_of_S(rest)))
    moved = 0.0
    if rerun is not None:
        floats = [k for k, v in data.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
        moved = max(abs(dotted(rerun(_nudged(data, floats, sign))) - want) for sign in (1, -1))
    if abs(got - want) <= tol + 2 * (nonlinear + moved):
        return "unstable", (f"{detail}: within rounding (the tangent of a split direction is {nonlinear:.3g} "
                            f"from linear; the gradient moves {moved:.3g} under a nudge)")
    return "WRONG", detail


def _hvp_problem(program, wrt: Sequence[str], data: Mapping[str, Any], symbols: Mapping, rerun) -> str | None:
    """Second order against the checked gradient: `hvp` along a random direction must equal central
    differences of the first configuration's gradient along it (steps h and 2h; an element where the two
    disagree, a kink of the gradient, is not compared, nor one whose gradient is so large that its rounding
    hides what the step changes)."""
    from gradflow.autodiff.forwarding import STORE_ALL
    from gradflow.forward import hvp

    rng = np.random.default_rng(20261202)
    direction = {x: rng.standard_normal(np.shape(data[x])) for x in wrt}
    f = hvp(program, wrt=list(wrt), of="S", forwarding=STORE_ALL.with_loop_bounds(**{"*": WHILE_BOUND}))
    taken = f.arguments
    given = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in data.items() if k in taken}
    extra = {k: v for k, v in symbols.items() if k in taken and k not in given}
    got = f(**given, **extra, **{f"tan_{x}": direction[x] for x in wrt})
    scale = max(1.0, max(float(np.max(np.abs(np.asarray(data[x], dtype=np.float64)), initial=0.0)) for x in wrt))

    def along(step: float) -> tuple[dict, dict]:
        """The differences, and how much rounding at the gradient's own magnitude blurs them."""
        moved = [rerun({k: (np.asarray(v) + sign * step * direction[k] if k in direction else v)
                        for k, v in data.items()}) for sign in (1, -1)]
        blur = {x: 4 * np.finfo(np.float64).eps * np.maximum(np.abs(moved[0][x]), np.abs(moved[1][x])) / (2 * step)
                for x in wrt}
        return {x: (np.asarray(moved[0][x]) - np.asarray(moved[1][x])) / (2 * step) for x in wrt}, blur

    h = 1e-5 * scale
    (near, blur), (far, _) = along(h), along(2 * h)
    for x in wrt:
        a, b, mine = near[x], far[x], np.asarray(got[x])
        size = max(1.0, float(np.max(np.abs(a), initial=0.0)))
        # compared where the gradient is smooth along v and its differences resolve (H v): a gradient of
        # 2e14 (S tripled thirty times) has a rounding step of 0.03, which a step of 1e-5 cannot move
        smooth = (np.abs(a - b) <= 1e-4 * size) & (blur[x] <= 1e-4 * size)
        if np.any(smooth & (np.abs(mine - a) > 1e-4 * size)):
            k = int(np.argmax(smooth & (np.abs(mine - a) > 1e-4 * size)))
            return (f"hvp: (H v) of {x} at flat index {k} is {mine.reshape(-1)[k]!r}, central differences of the "
                    f"gradient along v give {a.reshape(-1)[k]!r}")
    return None


def _higher_modes(spec: Mapping, program, wrt: Sequence[str], data: Mapping[str, Any], reference: Mapping,
                  rerun) -> Verdict | None:
    """Forward mode's and second order's verdict against the checked gradient, or None when both hold."""
    later = ((JVP, "jvp", lambda: _jvp_problem(program, wrt, data, spec["symbols"], reference, rerun)),
             (HVP, "hvp", lambda: _hvp_problem(program, wrt, data, spec["symbols"], rerun)))
    for config, key, problem_of in later:
        if not spec.get(key, True):
            continue
        try:
            found = problem_of()
        except Exception as exc:
            kind = _classify(exc)
            tail = "".join(traceback.format_exception(exc)[-3:])[-1500:] if kind == "crash" else ""
            return Verdict(kind, config, type(exc).__name__, f"{_first_line(exc)}\n{tail}".strip())
        if found is not None:
            kind, detail = ("WRONG", found) if isinstance(found, str) else found
            return Verdict(kind, config, detail=detail)
    return None


def check_program(spec: Mapping, folder: Path | None = None) -> Verdict:
    """Check one program (see the module docstring); never raises for a program's failure."""
    start = time.perf_counter()
    folder = Path(folder or tempfile.mkdtemp(prefix="gradflow-fuzz-"))
    try:
        twin = _load(spec["twin"], folder, "twin")
        module = _load(spec["dace"], folder, "dace")
    except Exception as exc:
        return Verdict("invalid", detail=f"the program does not load: {type(exc).__name__}: {_first_line(exc)}",
                       seconds=time.perf_counter() - start)
    try:
        # parsed once, as `gradflow.grad` parses a @dace.program (`as_sdfg`); every configuration and mode
        # differentiates its own copy (`Graph.of` copies an SDFG), so none parses the source again
        program = as_sdfg(module.program)
    except Exception as exc:
        cause = exc.__cause__ or exc  # DaCe's own error, which `as_sdfg` chains
        return Verdict("dace", error=type(cause).__name__, detail=f"DaCe cannot parse the program: "
                       f"{_first_line(cause)}", seconds=time.perf_counter() - start)
    data = make_data(spec, spec["seed"])
    try:
        want = run_twin(twin.program, data)
    except Exception as exc:
        return Verdict("invalid", detail=f"numpy twin: {type(exc).__name__}: {_first_line(exc)}",
                       seconds=time.perf_counter() - start)
    resolve = _resolver(twin, data)

    torch_configs = [c for c in spec["configs"] if c[0].startswith("torch")]
    with frozen.replaying(lambda: run_twin(twin.program, data)):  # the twin's stops held (`fuzz.frozen`)
        verdict = _check_configs({**spec, "configs": [c for c in spec["configs"] if c not in torch_configs]},
                                 program, twin, data, want, resolve, start)
    if verdict.kind != "ok" or not torch_configs:
        return verdict
    return _check_torch({**spec, "configs": torch_configs}, program, twin, data, start, verdict.skipped)


def _check_torch(spec: Mapping, program: dace.SDFG, twin, data: Mapping[str, Any], start: float,
                 skipped: int) -> Verdict:
    """The `torch` configurations (module doc): the output `S` starts at 0, so the twin is run from there;
    the function's inputs must be as they were after the call, whatever the program writes into them."""
    data = {**data, "S": np.zeros_like(data["S"])}
    try:
        want = run_twin(twin.program, data)
    except Exception:  # the twin fails from S = 0 (a log of S, say): nothing to compare the function with
        return Verdict("ok", seconds=time.perf_counter() - start, skipped=skipped)
    resolve = _resolver(twin, data)

    with frozen.replaying(lambda: run_twin(twin.program, data)):
        verdict = _check_configs(spec, program, twin, data, want, resolve, start, higher=False,
                                 kept={k: v for k, v in data.items() if k != "S"})
    return attrs.evolve(verdict, skipped=verdict.skipped + skipped)


def _check_configs(spec: Mapping, program: dace.SDFG, twin, data: Mapping[str, Any], want: Mapping, resolve,
                   start: float, higher: bool = True, kept: Mapping | None = None) -> Verdict:
    """`check_program` once the program loads and its twin runs: every configuration, then the higher modes
    (unless not `higher`). `kept`: arguments the configurations leave as they were (a torch function's
    inputs), whatever the program writes into them."""
    floats = [name for name, _, role, _ in spec["arguments"] if role in ("input", "output", "weight")]
    symbols = {k: v for k, v in spec["symbols"].items() if k not in data}
    fd = None

    reference = None
    rerun = None  # the first configuration on other data (set with `reference`)
    reference_wrt: list[str] = []
    skipped = 0
    for config in map(tuple, spec["configs"]):
        route, policy, optimize = config
        wrt = list(spec["wrt"]) + (["S"] if spec.get("reads_S") and route == "grad" else [])
        from gradflow.autodiff.budget import BudgetError
        from gradflow.verify.routes import gradient_function

        try:
            # trip counts passed as arguments are sizes to a budget (`count_arguments_to_symbols`), as at a call
            trips = {name: int(np.asarray(data[name]).reshape(-1)[0]) for name, _, role, _ in spec["arguments"]
                     if role == "trips" and name in data}
            forwarding = _forwarding(policy, program, wrt, {**spec["symbols"], **trips})
            try:
                run = gradient_function(program, tuple(wrt), "S", spec["symbols"], route=route,
                                        forwarding=forwarding, optimize=optimize)
                after, grads = run(data)
            except BudgetError as exc:  # 60% of what STORE_ALL keeps is too little: the least that works
                forwarding = attrs.evolve(forwarding, max_bytes=exc.minimum)
                run = gradient_function(program, tuple(wrt), "S", spec["symbols"], route=route,
                                        forwarding=forwarding, optimize=optimize)
                after, grads = run(data)
        except Exception as exc:  # a refusal or a crash: reported by class, the traceback's tail kept
            kind = _classify(exc)
            # a program DaCe itself miscompiles (its SDFG already wrong) is DaCe's, whatever gradflow made of it
            if kind in ("crash", "refused") and not _dace_forward_agrees(program, data, want, floats, symbols):
                return Verdict("dace", config, type(exc).__name__, f"DaCe's own forward fails or differs; gradflow "
                               f"{'refused' if kind == 'refused' else 'failed'}: {_first_line(exc)}",
                               time.perf_counter() - start)
            tail = "".join(traceback.format_exception(exc)[-3:])[-1500:] if kind == "crash" else ""
            return Verdict(kind, config, type(exc).__name__, f"{_first_line(exc)}\n{tail}".strip(),
                           time.perf_counter() - start)
        problem = _values_agree(after, {**want, **(kept or {})}, [n for n in floats if n in after])
        if problem is None:
            # a program is called again and again: a second call must not see the first (a torch function's
            # outputs zeroed anew, the persistent temporaries of a state handle not read before written)
            problem, within = _second_call_differs(run, data, [n for n in floats if n in data], after, grads)
            if within:
                return Verdict("unstable", config, detail=f"{problem}, within how far the gradient moves when the "
                               f"inputs are nudged by {NUDGE_ULPS} ulps", seconds=time.perf_counter() - start)
        if problem is not None:
            if not _dace_forward_agrees(program, data, want, floats, symbols):
                return Verdict("dace", config, detail=f"DaCe's own forward: {problem}",
                               seconds=time.perf_counter() - start)
            return Verdict("WRONG", config, detail=problem, seconds=time.perf_counter() - start)
        if fd is None:
            fd = central_differences(twin.program, data, wrt, float(want["S"][0]))
        if set(wrt) != set(fd[0]):
            fd = central_differences(twin.program, data, wrt, float(want["S"][0]))
        problem, skipped = _gradients_agree(grads, {k: fd[0][k] for k in grads}, fd[1], float(want["S"][0]),
                                            resolve)
        if problem is None and reference is not None:
            first = {k: v for k, v in reference.items() if k in grads}
            problem = _configs_agree(first, grads)
            if (problem is not None and rerun is not None
                    and _configs_agree(first, grads, _spread(rerun, data, floats, first)) is None):
                return Verdict("unstable", config, detail=f"{problem}, within how far the first configuration's "
                               f"gradient moves when the inputs are nudged by {NUDGE_ULPS} ulps",
                               seconds=time.perf_counter() - start, skipped=skipped)
        if problem is not None:
            return Verdict("WRONG", config, detail=problem, seconds=time.perf_counter() - start, skipped=skipped)
        if reference is None:
            reference, reference_wrt = grads, wrt
            rerun = _rerun(run)
    if reference is None or not higher:
        return Verdict("ok", seconds=time.perf_counter() - start, skipped=skipped)
    # forward mode and second order, each against the checked gradient
    later = _higher_modes(spec, program, reference_wrt, data, reference, rerun)
    if later is not None:
        return attrs.evolve(later, seconds=time.perf_counter() - start, skipped=skipped)
    return Verdict("ok", seconds=time.perf_counter() - start, skipped=skipped)
