"""The C++ dispatcher: a torch extension generated from a `FunctionPlan`.

`generate_source(plan, namespace)` emits one C++ file that
- dlopens the two compiled SDFG libraries (`bind`), resolving `__program_<name>`, `__dace_init_<name>`
  and `__dace_exit_<name>` of each (one DaCe state handle per tuple of init-symbol values);
- defines a `torch::autograd::Function` whose forward validates the inputs (dtype, rank, every extent with
  symbols consistent across inputs, device, layout, strides, negation views), allocates the outputs and
  the extra saved values, calls the forward SDFG and saves what the backward needs; whose backward
  densifies the cotangents if needed, allocates the gradients, calls the backward SDFG and returns the
  gradients the inputs need (`ctx->needs_input_grad`);
- registers the operator `<namespace>::call` (CompositeImplicitAutograd, so autograd comes from the
  Function) plus `bind` and `release`.

`build(plan, forward, backward)` compiles it with `torch.utils.cpp_extension.load` (ninja) into
`<gradflow cache>/torch_ext/<key>/`, where the key hashes the graph fingerprints of both SDFGs, the source
and the torch version: a second build of the same pair is a cache hit, in this process and across them.

A validation failure is a `c10::Error` whose text starts with `gradflow.ArgumentError:`; `CppOp.__call__`
turns it back into `gradflow.ArgumentError`.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import torch
from dace.codegen.compiled_sdfg import CompiledSDFG

from gradflow.core.errors import ArgumentError, CompilationError
from gradflow.core.graph import fingerprint
from gradflow.runtime.calling import library_path
from gradflow.runtime.compile import cache_root
from gradflow.runtime.plan import ARRAY, SCALAR, SYMBOL, ArgSpec, CallPlan
from gradflow.torch.plan import EXTRA, INPUT, OUTPUT, FunctionPlan

MARKER = "gradflow.ArgumentError: "

_AT_TYPES = {
    "float64": "at::kDouble", "float32": "at::kFloat", "float16": "at::kHalf", "int64": "at::kLong",
    "int32": "at::kInt", "int16": "at::kShort", "int8": "at::kChar", "uint8": "at::kByte", "bool": "at::kBool",
}
#: scalar inputs: (schema type, C++ parameter type)
_SCHEMA_SCALARS = {
    "float64": ("float", "double"), "float32": ("float", "double"), "int64": ("int", "int64_t"),
    "int32": ("int", "int64_t"), "int16": ("int", "int64_t"), "int8": ("int", "int64_t"),
    "uint8": ("int", "int64_t"), "bool": ("bool", "bool"),
}


def _c_param(a: ArgSpec) -> str:
    if a.kind == ARRAY:
        return "void*"
    if a.dtype == "float16":
        raise CompilationError(f"scalar argument '{a.name}' of type float16 cannot be passed by the C++ dispatcher")
    return a.ctype


def _entry_decls(tag: str, plan: CallPlan) -> list[str]:
    by_name = {a.name: a for a in plan.args}
    init = ", ".join(_c_param(by_name[n]) for n in plan.init_args) or "void"
    return [
        f"typedef void (*{tag}_program_t)(void*{''.join(', ' + _c_param(a) for a in plan.args)});",
        f"typedef void* (*{tag}_init_t)({init});",
        f"Entry g_{tag};",
        f"void* {tag}_handle({', '.join(f'int64_t {n}' for n in plan.init_args) or ''}) {{",
        f"  std::vector<int64_t> key{{{', '.join(plan.init_args)}}};",
        f"  auto it = g_{tag}.handles.find(key);",
        f"  if (it != g_{tag}.handles.end()) return it->second;",
        f"  TORCH_CHECK(g_{tag}.init != nullptr, \"gradflow: the extension is not bound to its SDFG libraries\");",
        f"  void* h = reinterpret_cast<{tag}_init_t>(g_{tag}.init)("
        + ", ".join(f"static_cast<{_c_param(by_name[n])}>({n})" for n in plan.init_args) + ");",
        f"  TORCH_CHECK(h != nullptr, \"gradflow: initialising SDFG '{plan.sdfg_name}' failed\");",
        f"  g_{tag}.handles.emplace(key, h);",
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
    return [f"  TORCH_CHECK({cond}, {_fail(n, *parts)});" for cond, parts in checks]


def _check_extents(var: str, spec: ArgSpec) -> list[str]:
    lines = []
    for axis, d in enumerate(spec.shape):
        lines.append(
            f"  TORCH_CHECK({var}.size({axis}) == (int64_t)({d.cpp}), "
            + _fail(spec.name, f'"dimension {axis} has extent "', f"{var}.size({axis})",
                    f'", expected {d.py} = "', f"(int64_t)({d.cpp})") + ");")
    if spec.default_strides():
        lines.append(f"  TORCH_CHECK({var}.is_contiguous(), "
                     + _fail(spec.name, '"has strides "', f"{var}.strides()",
                             '" (in elements); the compiled SDFG expects a contiguous tensor"') + ");")
    else:
        for axis, d in enumerate(spec.strides):
            lines.append(
                f"  TORCH_CHECK({var}.size({axis}) <= 1 || {var}.stride({axis}) == (int64_t)({d.cpp}), "
                + _fail(spec.name, '"has strides "', f"{var}.strides()",
                        f'", the compiled SDFG expects stride {d.py} in dimension {axis}"') + ");")
    return lines


def _shape(spec: ArgSpec) -> str:
    return "{" + ", ".join(f"(int64_t)({d.cpp})" for d in spec.shape) + "}"


def _call(tag: str, plan: CallPlan, local: dict[str, str]) -> list[str]:
    args = ", ".join(local[a.name] if a.kind != SYMBOL else f"static_cast<{a.ctype}>({a.name})" for a in plan.args)
    init = ", ".join(plan.init_args)
    return [
        "  {",
        f"    std::lock_guard<std::mutex> guard(g_{tag}.mutex);",
        f"    void* h = {tag}_handle({init});",
        f"    reinterpret_cast<{tag}_program_t>(g_{tag}.program)(h{', ' if args else ''}{args});",
        "  }",
    ]


def generate_source(plan: FunctionPlan, namespace: str) -> str:
    """The C++ source of the extension for `plan`, registering operators in `namespace`."""
    symbols = plan.symbols
    n_in = len(plan.inputs)
    params, schema = [], []
    for i, s in enumerate(plan.inputs):
        if s.kind == ARRAY:
            params.append(f"at::Tensor a{i}")
            schema.append(f"Tensor a{i}")
        else:
            if s.dtype not in _SCHEMA_SCALARS:
                raise CompilationError(f"scalar input '{s.name}' of type {s.dtype} has no torch schema type")
            st, ct = _SCHEMA_SCALARS[s.dtype]
            params.append(f"{ct} a{i}")
            schema.append(f"{st} a{i}")
    L = [
        "// Generated by gradflow.torch.cpp from a FunctionPlan: do not edit.",
        "#include <ATen/ATen.h>",
        "#include <torch/library.h>",
        "#include <torch/csrc/autograd/custom_function.h>",
        "#include <dlfcn.h>",
        "#include <cstdint>",
        "#include <map>",
        "#include <mutex>",
        "#include <string>",
        "#include <vector>",
        "",
        "namespace {",
        "using torch::autograd::AutogradContext;",
        "using torch::autograd::variable_list;",
        "typedef int (*exit_t)(void*);",
        "struct Entry {",
        "  void* lib = nullptr; void* program = nullptr; void* init = nullptr; exit_t exit = nullptr;",
        "  std::map<std::vector<int64_t>, void*> handles; std::mutex mutex;",
        "};",
        "",
        "void bind_entry(Entry& e, const std::string& path, const char* program, const char* init, const char* exit) {",
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
        "int64_t release_entry(Entry& e) {",
        "  std::lock_guard<std::mutex> guard(e.mutex);",
        "  int64_t failures = 0;",
        "  for (auto& kv : e.handles) failures += e.exit(kv.second) != 0;",
        "  e.handles.clear();",
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
        if s.kind == ARRAY:
            L += _check_input(f"a{i}", s)
    for name, i, axis in plan.symbol_sources:
        L.append(f"  const int64_t {name} = a{i}.size({axis});")
    for name, value in plan.fixed_symbols:
        L.append(f"  const int64_t {name} = {value};")
    for i, s in enumerate(plan.inputs):
        if s.kind == ARRAY:
            L += _check_extents(f"a{i}", s)
    local: dict[str, str] = {}
    for i, s in enumerate(plan.inputs):
        local[s.name] = f"a{i}.data_ptr()" if s.kind == ARRAY else f"static_cast<{s.ctype}>(a{i})"
    for prefix, specs in (("o", plan.outputs), ("e", plan.extras)):
        for i, s in enumerate(specs):
            alloc = "at::zeros" if s.name in plan.zero_init else "at::empty"
            L.append(f"  at::Tensor {prefix}{i} = {alloc}({_shape(s)}, at::TensorOptions().dtype({_AT_TYPES[s.dtype]}));")
            local[s.name] = f"{prefix}{i}.data_ptr()"
    L += _call("fwd", plan.forward, local)
    saved, scalars = [], []
    for name, src in plan.forwarded:
        expr = {INPUT: f"a{src.index}", OUTPUT: f"o{src.index}", EXTRA: f"e{src.index}"}[src.role]
        if plan.backward.arg(name).kind == ARRAY:
            saved.append(expr)
        else:
            scalars.append((name, expr))
    L.append(f"  ctx->save_for_backward({{{', '.join(saved)}}});")
    for k, (name, expr) in enumerate(scalars):
        L.append(f"  ctx->saved_data[\"s{k}\"] = {expr};")
    for s in symbols:
        L.append(f"  ctx->saved_data[\"{s}\"] = {s};")
    nondiff = [f"o{i}" for i, d in enumerate(plan.differentiable) if not d]
    if nondiff:
        L.append(f"  ctx->mark_non_differentiable({{{', '.join(nondiff)}}});")
    L.append(f"  return {{{', '.join(f'o{i}' for i in range(len(plan.outputs)))}}};")
    L.append("  }")
    L.append("")
    L.append("  static variable_list backward(AutogradContext* ctx, variable_list gouts) {")
    L.append("    auto saved = ctx->get_saved_variables();")
    for s in symbols:
        L.append(f"  const int64_t {s} = ctx->saved_data[\"{s}\"].toInt();")
    local = {}
    ti = 0
    for name, _ in plan.forwarded:
        spec = plan.backward.arg(name)
        if spec.kind == ARRAY:
            local[name] = f"saved[{ti}].data_ptr()"
            ti += 1
    for k, (name, _) in enumerate(scalars):
        spec = plan.backward.arg(name)
        conv = ".toDouble()" if spec.dtype.startswith("float") else (".toBool()" if spec.dtype == "bool" else ".toInt()")
        local[name] = f"static_cast<{spec.ctype}>(ctx->saved_data[\"s{k}\"]{conv})"
    for oi, name in plan.cotangents:
        spec = plan.outputs[oi]
        L.append(f"  at::Tensor c{oi} = gouts[{oi}];")
        L.append(f"  if (!c{oi}.defined()) c{oi} = at::zeros({_shape(spec)}, at::TensorOptions().dtype({_AT_TYPES[spec.dtype]}));")
        L.append(f"  if (c{oi}.layout() != at::kStrided) c{oi} = c{oi}.to_dense();")
        L.append(f"  if (c{oi}.is_neg()) c{oi} = c{oi}.resolve_neg();")
        L.append(f"  c{oi} = c{oi}.to({_AT_TYPES[spec.dtype]}).contiguous();")
        local[name] = f"c{oi}.data_ptr()"
    for k, spec in enumerate(plan.grad_specs):
        L.append(f"  at::Tensor g{k} = at::empty({_shape(spec)}, at::TensorOptions().dtype({_AT_TYPES[spec.dtype]}));")
        local[spec.name] = f"g{k}.data_ptr()"
    L += ["  " + line for line in _call("bwd", plan.backward, local)]
    L.append(f"  variable_list grads({n_in});")
    for k, (ii, _) in enumerate(plan.grads):
        if plan.inputs[ii].kind == ARRAY:
            L.append(f"  if (ctx->needs_input_grad({ii})) grads[{ii}] = g{k};")
    L.append("  return grads;")
    L.append("  }")
    L.append("};")
    L.append("")
    L.append(f"variable_list call({', '.join(params)}) {{")
    L.append(f"  return Fn::apply({', '.join(f'a{i}' for i in range(n_in))});")
    L.append("}")
    L.append("")
    L.append("int64_t bind(std::string forward, std::string backward) {")
    L.append(f"  bind_entry(g_fwd, forward, \"{plan.forward.program_symbol}\", \"{plan.forward.init_symbol}\", \"{plan.forward.exit_symbol}\");")
    L.append(f"  bind_entry(g_bwd, backward, \"{plan.backward.program_symbol}\", \"{plan.backward.init_symbol}\", \"{plan.backward.exit_symbol}\");")
    L.append("  return 0;")
    L.append("}")
    L.append("")
    L.append("int64_t release() { return release_entry(g_fwd) + release_entry(g_bwd); }")
    L.append("}  // namespace")
    L.append("")
    L.append(f"TORCH_LIBRARY({namespace}, m) {{")
    L.append("  m.def(\"bind(str forward, str backward) -> int\", &bind);")
    L.append("  m.def(\"release() -> int\", &release);")
    L.append(f"  m.def(\"call({', '.join(schema)}) -> Tensor[]\", &call);")
    L.append("}")
    return "\n".join(L) + "\n"


class CppOp:
    """The Python face of a built extension: `op(*inputs)` returns a tensor (one output) or a tuple."""

    def __init__(self, plan: FunctionPlan, namespace: str, library: str) -> None:
        self.plan = plan
        self.namespace = namespace
        self.library = library
        self.op = getattr(torch.ops, namespace).call.default
        self._single = len(plan.outputs) == 1

    def __call__(self, *args: Any) -> Any:
        try:
            out = self.op(*args)
        except RuntimeError as exc:
            text = str(exc)
            at = text.find(MARKER)
            if at < 0:
                raise
            message = text[at + len(MARKER):].split("\n")[0]
            raise ArgumentError(message, "see gradflow.torch docs (docs/torch.md) on argument checks") from None
        return out[0] if self._single else tuple(out)


_BUILT: dict[str, CppOp] = {}
_LOCK = threading.Lock()


def extension_key(plan: FunctionPlan, forward: CompiledSDFG, backward: CompiledSDFG) -> str:
    text = "|".join([fingerprint(forward.sdfg), fingerprint(backward.sdfg), repr(plan), torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def build(plan: FunctionPlan, forward: CompiledSDFG, backward: CompiledSDFG, verbose: bool = False) -> CppOp:
    """Generate, build (or fetch from the cache), load and bind the extension of `plan`."""
    key = extension_key(plan, forward, backward)
    namespace = f"gradflow_{key}"
    with _LOCK:
        hit = _BUILT.get(namespace)
        if hit is not None:
            return hit
        folder = cache_root() / "torch_ext" / key
        folder.mkdir(parents=True, exist_ok=True)
        source = generate_source(plan, namespace)
        path = folder / f"{namespace}.cpp"
        if not path.is_file() or path.read_text() != source:
            tmp = folder / f".{namespace}.{os.getpid()}.cpp"
            tmp.write_text(source)
            os.replace(tmp, path)
        from torch.utils import cpp_extension

        try:
            library = cpp_extension.load(
                name=namespace, sources=[str(path)], build_directory=str(folder),
                extra_cflags=["-O2", "-std=c++17"], extra_ldflags=["-ldl"],
                is_python_module=False, verbose=verbose,
            )
        except Exception as exc:  # ninja/compiler failures come as several exception types
            text = str(exc)
            raise CompilationError(
                f"building the torch extension of '{plan.name}' in {folder} failed: {type(exc).__name__}: "
                f"{text[-2000:]}"
            ) from None
        library = str(library) if library else str(folder / f"{namespace}.so")
        ops = getattr(torch.ops, namespace)
        ops.bind(library_path(forward), library_path(backward))
        atexit.register(ops.release)
        op = CppOp(plan, namespace, library)
        op.source_path = Path(path)
        _BUILT[namespace] = op
        return op
