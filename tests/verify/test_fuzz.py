"""`gradflow fuzz`: a bounded, fixed-seed sample of the grammar checked in-process (hypothesis shrinks a
failure here natively), and the machinery the long runs rely on: twins that mean what the DaCe programs
mean, worker processes that survive a crash, shrinking, the report and the command."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, seed, settings

from gradflow.verify.fuzz import campaign, programs
from gradflow.verify.fuzz.check import DEFAULT, Verdict, check_program, make_data, run_twin, spec_of, twin_source
from gradflow.verify.fuzz.program import Argument, Assign, At, For, Num, Op, Program, Read, Span, While
from gradflow.verify.fuzz.shrink import reductions, shrink, size

SOUND = ("ok", "refused", "dace", "invalid")


@seed(20261127)
@settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(program=programs())
def test_sampled_programs_are_never_wrong(program) -> None:
    verdict = check_program(spec_of(program, (DEFAULT, ("vjp", "recompute_all", False)), seed=3))
    assert verdict.kind in SOUND, f"{verdict.kind} {verdict.config}: {verdict.error} {verdict.detail}\n" \
                                  f"{program.render(True)}"


def _program() -> Program:
    """x0[1:] = x0[:N-1] * x0[1:] inside a loop of step 2: an in-place update through overlapping slices."""
    body = (For("i1", At(None, 0), At("N", 0), 2,
                (Assign(Read("x0", (At("i1", 0),)), "+=", Op("*", Read("x0", (At("N", -1),)), Num(0.5))),)),
            Assign(Read("x0", (Span(1, 0, 1, "N"),)), "=", Op("*", Read("x0", (Span(0, 1, 1, "N"),)),
                                                              Read("x0", (Span(1, 0, 1, "N"),)))))
    args = (Argument("x0", ("N",), "input"), Argument("w0", ("N",), "weight"), Argument("S", (1,), "output"))
    return Program((("N", 6), ("M", 5)), args, body, (("x0", "w0"),))


def test_the_twin_computes_what_the_program_text_says() -> None:
    program = _program()
    spec = spec_of(program)
    data = make_data(spec, 0)
    namespace: dict = {}
    exec(compile(program.render(False), "<twin>", "exec"), namespace)
    got = run_twin(namespace["program"], data)
    x = data["x0"].copy()
    for i in range(0, 6, 2):
        x[i] += x[5] * 0.5
    x[1:] = x[:5] * x[1:]
    np.testing.assert_allclose(got["x0"], x, rtol=1e-15)
    np.testing.assert_allclose(got["S"][0], data["S"][0] + np.sum(x * data["w0"]), rtol=1e-14)


def test_twin_source_strips_only_what_dace_adds() -> None:
    source = _program().render(True)
    assert twin_source(source, {"N": 6, "M": 5}).replace("\n", "") == \
        __import__("ast").unparse(__import__("ast").parse(_program().render(False))).replace("\n", "")


def test_a_checked_program_agrees_with_its_twin(monkeypatch) -> None:
    """... and is parsed once and differentiated once per configuration: the higher modes' checks run the
    first configuration's program again on stepped data without differentiating it again."""
    from dace.frontend.python.parser import DaceProgram

    from gradflow.verify import routes

    parses, built = [], []
    parse, build = DaceProgram.to_sdfg, routes.gradient_function
    monkeypatch.setattr(DaceProgram, "to_sdfg", lambda self, *a, **k: parses.append(1) or parse(self, *a, **k))
    monkeypatch.setattr(routes, "gradient_function", lambda *a, **k: built.append(k["route"]) or build(*a, **k))
    verdict = check_program(spec_of(_program(), (DEFAULT, ("vjp", "store_all", False)), seed=1))
    assert verdict.kind == "ok", verdict.detail
    assert len(parses) == 1 and built == ["grad", "vjp"], (parses, built)


def test_the_torch_route_is_checked_from_s_zero_and_can_fail(monkeypatch) -> None:
    """Route `torch`: a `gradflow.torch.function` of the program, whose output `S` the function allocates
    (zeroed: `_program` accumulates into it), checked against the twin run from `S = 0`; a function that
    returned another value or gradient, changed an input the program writes (x0), or returned something
    else at its second call, would be WRONG under that configuration; a second call that only rounds
    otherwise (a sum's order following its temporary's alignment, fuzz seed 4120) is not."""
    from gradflow.verify import routes

    torch_config = ("torch", "budget", True)
    spec = spec_of(_program(), (DEFAULT, torch_config), seed=2)
    assert check_program(spec).kind == "ok"
    assert check_program(spec_of(_program(), (DEFAULT, ("torch_cpp", "store_all", True)), seed=2)).kind == "ok"
    assert check_program(spec_of(_program(), (DEFAULT, ("value_and_grad", "budget", False)), seed=2)).kind == "ok"
    route = routes._torch_route
    for part, name in ((0, "S"), (1, "x0"), (0, "x0")):  # the value of S, the gradient, the input x0
        def skewed(*args, part=part, name=name, **kwargs):
            run = route(*args, **kwargs)

            def skewed_run(arrays):
                result = list(run(arrays))
                result[part] = {k: v + 1e-3 if k == name else v for k, v in result[part].items()}
                return tuple(result)
            return skewed_run
        monkeypatch.setattr(routes, "_torch_route", skewed)
        verdict = check_program(spec)
        assert (verdict.kind, verdict.config) == ("WRONG", torch_config), verdict

    for drift, kind in ((1e-3, "WRONG"), (4e-16, "ok")):  # from the second call on: off, or rounded otherwise
        def drifting(*args, drift=drift, **kwargs):
            run, calls = route(*args, **kwargs), []

            def drifting_run(arrays):
                after, grads = run(arrays)
                calls.append(1)
                return after, {k: v * (1 + drift * (len(calls) > 1)) + drift * (len(calls) > 1)
                               for k, v in grads.items()}
            return drifting_run
        monkeypatch.setattr(routes, "_torch_route", drifting)
        verdict = check_program(spec)
        assert verdict.kind == kind, verdict
        assert kind == "ok" or (verdict.config == torch_config and "second call" in verdict.detail), verdict


def test_shrinking_keeps_what_fails_and_drops_the_rest() -> None:
    program = _program()
    assert all(size(r) <= size(program) for r in reductions(program))
    # "fails" while the program still multiplies overlapping slices of x0
    small = shrink(program, lambda p: "x0[:N - 1] * x0[1:]" in p.render(True), attempts=50)
    assert "x0[:N - 1] * x0[1:]" in small.render(True)
    assert "for i1" not in small.render(True)


def test_a_worker_that_dies_is_a_crash_and_the_next_program_runs(tmp_path: Path) -> None:
    worker = campaign.Worker(tmp_path, 0)
    try:
        spec = spec_of(_program())
        dying = dict(spec, twin="import os\nos.abort()\n")
        verdict = worker.check(dying, timeout=300)
        assert (verdict.kind, verdict.error) == ("crash", "ProcessDied")
        assert "SIGABRT" in verdict.detail
        assert worker.check(spec, timeout=300).kind == "ok"
    finally:
        worker.stop()


def test_a_program_that_times_out_is_reported_unshrunk(monkeypatch) -> None:
    """Shrinking re-checks smaller programs, each of which could hang for the whole timeout again: a timeout
    is reported as drawn, after one check, and a crash of another kind is still shrunk."""
    checks: list[dict] = []

    def hangs(self, spec: dict, timeout: float) -> Verdict:
        checks.append(spec)
        return Verdict("crash", error=campaign.TIMEOUT, detail=f"no verdict within {timeout:.0f} s")

    monkeypatch.setattr(campaign.Worker, "check", hangs)
    (result,) = campaign.run(1, seed=3, programs_=[_program()], shrink_attempts=60)
    assert (result.verdict.error, result.shrunk, len(checks)) == (campaign.TIMEOUT, None, 1)

    def dies(self, spec: dict, timeout: float) -> Verdict:
        checks.append(spec)
        return Verdict("crash", error="ProcessDied", detail="the worker process died: signal 6 (SIGABRT)")

    checks.clear()
    monkeypatch.setattr(campaign.Worker, "check", dies)
    (result,) = campaign.run(1, seed=3, programs_=[_program()], shrink_attempts=5)
    assert result.shrunk is not None and len(checks) > 1


def test_the_chain_production_writes_chains_tile_element_chains_tiles(tmp_path: Path) -> None:
    """The shifted slice chains are drawn for `tile_element_chains`: with the fuzzer's small blocks
    (`GRADFLOW_TILE_BLOCK`'s setting) some of them are tiled, in the forward program a user compiles (6 of
    these 40 programs; 0 of the 40 the same seed draws without the production)."""
    from gradflow.api import optimized
    from gradflow.analysis.versions import PREFIX
    from gradflow.core.errors import InvalidArgumentError
    from gradflow.core.graph import Graph
    from gradflow.core.passes import Pipeline
    from gradflow.optimize import OPTIMIZE
    from gradflow.optimize.tiled_chains import TileElementChains
    from gradflow.verify.fuzz.check import _load

    small = Pipeline(tuple(TileElementChains(block=2, min_blocks=1) if s.name == "tile_element_chains" else s
                           for s in OPTIMIZE.steps))
    drawn = campaign.draw(40, 2, features=("chain",))
    tiled = 0
    for k, program in enumerate(drawn):
        module = _load(program.render(True), tmp_path, f"chain{k}")
        try:
            built = optimized(Graph.of(module.program), small)
        except InvalidArgumentError:  # DaCe cannot parse it (the fuzzer's `dace` verdict)
            continue
        tiled += any(b.label.startswith(PREFIX) for b in built.sdfg.all_control_flow_blocks())
    assert tiled >= 4, f"{tiled} of {len(drawn)} drawn programs have a tiled chain"


def test_a_while_counter_always_grows() -> None:
    """The increment `0.5 + e ** 2` must stay positive for a negative literal e (`-1.25 ** 2` is -1.5625 in
    Python: the loop never ended, and the check hung until its timeout)."""
    tail = While("c", 3.0, Num(-1.25), ()).lines()[-1]
    increment = tail.split("+=", 1)[1]
    assert eval(increment) == 0.5 + 1.25 ** 2  # noqa: S307 (a literal expression the grammar rendered)


def test_report_counts_verdicts_and_refusal_classes() -> None:
    program = _program()
    records = [campaign.record(campaign.Result(k, program, v, (DEFAULT,))) for k, v in enumerate([
        Verdict("ok", seconds=1.0), Verdict("refused", DEFAULT, "NotDifferentiableError", "loop 'for_7' has no bound"),
        Verdict("refused", DEFAULT, "NotDifferentiableError", "loop 'for_9' has no bound"),
        Verdict("WRONG", DEFAULT, detail="d S / d x0[(2,)] = 1.0, central differences 2.0")])]
    for k, r in enumerate(records):
        r["run"] = "--seed 1" if k < 2 else "--seed 2"
    text = campaign.report(records, "gradflow fuzz --n 4")
    assert "| ok | 1 | 25.00% |" in text and "| WRONG | 1 | 25.00% |" in text
    # per run: ok, WRONG, unstable, refused, crash, dace, invalid
    assert "| `--seed 1` | 2 | 1 | 0 | 0 | 1 | 0 | 0 | 0 |" in text
    assert "| `--seed 2` | 2 | 0 | 1 | 0 | 1 | 0 | 0 | 0 |" in text
    assert "| NotDifferentiableError: loop _ has no bound | 2 |" in text  # labels masked: one class
    assert "x0[:N - 1] * x0[1:]" in text  # the failing program is printed


def test_one_limit_met_in_many_programs_is_one_refusal_class() -> None:
    """The generated names in a message (a loop's variable, DaCe's label, an array, a CSE temporary) vary
    from program to program; the class of the refusal must not (it counted 30 classes of one limit)."""
    def refused(detail: str) -> Verdict:
        return Verdict("refused", DEFAULT, "NotDifferentiableError", detail)

    loops = {campaign.refusal_class(refused(f"the loop over {v} (line {n}, DaCe's label '{label}') has no bound"))
             for v, n, label in [("i1", 12, "for_10"), ("i5", 27, "gfl1_for_24"), ("i10", 43, "for_36")]}
    assert loops == {"NotDifferentiableError: the loop over _ (line _, DaCe's label _) has no bound"}
    copies = {campaign.refusal_class(refused(f"copy {a}[1:N] -> {a}[2:N] in state 'assign_{k}'"))
              for a, k in [("x0", 3), ("x1", 9)]}
    assert len(copies) == 1
    # what tells limits apart stays: a copy of a row is not a copy of a column
    assert campaign.refusal_class(refused("copy x0[1:N, 2] -> x0[2:N, 2]")) not in copies


def test_the_command_runs_a_campaign_and_writes_its_report(tmp_path: Path) -> None:
    report, log = tmp_path / "r.md", tmp_path / "r.jsonl"
    done = subprocess.run([sys.executable, "-m", "gradflow.cli", "fuzz", "--n", "2", "--seed", "5", "--jobs", "1",
                           "--log", str(log), "--report", str(report)], capture_output=True, text=True, timeout=1200)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2 and all(r["verdict"]["kind"] for r in lines)
    assert "Programs: 2" in report.read_text()
    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))  # long runs' logs are kept compressed
    merged = subprocess.run([sys.executable, "-m", "gradflow.cli", "fuzz", "--merge", str(log), str(packed)],
                            capture_output=True, text=True, timeout=300)
    assert "Programs: 4" in merged.stdout


def test_bad_options_are_one_error_line() -> None:
    done = subprocess.run([sys.executable, "-m", "gradflow.cli", "fuzz", "--merge", "/nonexistent.jsonl"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "error: no such log" in done.stderr


def test_configurations_may_differ_only_within_the_measured_spread() -> None:
    """A difference between configurations is accepted only as far as the first one's own gradient moves
    under a nudge of the inputs (`unstable`); beyond that, or without a spread, it is reported."""
    from gradflow.verify.fuzz.check import _configs_agree, _nudged

    first = {"x": np.array([1.0e11, 2.0])}
    other = {"x": np.array([1.001e11, 2.0])}
    assert _configs_agree(first, other) == "d S / d x differs between configurations"
    assert _configs_agree(first, other, {"x": np.array([2.0e8, 0.0])}) is None
    assert _configs_agree(first, other, {"x": np.array([2.0e7, 0.0])}) is not None
    assert _configs_agree(first, {"x": np.array([1.0e11, 50.0])}, {"x": np.array([2.0e8, 0.0])}) is not None
    nudged = _nudged({"x": np.array([1.0, -3.0]), "idx": np.array([2])}, ["x"], 1)
    assert np.all(nudged["x"] != np.array([1.0, -3.0])) and np.all(np.abs(nudged["x"] / [1.0, -3.0] - 1) < 1e-14)
    assert nudged["idx"].tolist() == [2]


def _loaded_program():
    """(spec, data, the DaCe program module) of `_program()`, as a campaign's worker loads it."""
    import importlib.util
    import tempfile

    spec = spec_of(_program(), (DEFAULT,), seed=1)
    data = make_data(spec, spec["seed"])
    path = Path(tempfile.mkdtemp()) / "fuzz_loaded_program.py"
    path.write_text(spec["dace"])
    module_spec = importlib.util.spec_from_file_location("fuzz_loaded_program", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return spec, data, module


def test_forward_mode_is_checked_against_the_checked_gradient() -> None:
    """`_jvp_problem` accepts the gradient's dot product with the direction and flags any other."""
    from gradflow.verify.fuzz.check import _jvp_problem

    spec, data, module = _loaded_program()
    from gradflow.verify.routes import gradient

    wrt = tuple(spec["wrt"]) + (("S",) if spec.get("reads_S") else ())
    _, grads = gradient(module.program, wrt, "S", data, spec["symbols"])
    assert _jvp_problem(module.program, wrt, data, spec["symbols"], grads) is None
    wrong = {k: v * 1.01 for k, v in grads.items()}

    def rerun(d):
        return {k: v * 1.01 for k, v in gradient(module.program, wrt, "S", d, spec["symbols"])[1].items()}
    # a wrong tangent is still linear and moves by rounding only under a nudge: WRONG, not unstable
    for measured in (None, rerun):
        verdict, detail = _jvp_problem(module.program, wrt, data, spec["symbols"], wrong, measured) or ("", "")
        assert verdict == "WRONG" and "jvp" in detail


def _absorbing_twin(big: float):
    """A twin whose S passes through `(S + x) - S` at |S| = `big`: d S / d x[0] is 1 + w[0] in real arithmetic,
    but a step of 1e-5 in x does not move S when `big` is 1e13."""
    def program(x, w, S):
        S[0] = big
        S[0] = (S[0] + x[0]) - S[0]
        S[0] += np.sum(x * w)
    return program


def test_a_difference_rounding_hides_is_taken_again_at_a_step_it_can_see() -> None:
    from gradflow.verify.fuzz.check import _gradients_agree, central_differences, magnitude, resolved_difference

    data = {"x": np.array([0.3, -0.2]), "w": np.array([0.5, 2.0]), "S": np.zeros(1)}
    right = {"x": np.array([1.5, 2.0])}
    for big, hidden in ((1e13, True), (10.0, False)):
        twin = _absorbing_twin(big)
        fd1, fd2 = central_differences(twin, data, ["x"])
        assert bool(abs(fd1["x"][0] - 0.5) < 1e-6) is hidden  # at 1e13 a step of 1e-5 is below S's resolution
        largest = magnitude(twin, data)
        assert largest == big

        def resolve(name, flat, tol, twin=twin, largest=largest):
            return resolved_difference(twin, data, name, flat, tol, largest)
        assert _gradients_agree(right, fd1, fd2, 0.0, resolve)[0] is None
        # a wrong gradient is still wrong at the larger step
        assert "d S / d x[1] = 2.1" in (_gradients_agree({"x": np.array([1.5, 2.1])}, fd1, fd2, 0.0, resolve)[0] or "")
        if hidden:
            assert "central differences 0.5" in (_gradients_agree(right, fd1, fd2, 0.0)[0] or "")
        else:
            assert _gradients_agree(right, fd1, fd2, 0.0)[0] is None


def test_an_element_no_step_resolves_is_skipped_not_compared() -> None:
    """(S + x^3) - S at |S| = 1e13: the step that rounding allows is far beyond where x^3 is linear."""
    from gradflow.verify.fuzz.check import _gradients_agree, central_differences, magnitude, resolved_difference

    def twin(x, w, S):
        S[0] = 1e13
        S[0] = (S[0] + x[0] ** 3) - S[0]
        S[0] += np.sum(x * w)
    data = {"x": np.array([0.3, -0.2]), "w": np.array([0.5, 2.0]), "S": np.zeros(1)}
    fd1, fd2 = central_differences(twin, data, ["x"])
    largest = magnitude(twin, data)
    assert resolved_difference(twin, data, "x", 0, 1e-6, largest) is None
    problem, skipped = _gradients_agree({"x": np.array([0.5 + 3 * 0.09, 2.0])}, fd1, fd2, 0.0,
                                        lambda n, k, t: resolved_difference(twin, data, n, k, t, largest))
    assert problem is None and skipped == 1


def test_second_order_is_checked_against_differences_of_the_checked_gradient() -> None:
    """`_hvp_problem` accepts central differences of the gradient along the direction and flags a gradient
    whose differences differ (one scaled by how far its point moved)."""
    from gradflow.verify.fuzz.check import _hvp_problem

    spec, data, module = _loaded_program()
    from gradflow.verify.routes import gradient

    wrt = tuple(spec["wrt"]) + (("S",) if spec.get("reads_S") else ())

    def rerun(d):
        return gradient(module.program, wrt, "S", d, spec["symbols"])[1]

    def bent(d):  # a gradient that is wrong away from the checked point: its differences are not H v
        moved = sum(float(np.sum(np.asarray(d[x]) - np.asarray(data[x]))) for x in wrt)
        return {k: np.asarray(v) * (1.0 + 50.0 * moved) for k, v in rerun(d).items()}

    assert _hvp_problem(module.program, wrt, data, spec["symbols"], rerun) is None
    assert "hvp" in (_hvp_problem(module.program, wrt, data, spec["symbols"], bent) or "")


def _stopped_program(scale: float) -> Program:
    """An accumulation through stopped values in a loop and a stopped slice product:
    x0[i1] += sin(x0[i1]) * stop(x0[N-1] * x0[i1]) for every i1, then x0[1:] = x0[:N-1] * stop(tanh(x0[1:]) * scale)."""
    from gradflow.verify.fuzz.program import Call, Stop

    body = (For("i1", At(None, 0), At("N", 0), 1,
                (Assign(Read("x0", (At("i1", 0),)), "+=",
                        Op("*", Call("np.sin", Read("x0", (At("i1", 0),))),
                           Stop(Op("*", Read("x0", (At("N", -1),)), Read("x0", (At("i1", 0),)))))),)),
            Assign(Read("x0", (Span(1, 0, 1, "N"),)), "=",
                   Op("*", Read("x0", (Span(0, 1, 1, "N"),)),
                      Stop(Op("*", Call("np.tanh", Read("x0", (Span(1, 0, 1, "N"),))), Num(scale))))))
    args = (Argument("x0", ("N",), "input"), Argument("w0", ("N",), "weight"), Argument("S", (1,), "output"))
    return Program((("N", 6), ("M", 5)), args, body, (("x0", "w0"),))


def test_stopped_values_are_held_by_the_twins_differences() -> None:
    """The twin's central differences hold each stopped value where the unperturbed run had it, so they
    are the gradient a stop means: the program with stops is ok under both policies and forward mode (not
    second order: `fuzz.frozen`), and its differences differ from those through the stops."""
    from gradflow.verify.fuzz import frozen
    from gradflow.verify.fuzz.check import central_differences

    program = _stopped_program(0.5)
    spec = spec_of(program, (DEFAULT, ("vjp", "recompute_all", False)), seed=4)
    assert "from gradflow import stop_gradient" in spec["dace"] and spec["hvp"] is False
    verdict = check_program(spec)
    assert verdict.kind == "ok", f"{verdict.config}: {verdict.error} {verdict.detail}"
    namespace: dict = {}
    exec(compile(spec["twin"], "<twin>", "exec"), namespace)
    data = make_data(spec, spec["seed"])
    through = central_differences(namespace["program"], data, ["x0"])[0]["x0"]
    with frozen.replaying(lambda: run_twin(namespace["program"], data)):
        held = central_differences(namespace["program"], data, ["x0"])[0]["x0"]
    assert np.max(np.abs(held - through)) > 1e-2


def test_a_stop_differentiated_through_is_wrong(monkeypatch) -> None:
    """Were the stop's derivative 1 (the value passed straight through, as ONNX exports a detach), the
    checker says WRONG."""
    import sympy

    from gradflow.core.stop_gradient import StopGradient

    monkeypatch.setattr(StopGradient, "fdiff", lambda self, argindex=1: sympy.Integer(1))
    verdict = check_program(spec_of(_stopped_program(0.75), (DEFAULT,), seed=4))
    assert verdict.kind == "WRONG" and "central differences" in verdict.detail


def test_a_kink_at_the_point_is_told_from_curvature() -> None:
    """Central differences read the mean of the two slopes at a kink whatever the step; `_kink` sees the
    jump (the same at h and 2h), and not the curvature of a smooth function (a gap that grows with h)."""
    from gradflow.verify.fuzz.check import _kink

    def probe(f, x: float) -> bool:
        h = 1e-5 * max(1.0, abs(x))
        return _kink(f(x), (f(x + h), f(x - h)), (f(x + 2 * h), f(x - 2 * h)), h)

    assert probe(abs, 0.0)
    assert probe(lambda v: max(3.0 * v, -0.5 * v) + v * v, 0.0)
    assert not probe(abs, 0.3)
    assert not probe(lambda v: 1e6 * v * v, 0.0)  # curvature 2e6: a gap of 20 at h, 40 at 2h
    assert not probe(lambda v: np.exp(v) * 1e3, 2.0)
