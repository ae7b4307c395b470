"""What is benchmarked: every case of the loop corpus and of the NPBench corpus, plus the MLP of
`benchmarks/mlp.py`, each at a benchmark size, with the domains of its inputs.

A `Bench` is one kernel at one size. Sizes are chosen so that gradflow's forward takes at least 1 ms on one
thread (`python benchmarks/kernels.py --calibrate` measures that and proposes larger sizes where it does
not). The five headline kernels of the performance target are also benchmarked at the target's sizes
(`role="headline"`) where those differ from the benchmark size.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import numpy as np

from benchmarks.kernelbench import inputs as dom
from gradflow.verify.corpus import loops
from gradflow.verify.corpus.case import Case
from tests.corpus import npbench as nb

MAIN, HEADLINE, BOTH = "main", "headline", "both"


@dataclasses.dataclass(frozen=True)
class Bench:
    case: Case
    symbols: Mapping[str, int]
    #: domains of the arrays that differ from the default (zeros where the test input is zero, else normal)
    domains: Mapping[str, dom.Domain] = dataclasses.field(default_factory=dict)
    #: symbols the torch reference takes as keywords (time steps): it is the corpus's unbound function
    ref_symbols: tuple[str, ...] = ()
    #: symbols multiplied by `--calibrate` to grow the kernel (the others, such as time steps, stay)
    scale: tuple[str, ...] = ("N",)
    #: restore the inputs before every call (not timed): repeated in-place calls would blow the values up or
    #: change the branches the kernel takes
    refill: bool = False
    role: str = MAIN
    #: a change of the inputs after they are drawn (e.g. planting break points)
    adjust: Callable[[dict, np.random.Generator], None] | None = None
    note: str = ""

    @property
    def name(self) -> str:
        return self.case.name

    @property
    def key(self) -> str:
        """Unique per bench: the kernel name, plus the size for a headline-only entry."""
        if self.role != HEADLINE:
            return self.name
        return f"{self.name}@" + ",".join(f"{k}={v}" for k, v in self.symbols.items())

    def torch_fn(self) -> Callable[..., Any]:
        """The corpus's torch reference at this size (time-step counts bound to this bench's symbols)."""
        if not self.ref_symbols:
            return self.case.torch_fn
        module = loops if self.name.startswith("lp_") else nb
        raw = getattr(module, "_t_" + self.name[3:])
        return functools.partial(raw, **{s: int(self.symbols[s]) for s in self.ref_symbols})

    def inputs(self, sdfg, seed: int = 0) -> dict[str, np.ndarray]:
        """Every array of the case at this size (the case's argument names and order)."""
        rng = np.random.default_rng(seed)
        if dict(self.symbols) == dict(self.case.symbols):  # the case's own size: its own generator
            return self.case.make_inputs(rng)
        test = self.case.inputs(0)
        domains = {**dom.default_domains(test), **{k: v for k, v in self.domains.items() if k in test}}
        arrays = dom.build(dom.shapes_of(sdfg, self.symbols), domains, rng)
        if self.adjust is not None:
            self.adjust(arrays, rng)
        return arrays

    def resized(self, factor: float) -> "Bench":
        sym = {k: (max(2, int(round(v * factor))) if k in self.scale else v) for k, v in self.symbols.items()}
        return dataclasses.replace(self, symbols=sym)


# ------------------------------------------------------------------------------------------------ inputs


def _plant_breaks(arrays: dict, rng: np.random.Generator) -> None:
    """lp_break_search: in three rows of four, one element > 1 at a random position (the row stops there);
    the fourth row runs to its end. The corpus's test data plants two."""
    x = arrays["X"]
    rows, cols = x.shape
    for r in range(rows):
        if r % 4 != 3:
            x[r, rng.integers(cols)] = rng.uniform(1.2, 1.8)


def _near_constant_column(arrays: dict, rng: np.random.Generator) -> None:
    """nb_correlation: column 1 nearly constant, so its stddev <= 0.1 takes the program's masked branch."""
    data = arrays["data"]
    data[:, 1] = 2.0 + 0.01 * rng.normal(size=data.shape[0])


def _distinct_row_max(arrays: dict, rng: np.random.Generator) -> None:
    """lp_softmax: the corpus draws rows as permutations (a unique row maximum); normal draws of this size
    have one almost surely, this makes it certain."""
    x = arrays["X"]
    x[np.arange(x.shape[0]), np.argmax(x, axis=1)] += 0.5


def _lenet_weights() -> dict[str, dom.Domain]:
    return {k: dom.fan_in for k in ("conv1", "conv1bias", "conv2", "conv2bias", "fc1w", "fc1b", "fc2w", "fc2b",
                                    "fc3w", "fc3b")}


# --------------------------------------------------------------------------------------------- the table

LP = loops.CASES_BY_NAME
NB = nb.CASES_BY_NAME
U = dom.uniform


def _lp(name, symbols, **kw) -> Bench:
    return Bench(LP[name], symbols, **kw)


def _nb(name, symbols, **kw) -> Bench:
    return Bench(NB[name], symbols, **kw)


LOOP_BENCHES: tuple[Bench, ...] = (
    _lp("lp_jacobi_1d", {"N": 64000, "T": 50}, ref_symbols=("T",)),
    _lp("lp_jacobi_1d", {"N": 4000, "T": 50}, ref_symbols=("T",), role=HEADLINE),
    _lp("lp_jacobi_2d", {"N": 283, "T": 20}, ref_symbols=("T",)),
    _lp("lp_heat_3d", {"N": 45, "T": 10}, ref_symbols=("T",)),
    _lp("lp_seidel_2d", {"N": 400, "T": 4}, ref_symbols=("T",)),
    _lp("lp_go_fast", {"N": 1000}, role=BOTH),
    _lp("lp_softmax", {"N": 724, "M": 512}, adjust=_distinct_row_max, scale=("N",)),
    _lp("lp_softmax", {"N": 256, "M": 512}, adjust=_distinct_row_max, role=HEADLINE, scale=("N",)),
    _lp("lp_trisolv", {"N": 2000}, domains={"L": dom.lower_triangular}),
    _lp("lp_lu", {"N": 200}, domains={"A": dom.dominant}, refill=True),
    _lp("lp_durbin", {"N": 1500}, domains={"r": dom.autocorrelation}),
    _lp("lp_vadv_sweeps", {"N": 1000, "K": 200}, scale=("N",),
        domains={"a": U(-1.0, 1.0), "b": U(3.0, 4.0), "c": U(-1.0, 1.0)}),
    _lp("lp_newton_sqrt", {"N": 100000}, domains={"A": U(0.5, 9.0)}),
    _lp("lp_strided_step2", {"N": 200000}, refill=True),
    _lp("lp_strided_step2_odd", {"N": 200001}, refill=True),
    _lp("lp_strided_step3", {"N": 200000}, refill=True),
    _lp("lp_negative_step", {"N": 200000}, domains={"z": U(0.5, 0.9)}),
    _lp("lp_if_else", {"N": 200000}, domains={"X": dom.signed_uniform(0.2, 1.5)}),
    _lp("lp_conditional_accumulate", {"N": 500000}, domains={"X": U(0.8, 1.6)}),
    _lp("lp_triangular", {"N": 1200}, refill=True),
    _lp("lp_triangular", {"N": 120}, refill=True, role=HEADLINE),
    _lp("lp_recurrence", {"N": 200000}),
    _lp("lp_whole_array_update", {"N": 20000, "T": 10}, ref_symbols=("T",), domains={"W": U(0.5, 1.5)}),
    _lp("lp_map_of_loops", {"N": 1000, "M": 200}),
    _lp("lp_map_with_branch", {"N": 200000}, domains={"X": dom.signed_uniform(0.2, 1.5)}),
    _lp("lp_break_search", {"M": 500, "N": 1000}, domains={"X": U(-0.9, 0.9)}, adjust=_plant_breaks,
        scale=("M",)),
    _lp("lp_growing_prefix", {"N": 2000}),
    _lp("lp_map_inplace_rows", {"N": 500, "M": 400}),
    _lp("lp_map_of_while", {"N": 50000}, domains={"X": U(0.5, 9.0)}),
)

NPBENCH_BENCHES: tuple[Bench, ...] = (
    _nb("nb_atax", {"M": 1414, "N": 1697}, scale=("M", "N")),
    _nb("nb_bicg", {"N": 2400, "M": 2000}, scale=("M", "N")),
    _nb("nb_gemm", {"NI": 362, "NJ": 362, "NK": 362}, scale=("NI", "NJ", "NK"), refill=True),
    _nb("nb_gemver", {"N": 1414}),
    _nb("nb_gesummv", {"N": 1414}),
    _nb("nb_k2mm", {"NI": 283, "NK": 311, "NJ": 339, "NL": 255}, scale=("NI", "NK", "NJ", "NL"), refill=True),
    _nb("nb_k3mm", {"NI": 200, "NK": 220, "NJ": 240, "NM": 180, "NL": 200}, scale=("NI", "NK", "NJ", "NM", "NL")),
    _nb("nb_mvt", {"N": 2000}),
    _nb("nb_doitgen", {"NR": 64, "NQ": 64, "NP": 128}, scale=("NR", "NQ", "NP"), refill=True),
    _nb("nb_go_fast", {"N": 1414}),
    _nb("nb_cholesky", {"N": 400}, domains={"A": dom.spd}, refill=True),
    _nb("nb_lu", {"N": 200}, domains={"A": dom.dominant}, refill=True),
    _nb("nb_ludcmp", {"N": 200}, domains={"A": dom.dominant}, refill=True),
    _nb("nb_trisolv", {"N": 2000}, domains={"L": dom.lower_triangular}),
    _nb("nb_durbin", {"N": 2121}, domains={"r": dom.autocorrelation}),
    _nb("nb_gramschmidt", {"M": 240, "N": 200}, scale=("M", "N")),
    _nb("nb_symm", {"M": 200, "N": 240}, scale=("M", "N"), refill=True),
    _nb("nb_syr2k", {"N": 240, "M": 200}, scale=("M", "N"), refill=True),
    _nb("nb_syrk", {"N": 240, "M": 200}, scale=("M", "N"), refill=True),
    _nb("nb_trmm", {"M": 200, "N": 240}, scale=("M", "N"), refill=True),
    _nb("nb_covariance", {"N": 500, "M": 200}, scale=("M", "N")),
    _nb("nb_correlation", {"N": 500, "M": 200}, scale=("M", "N"), adjust=_near_constant_column, refill=True),
    _nb("nb_jacobi_1d", {"N": 45255, "T": 50}, ref_symbols=("T",)),
    _nb("nb_jacobi_2d", {"N": 283, "T": 20}, ref_symbols=("T",)),
    _nb("nb_heat_3d", {"N": 45, "T": 10}, ref_symbols=("T",)),
    _nb("nb_seidel_2d", {"N": 400, "T": 4}, ref_symbols=("T",)),
    _nb("nb_fdtd_2d", {"NX": 283, "NY": 311, "T": 20}, scale=("NX", "NY")),
    _nb("nb_adi", {"N": 200, "T": 4}, ref_symbols=("T",), domains={"u": U(0.0, 1.0)}),
    _nb("nb_deriche", {"W": 424, "H": 354}, scale=("W", "H")),
    _nb("nb_cavity_flow", {"NY": 200, "NX": 200, "T": 5, "NIT": 10}, ref_symbols=("T", "NIT"), scale=("NX", "NY"),
        domains={k: U(-0.5, 0.5) for k in ("u", "v", "p")}),
    _nb("nb_hdiff", {"I": 91, "J": 91, "K": 40}, scale=("I", "J"), domains={"coeff": U(0.0, 1.0)}),
    _nb("nb_vadv", {"I": 64, "J": 64, "K": 40}, scale=("I", "J"),
        domains={k: U(0.0, 1.0) for k in ("utens_stage", "u_stage", "wcon", "u_pos", "utens")}),
    _nb("nb_conv2d_bias", {"N": 8, "H": 64, "W": 64, "C_in": 3, "C_out": 16, "K": 3}, scale=("H", "W")),
    _nb("nb_lenet", {"N": 16, "H": 28, "W": 28, "CB": 16 * 4 * 4}, scale=("N",), domains=_lenet_weights()),
    _nb("nb_mlp", {"N": 91, "C_in": 362, "S0": 362, "S1": 362, "S2": 64}, scale=("N", "C_in", "S0", "S1")),
    _nb("nb_resnet", {"N": 8, "H": 32, "W": 32, "C1": 16, "C2": 8}, scale=("H", "W")),
    _nb("nb_softmax", {"N": 4, "H": 8, "SM": 128}, scale=("N",)),
)


def _mlp_bench() -> Bench:
    """The float32 MLP of `benchmarks/mlp.py` (fixed sizes 64x784-512-512-10, no symbols) as a case."""
    from benchmarks import mlp

    def torch_fn(x, W1, b1, W2, b2, W3, b3, T, **_):
        import torch

        h1 = torch.relu(x @ W1 + b1)
        h2 = torch.relu(h1 @ W2 + b2)
        d = h2 @ W3 + b3 - T
        return (d * d).sum()

    def make_inputs(rng):
        data = mlp._data(int(rng.integers(1 << 30)))  # noqa: SLF001 - the benchmark's own data
        return {**data, "S": np.zeros(1, np.float32)}

    case = Case("mlp", mlp.mlp, torch_fn, mlp.PARAMS, "S", make_inputs, {},
                "3-layer MLP 64x784-512-512-10, float32 (benchmarks/mlp.py)")
    return Bench(case, {}, scale=(), role=BOTH, note="float32; gradients checked at rtol 1e-3")


def benches() -> tuple[Bench, ...]:
    return LOOP_BENCHES + NPBENCH_BENCHES + (_mlp_bench(),)


def by_key() -> dict[str, Bench]:
    return {b.key: b for b in benches()}
