"""The C++ dispatcher: a torch extension generated from a `FunctionPlan`.

`generate_source(plan, namespace)` emits one C++ file that
- dlopens the two compiled SDFG libraries (`bind`), resolving `__program_<name>`, `__dace_init_<name>`
  and `__dace_exit_<name>` of each (one DaCe state handle per tuple of init-symbol values);
- defines a `torch::autograd::Function` whose forward validates the inputs (dtype, rank, every extent with
  symbols consistent across inputs, device, layout, strides, negation views), allocates the outputs and
  the extra saved values, calls the forward SDFG and saves what the backward needs; whose backward
  densifies the cotangents if needed, allocates the gradients, calls the backward SDFG and returns the
  gradients the inputs need (`ctx->needs_input_grad`), scalar inputs given as tensors included;
- exposes it to Python as the module function `call` (a CPython `METH_FASTCALL` function: unpacks the
  arguments, releases the GIL, runs the autograd Function, raises `gradflow.ArgumentError` on a validation
  failure) — the dispatcher's hot path, which goes through neither Python autograd nor the operator
  dispatcher;
- registers the same Function as the operator `<namespace>::call` (CompositeImplicitAutograd, so autograd
  comes from the Function; scalar inputs are 0-d tensors there) for `torch.ops` / TorchScript users.

`build(plan, forward, backward)` compiles it with `torch.utils.cpp_extension.load` (ninja) into
`<gradflow cache>/torch_ext/<key>/`, where the key hashes the graph fingerprints of both SDFGs, the plan
and the torch version: a second build of the same pair is a cache hit, in this process and across them.

Symbols live in C++ locals named `gf_sym_<symbol>` (a symbol may be named like a generated local, `a0`).
A validation failure inside the Function is a `c10::Error` whose text starts with `gradflow.ArgumentError:`;
the Python entry (and `CppOp.op` callers via `raise_argument_errors`) turn it into `gradflow.ArgumentError`.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import attrs
import torch
from dace.codegen.compiled_sdfg import CompiledSDFG

from gradflow.core.errors import ArgumentError, CompilationError
from gradflow.core.graph import fingerprint
from gradflow.runtime.calling import library_path
from gradflow.runtime.compile import usable_cache_root
from gradflow.runtime.plan import ARRAY, SYMBOL, ArgSpec, CallPlan, Dim
from gradflow.torch.plan import EXTRA, INPUT, OUTPUT, FunctionPlan

MARKER = "gradflow.ArgumentError: "
HINT = "see the argument checks in docs/torch.md"

_AT_TYPES = {
    "float64": "at::kDouble", "float32": "at::kFloat", "float16": "at::kHalf", "int64": "at::kLong",
    "int32": "at::kInt", "int16": "at::kShort", "int8": "at::kChar", "uint8": "at::kByte", "bool": "at::kBool",
}
#: scalar inputs: C++ type of the value the Function takes
_SCALAR_VALUE = {
    "float64": "double", "float32": "double", "int64": "int64_t", "int32": "int64_t", "int16": "int64_t",
    "int8": "int64_t", "uint8": "int64_t", "bool": "bool",
}


#: prefix of the C++ locals that hold symbol values: a symbol may be named like a generated local (`a0`,
#: `ctx`, `h`, ...), so symbols never appear in the generated code under their own names
SYMBOL_PREFIX = "gf_sym_"


def _sym(name: str) -> str:
    return SYMBOL_PREFIX + name


def _cx(dim: Dim) -> str:
    """The C++ text of an extent or stride over the renamed symbol locals."""
    if dim.const is not None:
        return dim.cpp
    return re.sub(r"(?<![\w:.])([A-Za-z_]\w*)(?![\w(:])",
                  lambda m: _sym(m.group(1)) if m.group(1) in dim.free else m.group(1), dim.cpp)


def _c_param(a: ArgSpec) -> str:
    if a.kind == ARRAY:
        return "void*"
    if a.dtype == "float16":
        raise CompilationError(f"scalar argument '{a.name}' of type float16 cannot be passed by the C++ dispatcher")
    return a.ctype


def _cstr(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _entry_decls(tag: str, plan: CallPlan) -> list[str]:
    by_name = {a.name: a for a in plan.args}
    init = ", ".join(_c_param(by_name[n]) for n in plan.init_args) or "void"
    k = len(plan.init_args)
    return [
        f"typedef void (*{tag}_program_t)(void*{''.join(', ' + _c_param(a) for a in plan.args)});",
        f"typedef void* (*{tag}_init_t)({init});",
        f"Entry<{k}> g_{tag};",
        f"void* {tag}_handle({', '.join(f'int64_t {_sym(n)}' for n in plan.init_args)}) {{",
        f"  const std::array<int64_t, {k}> key{{{', '.join(_sym(n) for n in plan.init_args)}}};",
        f"  if (g_{tag}.last != nullptr && g_{tag}.last_key == key) return g_{tag}.last;",
        f"  auto it = g_{tag}.handles.find(key);",
        f"  void* h = nullptr;",
        f"  if (it != g_{tag}.handles.end()) {{",
        f"    h = it->second;",
        "  } else {",
        f"    TORCH_CHECK(g_{tag}.init != nullptr, \"gradflow: the extension is not bound to its SDFG libraries\");",
        f"    h = reinterpret_cast<{tag}_init_t>(g_{tag}.init)("
        + ", ".join(f"static_cast<{_c_param(by_name[n])}>({_sym(n)})" for n in plan.init_args) + ");",
        f"    TORCH_CHECK(h != nullptr, \"gradflow: initialising SDFG '{plan.sdfg_name}' failed\");",
        f"    g_{tag}.handles.emplace(key, h);",
        "  }",
        f"  g_{tag}.last_key = key;",
        f"  g_{tag}.last = h;",
        "  return h;",
        "}",
    ]


def _fail(name: str, *parts: str) -> str:
    return f"\"{MARKER}argument '{name}': \", " + ", ".join(parts)


def _check_input(var: str, spec: ArgSpec) -> list[str]:
    n = spec.name
    shape = ", ".join(d.py for d in spec.shape)
    checks = [
        (f"{var}.defined()", ['"is an undefined tensor"']),
        (f"{var}.layout() == at::kStrided",
         ['"has layout "', f"{var}.layout()", '"; compiled SDFGs take dense (strided) tensors"']),
        (f"{var}.device().is_cpu()",
         ['"is on device "', f"{var}.device()", '"; this compiled SDFG runs on the CPU"']),
        (f"{var}.scalar_type() == {_AT_TYPES[spec.dtype]}",
         [f'"expected dtype {spec.dtype}, got "', f"{var}.scalar_type()"]),
        (f"{var}.dim() == {spec.ndim}",
         [f'"expected {spec.ndim} dimension(s) of shape ({shape}), got "', f"{var}.dim()",
          '" with shape "', f"{var}.sizes()"]),
        (f"!{var}.is_neg() && !{var}.is_conj()",
         ['"is a lazy negation/conjugation view whose memory does not hold its values"']),
    ]
    return [f"    TORCH_CHECK({cond}, {_fail(n, *parts)});" for cond, parts in checks]


def _check_scalar(i: int, spec: ArgSpec) -> list[str]:
    """A scalar input given as a tensor (`t<i>` defined): one element on the CPU; its value is read."""
    conv = {"double": "double", "int64_t": "int64_t", "bool": "bool"}[_SCALAR_VALUE[spec.dtype]]
    return [
        f"    if (t{i}.has_value()) {{",
        f"      const at::Tensor& t = *t{i};",
        "      TORCH_CHECK(t.defined() && t.numel() == 1 && t.layout() == at::kStrided && t.device().is_cpu(), "
        + _fail(spec.name, '"expected a number or a one-element CPU tensor (scalar input), got a tensor of shape "',
                "t.sizes()") + ");",
        f"      v{i} = t.item<{conv}>();",
        "    }",
        f"    ctx->saved_data[\"t{i}\"] = t{i}.has_value();",
    ]


def _check_extents(var: str, spec: ArgSpec) -> list[str]:
    lines = []
    for axis, d in enumerate(spec.shape):
        lines.append(
            f"    TORCH_CHECK({var}.size({axis}) == (int64_t)({_cx(d)}), "
            + _fail(spec.name, f'"dimension {axis} has extent "', f"{var}.size({axis})",
                    f'", expected {d.py} = "', f"(int64_t)({_cx(d)})") + ");")
    if spec.default_strides():
        lines.append(f"    TORCH_CHECK({var}.is_contiguous(), "
                     + _fail(spec.name, '"has strides "', f"{var}.strides()",
                             '" (in elements); the compiled SDFG expects a contiguous tensor"') + ");")
    else:
        for axis, d in enumerate(spec.strides):
            lines.append(
                f"    TORCH_CHECK({var}.size({axis}) <= 1 || {var}.stride({axis}) == (int64_t)({_cx(d)}), "
                + _fail(spec.name, '"has strides "', f"{var}.strides()",
                        f'", the compiled SDFG expects stride {d.py} in dimension {axis}"') + ");")
    return lines


def _shape(spec: ArgSpec) -> str:
    return "{" + ", ".join(f"(int64_t)({_cx(d)})" for d in spec.shape) + "}"


def _options(spec: ArgSpec) -> str:
    return f"at::TensorOptions().dtype({_AT_TYPES[spec.dtype]})"


def _copy(var: str, spec: ArgSpec) -> str:
    """A private copy of a validated tensor with the descriptor's layout."""
    if spec.default_strides():
        return f"{var}.clone(at::MemoryFormat::Contiguous)"
    strides = "{" + ", ".join(f"(int64_t)({_cx(d)})" for d in spec.strides) + "}"
    return f"at::empty_strided({_shape(spec)}, {strides}, {_options(spec)}).copy_({var})"


def _call(tag: str, plan: CallPlan, local: dict[str, str], stateful: bool) -> list[str]:
    """The native call; under the entry's mutex when the SDFG keeps memory in its state (and always for
    the handle lookup, which may create a handle)."""
    args = ", ".join(local[a.name] if a.kind != SYMBOL else f"static_cast<{a.ctype}>({_sym(a.name)})"
                     for a in plan.args)
    init = ", ".join(_sym(n) for n in plan.init_args)
    call = f"reinterpret_cast<{tag}_program_t>(g_{tag}.program)(h{', ' if args else ''}{args});"
    if stateful:
        return [
            "    {",
            f"      std::lock_guard<std::mutex> guard(g_{tag}.mutex);",
            f"      void* h = {tag}_handle({init});",
            f"      {call}",
            "    }",
        ]
    return [
        "    void* h;",
        "    {",
        f"      std::lock_guard<std::mutex> guard(g_{tag}.mutex);",
        f"      h = {tag}_handle({init});",
        "    }",
        f"    {call}",
    ]


def generate_source(plan: FunctionPlan, namespace: str, stateful: tuple[bool, bool] = (True, True)) -> str:
    """The C++ source of the extension for `plan`: Python module `namespace`, operators in `namespace`.
    `stateful` says, for the forward and the backward SDFG, whether calls must be serialised (persistent
    memory in the DaCe state); when False only the handle lookup is locked."""
    symbols = plan.symbols
    n_in = len(plan.inputs)
    # parameters of Fn::forward: an array input is `at::Tensor a<i>`; a scalar input is
    # `std::optional<at::Tensor> t<i>` (present when given as a tensor: then differentiable) and its value
    # `v<i>`. Autograd input edges exist for the tensors that are present, in parameter order.
    params: list[str] = []
    position: dict[int, int] = {}  # input index -> position of its tensor parameter
    for i, s in enumerate(plan.inputs):
        position[i] = len(params)
        if s.kind == ARRAY:
            params.append(f"at::Tensor a{i}")
        else:
            if s.dtype not in _SCALAR_VALUE:
                raise CompilationError(f"scalar input '{s.name}' of type {s.dtype} cannot be passed by the C++ "
                                       "dispatcher")
            params += [f"std::optional<at::Tensor> t{i}", f"{_SCALAR_VALUE[s.dtype]} v{i}"]
    fn_args = []
    for i, s in enumerate(plan.inputs):
        fn_args += [f"a{i}"] if s.kind == ARRAY else [f"t{i}", f"v{i}"]

    L = [
        "// Generated by gradflow.torch.cpp from a FunctionPlan: do not edit.",
        "#include <Python.h>",
        "#include <ATen/ATen.h>",
        "#include <torch/library.h>",
        "#include <torch/csrc/autograd/custom_function.h>",
        "#include <torch/csrc/autograd/python_variable.h>",
        "#include <torch/csrc/Exceptions.h>",
        "#include <dlfcn.h>",
        "#include <array>",
        "#include <cstdint>",
        "#include <map>",
        "#include <optional>",
        "#include <mutex>",
        "#include <string>",
        "#include <vector>",
        "",
        "namespace {",
        "using torch::autograd::AutogradContext;",
        "using torch::autograd::variable_list;",
        "typedef int (*exit_t)(void*);",
        "template <size_t K> struct Entry {",
        "  void* lib = nullptr; void* program = nullptr; void* init = nullptr; exit_t exit = nullptr;",
        "  std::map<std::array<int64_t, K>, void*> handles; std::mutex mutex;",
        "  std::array<int64_t, K> last_key{}; void* last = nullptr;",
        "};",
        "",
        "template <size_t K>",
        "void bind_entry(Entry<K>& e, const std::string& path, const char* program, const char* init, const char* exit) {",
        "  std::lock_guard<std::mutex> guard(e.mutex);",
        "  if (e.lib != nullptr) return;",
        "  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);",
        "  TORCH_CHECK(lib != nullptr, \"gradflow: cannot load \", path, \": \", dlerror());",
        "  e.program = dlsym(lib, program); e.init = dlsym(lib, init);",
        "  e.exit = reinterpret_cast<exit_t>(dlsym(lib, exit));",
        "  TORCH_CHECK(e.program && e.init && e.exit, \"gradflow: \", path, \" lacks the entry points of \", program);",
        "  e.lib = lib;",
        "}",
        "",
        "template <size_t K>",
        "int64_t release_entry(Entry<K>& e) {",
        "  std::lock_guard<std::mutex> guard(e.mutex);",
        "  int64_t failures = 0;",
        "  for (auto& kv : e.handles) failures += e.exit(kv.second) != 0;",
        "  e.handles.clear();",
        "  e.last = nullptr;",
        "  return failures;",
        "}",
        "",
    ]
    L += _entry_decls("fwd", plan.forward) + [""] + _entry_decls("bwd", plan.backward) + [""]
    L += [
        "struct Fn : public torch::autograd::Function<Fn> {",
        f"  static variable_list forward(AutogradContext* ctx, {', '.join(params)}) {{",
    ]
    for i, s in enumerate(plan.inputs):
        L += _check_input(f"a{i}", s) if s.kind == ARRAY else _check_scalar(i, s)
    for name, i, axis in plan.symbol_sources:
        L.append(f"    const int64_t {_sym(name)} = a{i}.size({axis});")
    for name, value in plan.fixed_symbols:
        L.append(f"    const int64_t {_sym(name)} = {value};")
    limits = {"int32": 2**31 - 1, "int16": 2**15 - 1, "int8": 2**7 - 1}
    for name in symbols:  # the value must fit the C type the SDFGs take the symbol as
        specs = [a for p in (plan.forward, plan.backward) for a in p.args if a.kind == SYMBOL and a.name == name]
        bound = min((limits[a.dtype] for a in specs if a.dtype in limits), default=None)
        if bound is not None:
            v = _sym(name)
            L.append(f"    TORCH_CHECK({v} >= 0 && {v} <= {bound}, \"{MARKER}symbol '{name}' = \", {v}, "
                     f"\" does not fit the compiled SDFG's {specs[0].dtype}\");")
    for i, s in enumerate(plan.inputs):
        if s.kind == ARRAY:
            L += _check_extents(f"a{i}", s)
    for i in plan.copied:  # copy-in of the inputs the program writes
        L.append(f"    at::Tensor a{i}c = {_copy(f'a{i}', plan.inputs[i])};")
    local: dict[str, str] = {}
    for i, s in enumerate(plan.inputs):
        var = f"a{i}c" if i in plan.copied else f"a{i}"
        local[s.name] = f"{var}.data_ptr()" if s.kind == ARRAY else f"static_cast<{s.ctype}>(v{i})"
    for prefix, specs in (("o", plan.outputs), ("e", plan.extras)):
        for i, s in enumerate(specs):
            alloc = "at::zeros" if s.name in plan.zero_init else "at::empty"
            L.append(f"    at::Tensor {prefix}{i} = {alloc}({_shape(s)}, {_options(s)});")
            local[s.name] = f"{prefix}{i}.data_ptr()"
    L += _call("fwd", plan.forward, local, stateful[0])
    saved, scalars = [], []
    for name, src in plan.forwarded:
        expr = {INPUT: f"a{src.index}", OUTPUT: f"o{src.index}", EXTRA: f"e{src.index}"}[src.role]
        if src.role == INPUT and src.index in plan.copied:
            expr += "c"
        if plan.backward.arg(name).kind == ARRAY:
            saved.append(expr)
        else:
            scalars.append((name, f"v{src.index}"))
    L.append(f"    ctx->save_for_backward({{{', '.join(saved)}}});")
    for k, (name, expr) in enumerate(scalars):
        L.append(f"    ctx->saved_data[\"s{k}\"] = {expr};")
    for s in symbols:
        L.append(f"    ctx->saved_data[\"{s}\"] = {_sym(s)};")
    for ii, _ in plan.grads:
        if plan.inputs[ii].kind != ARRAY:  # the gradient of a scalar given as a tensor takes its shape
            L.append(f"    if (t{ii}.has_value()) ctx->saved_data[\"shape{ii}\"] = t{ii}->sizes().vec();")
    nondiff = [f"o{i}" for i, d in enumerate(plan.differentiable) if not d]
    if nondiff:
        L.append(f"    ctx->mark_non_differentiable({{{', '.join(nondiff)}}});")
    L.append(f"    return {{{', '.join(f'o{i}' for i in range(len(plan.outputs)))}}};")
    L.append("  }")
    L.append("")
    L.append("  static variable_list backward(AutogradContext* ctx, variable_list gouts) {")
    L.append("    auto saved = ctx->get_saved_variables();")
    for s in symbols:
        L.append(f"    const int64_t {_sym(s)} = ctx->saved_data[\"{s}\"].toInt();")
    local = {}
    ti = 0
    for name, _ in plan.forwarded:
        spec = plan.backward.arg(name)
        if spec.kind == ARRAY:
            if name in plan.backward_copied:  # the backward writes it: never the saved tensor itself
                L.append(f"    at::Tensor s{ti} = {_copy(f'saved[{ti}]', spec)};")
                local[name] = f"s{ti}.data_ptr()"
            else:
                local[name] = f"saved[{ti}].data_ptr()"
            ti += 1
    for k, (name, _) in enumerate(scalars):
        spec = plan.backward.arg(name)
        conv = ".toDouble()" if spec.dtype.startswith("float") else (".toBool()" if spec.dtype == "bool" else ".toInt()")
        local[name] = f"static_cast<{spec.ctype}>(ctx->saved_data[\"s{k}\"]{conv})"
    for oi, name in plan.cotangents:
        spec = plan.outputs[oi]
        L.append(f"    at::Tensor c{oi} = gouts[{oi}];")
        L.append(f"    if (!c{oi}.defined()) c{oi} = at::zeros({_shape(spec)}, {_options(spec)});")
        L.append(f"    if (c{oi}.layout() != at::kStrided) c{oi} = c{oi}.to_dense();")
        L.append(f"    if (c{oi}.is_neg()) c{oi} = c{oi}.resolve_neg();")
        L.append(f"    if (c{oi}.scalar_type() != {_AT_TYPES[spec.dtype]}) c{oi} = c{oi}.to({_AT_TYPES[spec.dtype]});")
        L.append(f"    if (!c{oi}.is_contiguous()) c{oi} = c{oi}.contiguous();")
        if name in plan.backward_copied:  # the backward writes it: never torch's cotangent itself
            L.append(f"    c{oi} = {_copy(f'c{oi}', spec)};")
        local[name] = f"c{oi}.data_ptr()"
    for k, spec in enumerate(plan.grad_specs):
        L.append(f"    at::Tensor g{k} = at::empty({_shape(spec)}, {_options(spec)});")
        local[spec.name] = f"g{k}.data_ptr()"
    L += _call("bwd", plan.backward, local, stateful[1])
    L.append(f"    variable_list grads({len(params)});")
    L.append("    size_t edge = 0;  // autograd input edge of the next tensor input")
    grad_of = {ii: k for k, (ii, _) in enumerate(plan.grads)}
    for ii, s in enumerate(plan.inputs):
        k = grad_of.get(ii)
        if s.kind == ARRAY:
            if k is not None:
                L.append(f"    if (ctx->needs_input_grad(edge)) grads[{position[ii]}] = g{k};")
            L.append("    ++edge;")
        else:
            L.append(f"    if (ctx->saved_data[\"t{ii}\"].toBool()) {{")
            if k is not None:
                L.append(f"      if (ctx->needs_input_grad(edge)) "
                         f"grads[{position[ii]}] = g{k}.reshape(ctx->saved_data[\"shape{ii}\"].toIntVector());")
            L.append("      ++edge;")
            L.append("    }")
    L.append("    return grads;")
    L.append("  }")
    L.append("};")
    L.append("")

    # the registered operator: scalar inputs are (0-d or one-element) tensors
    schema = ", ".join(f"Tensor a{i}" for i in range(n_in))
    op_params = ", ".join(f"const at::Tensor& a{i}" for i in range(n_in))
    op_args = []
    for i, s in enumerate(plan.inputs):
        op_args += [f"a{i}"] if s.kind == ARRAY else [f"std::optional<at::Tensor>(a{i})", f"{_SCALAR_VALUE[s.dtype]}()"]
    L.append(f"variable_list call_op({op_params}) {{")
    L.append(f"  return Fn::apply({', '.join(op_args)});")
    L.append("}")
    L.append("")

    # the Python entry point
    L += [
        "PyObject* g_error = nullptr;  // gradflow.ArgumentError, given by bind()",
        "",
        "PyObject* raise_argument_error(const std::string& message) {",
        "  if (g_error == nullptr) { PyErr_SetString(PyExc_TypeError, message.c_str()); return nullptr; }",
        f"  PyObject* exc = PyObject_CallFunction(g_error, \"ss\", message.c_str(), {_cstr(HINT)});",
        "  if (exc != nullptr) { PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc); Py_DECREF(exc); }",
        "  return nullptr;",
        "}",
        "",
        "std::string type_name(PyObject* o) { return Py_TYPE(o)->tp_name; }",
        "",
        "struct NoGil {",
        "  PyThreadState* state;",
        "  NoGil() : state(PyEval_SaveThread()) {}",
        "  ~NoGil() { PyEval_RestoreThread(state); }",
        "};",
        "",
        "PyObject* py_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {",
        "  HANDLE_TH_ERRORS",
        f"  if (nargs != {n_in}) return raise_argument_error(\"'{plan.name}' takes {n_in} inputs "
        f"({', '.join(s.name for s in plan.inputs)}), got \" + std::to_string(nargs));",
    ]
    for i, s in enumerate(plan.inputs):
        if s.kind == ARRAY:
            L += [
                f"  if (!THPVariable_Check(args[{i}])) return raise_argument_error("
                f"\"argument '{s.name}': expected a torch.Tensor, got \" + type_name(args[{i}]));",
                f"  const at::Tensor& a{i} = THPVariable_Unpack(args[{i}]);",
            ]
        else:
            vt = _SCALAR_VALUE[s.dtype]
            accept = {"double": f"PyFloat_Check(args[{i}]) || PyLong_Check(args[{i}])",
                      "int64_t": f"PyLong_Check(args[{i}])", "bool": f"PyLong_Check(args[{i}])"}[vt]
            read = {"double": f"PyFloat_AsDouble(args[{i}])", "int64_t": f"PyLong_AsLongLong(args[{i}])",
                    "bool": f"PyObject_IsTrue(args[{i}]) == 1"}[vt]
            kind = {"double": "a number", "int64_t": "an int", "bool": "a bool"}[vt]
            L += [
                f"  std::optional<at::Tensor> t{i};",
                f"  {vt} v{i} = {vt}();",
                f"  if (THPVariable_Check(args[{i}])) {{",
                f"    t{i} = THPVariable_Unpack(args[{i}]);",
                f"  }} else if ({accept}) {{",
                f"    v{i} = {read};",
                "    if (PyErr_Occurred()) return nullptr;",
                "  } else {",
                f"    return raise_argument_error(\"argument '{s.name}': expected {kind} or a one-element tensor "
                f"(scalar input), got \" + type_name(args[{i}]));",
                "  }",
            ]
    n_out = len(plan.outputs)
    doc = f"call({', '.join(s.name for s in plan.inputs)}): the differentiable '{plan.name}'"
    L += [
        "  variable_list out;",
        "  try {",
        "    NoGil released;",
        f"    out = Fn::apply({', '.join(fn_args)});",
        "  } catch (const c10::Error& e) {",
        "    std::string text = e.what_without_backtrace();",
        f"    auto at = text.find({_cstr(MARKER)});",
        "    if (at == std::string::npos) throw;",
        f"    text = text.substr(at + {len(MARKER)});",
        "    auto nl = text.find('\\n');",
        "    return raise_argument_error(nl == std::string::npos ? text : text.substr(0, nl));",
        "  }",
    ]
    if n_out == 1:
        L.append("  return THPVariable_Wrap(std::move(out[0]));")
    else:
        L += [
            f"  PyObject* tuple = PyTuple_New({n_out});",
            "  if (tuple == nullptr) return nullptr;",
            f"  for (Py_ssize_t k = 0; k < {n_out}; ++k) {{",
            "    PyObject* item = THPVariable_Wrap(std::move(out[k]));",
            "    if (item == nullptr) { Py_DECREF(tuple); return nullptr; }",
            "    PyTuple_SET_ITEM(tuple, k, item);",
            "  }",
            "  return tuple;",
        ]
    L += [
        "  END_HANDLE_TH_ERRORS",
        "}",
        "",
        "PyObject* py_bind(PyObject*, PyObject* args) {",
        "  HANDLE_TH_ERRORS",
        "  const char* forward; const char* backward; PyObject* error;",
        "  if (!PyArg_ParseTuple(args, \"ssO\", &forward, &backward, &error)) return nullptr;",
        "  Py_XINCREF(error);",
        "  Py_XSETREF(g_error, error);",
        f"  bind_entry(g_fwd, forward, \"{plan.forward.program_symbol}\", \"{plan.forward.init_symbol}\", "
        f"\"{plan.forward.exit_symbol}\");",
        f"  bind_entry(g_bwd, backward, \"{plan.backward.program_symbol}\", \"{plan.backward.init_symbol}\", "
        f"\"{plan.backward.exit_symbol}\");",
        "  Py_RETURN_NONE;",
        "  END_HANDLE_TH_ERRORS",
        "}",
        "",
        "PyObject* py_release(PyObject*, PyObject*) {",
        "  HANDLE_TH_ERRORS",
        "  return PyLong_FromLongLong(release_entry(g_fwd) + release_entry(g_bwd));",
        "  END_HANDLE_TH_ERRORS",
        "}",
        "",
        "PyMethodDef g_methods[] = {",
        "  {\"call\", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&py_call)), METH_FASTCALL,",
        f"   {_cstr(doc)}}},",
        "  {\"bind\", &py_bind, METH_VARARGS, \"bind(forward_library, backward_library, error_class)\"},",
        "  {\"release\", &py_release, METH_NOARGS, \"finalise every DaCe state handle; returns the failures\"},",
        "  {nullptr, nullptr, 0, nullptr}",
        "};",
        "",
        f"PyModuleDef g_module = {{PyModuleDef_HEAD_INIT, \"{namespace}\", nullptr, -1, g_methods}};",
        "}  // namespace",
        "",
        f"PyMODINIT_FUNC PyInit_{namespace}(void) {{ return PyModule_Create(&g_module); }}",
        "",
        f"TORCH_LIBRARY({namespace}, m) {{",
        f"  m.def(\"call({schema}) -> Tensor[]\", &call_op);",
        "}",
    ]
    return "\n".join(L) + "\n"


def raise_argument_errors(exc: RuntimeError) -> None:
    """Re-raise a validation failure of the registered operator (`torch.ops.<namespace>.call`) as
    `gradflow.ArgumentError`; other errors are left alone."""
    text = str(exc)
    at = text.find(MARKER)
    if at >= 0:
        raise ArgumentError(text[at + len(MARKER):].split("\n")[0], HINT) from None


class CppOp:
    """The Python face of a built extension: `op(*inputs)` returns a tensor (one output) or a tuple.

    `call` is the extension's CPython entry point (the hot path); `op` the registered operator.
    """

    def __init__(self, plan: FunctionPlan, namespace: str, module: Any, stateful: tuple[bool, bool]) -> None:
        self.plan = plan
        self.stateful = stateful
        self.namespace = namespace
        self.module = module
        self.library = module.__file__
        self.call = module.call
        self.op = getattr(torch.ops, namespace).call.default

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)


_BUILT: dict[str, CppOp] = {}
_LOCK = threading.Lock()


def _plan_text(plan: FunctionPlan) -> str:
    """The plan as text that is the same in every process (its sets sorted: their repr follows the hash seed)."""
    def serialize(_inst: Any, _field: Any, value: Any) -> Any:
        return sorted(value) if isinstance(value, (set, frozenset)) else value
    return json.dumps(attrs.asdict(plan, value_serializer=serialize), sort_keys=True, default=str)


def extension_key(plan: FunctionPlan, forward: CompiledSDFG, backward: CompiledSDFG, source: str) -> str:
    text = "|".join([fingerprint(forward.sdfg), fingerprint(backward.sdfg), _plan_text(plan), source,
                     torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def build(plan: FunctionPlan, forward: CompiledSDFG, backward: CompiledSDFG, verbose: bool = False,
          stateful: tuple[bool, bool] = (True, True)) -> CppOp:
    """Generate, build (or fetch from the cache), load and bind the extension of `plan`."""
    probe = generate_source(plan, "gradflow_NAMESPACE", stateful)
    key = extension_key(plan, forward, backward, probe)
    namespace = f"gradflow_{key}"
    with _LOCK:
        hit = _BUILT.get(namespace)
        if hit is not None:
            return hit
        folder = usable_cache_root() / "torch_ext" / key
        folder.mkdir(parents=True, exist_ok=True)
        source = generate_source(plan, namespace, stateful)
        path = folder / f"{namespace}.cpp"
        if not path.is_file() or path.read_text() != source:
            tmp = folder / f".{namespace}.{os.getpid()}.cpp"
            tmp.write_text(source)
            os.replace(tmp, path)
        from torch.utils import cpp_extension

        try:
            module = cpp_extension.load(
                name=namespace, sources=[str(path)], build_directory=str(folder),
                extra_cflags=["-O2", "-std=c++17"], extra_ldflags=["-ldl"],
                is_python_module=True, verbose=verbose,
            )
        except Exception as exc:  # ninja/compiler failures come as several exception types
            text = str(exc)
            raise CompilationError(
                f"building the torch extension of '{plan.name}' in {folder} failed: {type(exc).__name__}: "
                f"{text[-2000:]}"
            ) from exc
        module.bind(library_path(forward), library_path(backward), ArgumentError)
        atexit.register(module.release)
        op = CppOp(plan, namespace, module, stateful)
        op.source_path = Path(path)
        _BUILT[namespace] = op
        return op
