"""The `gradflow` command: verify the rule tables, differentiate a program or model, draw an SDFG.

    gradflow verify [--table NAME ...] [--rule NAME ...] [--quick] [--jobs N]
    gradflow grad FILE.py:PROGRAM --wrt A,B [--of S] [--forwarding recompute_all] -o out.sdfg
    gradflow grad MODEL.onnx --wrt W1,W2 --of loss -o out.sdfg
    gradflow show X.sdfg -o X.svg|X.html
    gradflow fuzz --n 500 --seed 1 [--jobs 2] [--log run.jsonl] [--report run.md]
    gradflow fuzz --merge a.jsonl b.jsonl --report all.md

Bad input is reported as one `error:` line (exit code 2); `verify` exits 1 when a rule fails or is
untested. Steps that take seconds (compiling, lowering a model, each verification check) report progress
on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from gradflow.core import progress
from gradflow.core.errors import GradflowError, InvalidArgumentError

FORWARDING = ("store_all", "recompute_all")


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    from gradflow.verify import TABLES

    parser = argparse.ArgumentParser(prog="gradflow", description="Reverse-mode AD of DaCe SDFGs as pure graph "
                                     "rewriting.")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check every rule of every table against independent references")
    v.add_argument("--table", action="append", choices=TABLES, help="only this table (repeatable)")
    v.add_argument("--rule", action="append", help="only this rule (repeatable; a rule or entry name, an ONNX op)")
    v.add_argument("--quick", action="store_true", help="one sample per check, one ONNX case per op")
    v.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel worker processes")
    g = sub.add_parser("grad", help="differentiate a @dace.program / SDFG (FILE.py:NAME) or an ONNX model")
    g.add_argument("program", help="FILE.py:NAME (a @dace.program or dace.SDFG in FILE.py) or MODEL.onnx")
    g.add_argument("--wrt", required=True, help="comma-separated arrays (ONNX: input or initializer names)")
    g.add_argument("--of", help="the one-element output to differentiate (default: the only one)")
    g.add_argument("--forwarding", choices=FORWARDING, default="store_all")
    g.add_argument("-o", "--output", required=True, help="where to write the differentiated SDFG (.sdfg)")
    f = sub.add_parser("fuzz", help="check random programs against their numpy twins (values, gradients)")
    f.add_argument("--n", type=int, default=100, help="how many programs")
    f.add_argument("--seed", type=int, default=1, help="the seed of the programs and their data")
    f.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel worker processes")
    f.add_argument("--configs", choices=("two", "all", "default"), default="two",
                   help="configurations per program: the default and one more (two), all eighteen, or the default")
    f.add_argument("--timeout", type=float, default=600.0, help="seconds one program may take")
    f.add_argument("--shrink", type=int, default=60, help="checks spent shrinking each failure (0: none)")
    f.add_argument("--log", help="append one JSON line per program to this file")
    f.add_argument("--report", help="write the markdown report here (else print it)")
    f.add_argument("--merge", nargs="+", metavar="LOG", help="report on these logs instead of running")
    s = sub.add_parser("show", help="draw an SDFG (forward and backward) as .svg or DaCe's .html viewer")
    s.add_argument("sdfg", help="an .sdfg file (e.g. written by `gradflow grad`)")
    s.add_argument("-o", "--output", required=True, help="X.svg or X.html")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"dace(\.|$)")
    with progress.reporting(_err):
        try:
            return {"verify": _verify, "grad": _grad, "show": _show, "fuzz": _fuzz}[args.command](args)
        except GradflowError as exc:
            _err(f"error: {exc}")
            return 2


# ---- verify -----------------------------------------------------------------------------------------------

def _verify(args: argparse.Namespace) -> int:
    from gradflow import verify

    tables = tuple(args.table) if args.table else verify.TABLES

    def report(k: int, n: int, result) -> None:
        status = "ok" if result.ok else f"FAILED: {result.detail}"
        _err(f"[{k}/{n}] {result.item.kind} {result.item.name}: {status} ({result.seconds:.1f} s)")

    rows = verify.run(tables, quick=args.quick, jobs=args.jobs, rules=args.rule, progress=report)
    if not rows:
        raise InvalidArgumentError(f"no rule named {', '.join(args.rule or [])} in table(s) {', '.join(tables)}")
    print(verify.format_rows(rows))
    return 0 if all(r.status == verify.PASS for r in rows) else 1


# ---- grad -------------------------------------------------------------------------------------------------

def _names(text: str, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InvalidArgumentError(f"--{what} names no array")
    return names


def _load_program(spec: str) -> Any:
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise InvalidArgumentError(f"'{spec}' is not FILE.py:NAME", "e.g. gradflow grad model.py:energy --wrt X")
    file = Path(path)
    if not file.is_file():
        raise InvalidArgumentError(f"no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(f"gradflow_cli_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise InvalidArgumentError(f"{file} defines no '{name}'", f"names there: {', '.join(public)}")
    return getattr(module, name)


def _onnx_graph(path: str, wrt: list[str], of: str | None):
    """The lowered model's graph, with ONNX names in wrt/of mapped to its SDFG arrays."""
    import gradflow.onnx

    program = gradflow.onnx.load(path)
    sig = program.signature
    ports = {p.onnx_name: p.array for p in (*sig.inputs, *sig.outputs, *sig.weights)}
    arrays = set(program.graph.sdfg.arrays)

    def array(name: str, what: str) -> str:
        if name in ports:
            return ports[name]
        if name in arrays:
            return name
        raise InvalidArgumentError(f"--{what} names '{name}', which is neither an ONNX input, initializer or "
                                   f"output of the model nor an array of its SDFG",
                                   f"ONNX names: {', '.join(sorted(ports))}")

    return program.graph, [array(n, "wrt") for n in wrt], (array(of, "of") if of else None)


def _grad(args: argparse.Namespace) -> int:
    from gradflow.api import grad
    from gradflow.autodiff.forwarding import RECOMPUTE_ALL, STORE_ALL

    wrt = _names(args.wrt, "wrt")
    if args.program.endswith(".onnx"):
        program, wrt, of = _onnx_graph(args.program, wrt, args.of)
    else:
        program, of = _load_program(args.program), args.of
    forwarding = RECOMPUTE_ALL if args.forwarding == "recompute_all" else STORE_ALL
    with progress.step("differentiating"):
        sdfg = grad(program, wrt=wrt, of=of, forwarding=forwarding)
    out = Path(args.output)
    sdfg.save(str(out))
    grads = ", ".join(f"grad_{x}" for x in wrt)
    print(f"wrote {out}: SDFG '{sdfg.name}' computing the program and {grads}")
    return 0


# ---- fuzz -------------------------------------------------------------------------------------------------

def _fuzz(args: argparse.Namespace) -> int:
    """Exit 1 when a program is WRONG or crashed, else 0."""
    import gzip
    import json

    from gradflow.verify import fuzz

    if args.merge:
        records = []
        for log in args.merge:
            path = Path(log)
            if not path.is_file():
                raise InvalidArgumentError(f"no such log: {path}")
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            records += [json.loads(line) for line in text.splitlines() if line.strip()]
        command = "gradflow fuzz --merge " + " ".join(args.merge)
    else:
        if args.n < 1 or args.jobs < 1:
            raise InvalidArgumentError("--n and --jobs must be at least 1")
        log = open(args.log, "a") if args.log else None
        records = []

        def seen(result) -> None:
            entry = {**fuzz.record(result), "run": f"--n {args.n} --seed {args.seed} --configs {args.configs}"}
            records.append(entry)
            verdict = result.verdict
            _err(f"[{len(records)}/{args.n}] program {result.index}: {verdict.kind}"
                 + (f" ({verdict.error})" if verdict.error else "") + f" {verdict.seconds:.1f} s")
            if log is not None:
                log.write(json.dumps(entry) + "\n")
                log.flush()

        with progress.step(f"drawing {args.n} programs"):
            drawn = fuzz.draw(args.n, args.seed)
        fuzz.run(args.n, args.seed, args.jobs, configs=args.configs, timeout=args.timeout,
                 shrink_attempts=args.shrink, on_result=seen, programs_=drawn)
        command = f"gradflow fuzz --n {args.n} --seed {args.seed} --jobs {args.jobs} --configs {args.configs}"
    text = fuzz.report(records, command)
    if args.report:
        Path(args.report).write_text(text)
        _err(f"wrote {args.report}")
    else:
        print(text)
    return 1 if any(r["verdict"]["kind"] in ("WRONG", "crash") for r in records) else 0


# ---- show -------------------------------------------------------------------------------------------------

def _show(args: argparse.Namespace) -> int:
    import dace

    from gradflow.show import save_picture

    source = Path(args.sdfg)
    if not source.is_file():
        raise InvalidArgumentError(f"no such file: {source}")
    try:
        sdfg = dace.SDFG.from_file(str(source))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgumentError(f"{source} is not an SDFG file: {type(exc).__name__}: {exc}") from exc
    out = save_picture(sdfg, args.output)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
