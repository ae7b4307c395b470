"""Names of arrays and symbols that the generated C++ cannot carry.

DaCe emits every array and symbol as a C++ variable of the same name. A name that is a C++ keyword
(`new`, `int`, ...), a macro of the standard headers (`NULL`, `NAN`, ...), DaCe's own state pointer
(`__state`), or a function that a tasklet calls (`exp` in a program computing `np.exp`) makes the
build fail inside the compiler, with a message about the generated file. `check_identifiers` finds these
names first and says which array or symbol to rename. Arguments cannot be renamed behind the user's back
(they are passed by name), so gradflow rejects them instead.
"""

from __future__ import annotations

import ast
import copy
import re
from typing import Iterator

import dace
from dace import dtypes
from dace.sdfg import nodes as nd

from gradflow.core.errors import InvalidArgumentError

CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq restrict
""".split())

#: macros of the C/C++ headers the generated code includes, and names DaCe gives its own variables
RESERVED = frozenset("""
NULL errno NAN INFINITY HUGE_VAL HUGE_VALF HUGE_VALL EOF RAND_MAX EXIT_SUCCESS EXIT_FAILURE
M_E M_LOG2E M_LOG10E M_LN2 M_LN10 M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI M_2_SQRTPI M_SQRT2 M_SQRT1_2
__state
""".split())

#: prefixes of the names gradflow's passes make: arrays and blocks, symbols
MADE = ("gradflow_", "gf_")


def tape_array(name: str) -> bool:
    """Whether `name` is an array of a gradflow tape, as made or as set aside by a later differentiation
    (`gfl<k>_tape...`, `gradflow.transforms.internal_names`)."""
    return name.startswith("gradflow_tape") or re.match(r"gfl\d+_tape", name) is not None


_CPP_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _called(code: str, language: dtypes.Language) -> set[str]:
    """Names a tasklet calls as functions (the generated C++ calls them unqualified)."""
    if language == dtypes.Language.Python:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return set()
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                names.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
        return names
    return set(_CPP_CALL.findall(code))


def _problems(sdfg: dace.SDFG) -> Iterator[tuple[str, str, str]]:
    """(kind, name, problem) for every array or symbol of `sdfg` (nested SDFGs included) the C++ code
    generator cannot carry."""
    for inner in sdfg.all_sdfgs_recursive():
        called: dict[str, str] = {}
        for node, _ in inner.all_nodes_recursive():
            if isinstance(node, nd.Tasklet):
                for name in _called(node.code.as_string, node.language):
                    called.setdefault(name, node.label)
        # a symbol of callback type is how DaCe itself names a Python callback the tasklet calls
        names = [("array", n) for n in inner.arrays] + [("symbol", str(s)) for s, t in inner.symbols.items()
                                                        if not isinstance(t, dace.dtypes.callback)]
        for kind, name in names:
            problem = identifier_problem(name)
            if problem is None and name in called:
                problem = f"is also a function that tasklet '{called[name]}' calls"
            if problem is not None:
                yield kind, name, problem


def identifier_problem(name: str) -> str | None:
    """Why `name` cannot be a variable of the generated C++ (None when it can), tasklets aside."""
    if not name.isidentifier() or not name.isascii():
        return "is not a C++ identifier"
    if name in CPP_KEYWORDS:
        return "is a C++ keyword"
    if name in RESERVED:
        return "is a name the generated C++ code already uses (a macro or DaCe's own)"
    return None


def check_identifiers(sdfg: dace.SDFG) -> None:
    """Raise `InvalidArgumentError` naming the first array or symbol whose name the generated C++ cannot
    carry (before any code is generated: the alternative is a compiler error about a generated file)."""
    for kind, name, problem in _problems(sdfg):
        raise InvalidArgumentError(
            f"{kind} '{name}' of SDFG '{sdfg.name}' {problem}; the C++ code generated for it would not compile",
            f"rename the {kind} (for example '{name}_'); gradflow does not rename arrays, since arguments are "
            "passed by name",
        )


def private_copies(sdfg: dace.SDFG, names, suffix: str = "") -> dict[str, str]:
    """Descriptors of their own, under fresh names, for the data `names` of `sdfg`: old name -> new name.

    For a pass that copies a piece of dataflow (a map's body, a state): data the copy shares with the
    original is declared by DaCe once for both, where both can see it: outside a parallel map (one
    variable for all its threads), or before the loop that defines its size."""
    return {old: sdfg.add_datadesc(f"{old}{suffix}", copy.deepcopy(sdfg.arrays[old]), find_new_name=True)
            for old in sorted(names)}


def rename_data(state, fresh: dict[str, str]) -> None:
    """Point `state`'s access nodes and memlets of the data `fresh` names (old -> new) at the new names:
    with `private_copies`, a copied state's own descriptors."""
    for node in state.data_nodes():
        if node.data in fresh:
            node.data = fresh[node.data]
    for edge in state.edges():
        if edge.data.data in fresh:
            edge.data.data = fresh[edge.data.data]
