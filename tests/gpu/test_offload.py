"""`to_gpu`: the program's maps become CUDA kernels, its transients move to device memory, its arguments
stay host arrays; a growable tape is refused naming the user's loop, and bounding that loop lifts it."""

from __future__ import annotations

import dace
import pytest
from dace.sdfg import nodes as nd

from gradflow.api import grad_graph
from gradflow.autodiff.forwarding import STORE_ALL
from gradflow.autodiff.tape import TOP
from gradflow.core.errors import NotDifferentiableError
from gradflow.gpu import OPTIMIZE_GPU, ToGpu
from gradflow.gpu.offload import TARGET, gpu_maps
from gradflow.verify.corpus import loops

GPU = dace.StorageType.GPU_Global


def _top_level_maps(sdfg: dace.SDFG) -> list[nd.MapEntry]:
    return [n for s in sdfg.states() for n in s.nodes()
            if isinstance(n, nd.MapEntry) and s.entry_node(n) is None]


def test_a_gradient_runs_its_maps_as_kernels_with_transients_on_the_device() -> None:
    case = loops.CASES_BY_NAME["lp_lu"]
    cpu = grad_graph(case.program, list(case.wrt), case.of, optimize=False)
    gpu = OPTIMIZE_GPU(cpu).unwrap()
    assert gpu_maps(cpu.sdfg) == 0 and gpu_maps(gpu.sdfg) > 0
    maps = _top_level_maps(gpu.sdfg)
    assert maps and all(m.map.schedule == dace.ScheduleType.GPU_Device for m in maps)
    arguments = {n: d for n, d in gpu.sdfg.arrays.items() if not d.transient}
    assert set(arguments) == {n for n, d in cpu.sdfg.arrays.items() if not d.transient}
    assert all(d.storage != GPU for d in arguments.values())  # copied in and out by the program
    tapes = [d for n, d in gpu.sdfg.arrays.items() if n.startswith("gradflow_tape") and n != TOP]
    assert tapes and all(d.storage == GPU for d in tapes)  # pushed and popped on the device
    assert gpu.meta[TARGET] == "cuda" and gpu.meta["ad"] is cpu.meta["ad"]
    assert ToGpu()(gpu).unwrap() is gpu  # once is enough


def test_a_growable_tape_is_refused_naming_the_loop_and_a_bound_lifts_it() -> None:
    case = loops.CASES_BY_NAME["lp_newton_sqrt"]
    with pytest.raises(NotDifferentiableError) as info:
        grad_graph(case.program, list(case.wrt), case.of, optimize=OPTIMIZE_GPU)
    message = str(info.value)
    assert "the while loop (line " in message and "growable tape" in message
    label = message.split("DaCe's label '")[1].split("'")[0]
    assert f"with_loop_bounds(**{{'{label}': <n>}})" in info.value.hint and "scalar argument" not in info.value.hint
    bounded = grad_graph(case.program, list(case.wrt), case.of, forwarding=STORE_ALL.with_loop_bounds(**{label: 50}),
                         optimize=OPTIMIZE_GPU)
    assert gpu_maps(bounded.sdfg) > 0


def test_a_for_loop_bounded_by_data_is_refused_with_its_own_hint() -> None:
    case = loops.CASES_BY_NAME["lp_bound_from_data"]  # for j in range(cnt[i])
    with pytest.raises(NotDifferentiableError, match=r"the loop over j \(line \d+") as info:
        grad_graph(case.program, list(case.wrt), case.of, optimize=OPTIMIZE_GPU)
    assert "scalar argument" in info.value.hint and "with_loop_bounds" not in info.value.hint


def test_the_build_tells_a_gpu_program_from_a_cpu_one() -> None:
    # `compile_sdfg` gives a CPU program OpenBLAS calls and SIMD math, a GPU program DaCe's own expansions
    from gradflow.runtime.compile import _for_gpu

    case = loops.CASES_BY_NAME["lp_jacobi_1d"]
    cpu = grad_graph(case.program, list(case.wrt), case.of, optimize=False)
    assert not _for_gpu(cpu.sdfg) and _for_gpu(OPTIMIZE_GPU(cpu).unwrap().sdfg)


def test_a_gpu_programs_cuda_files_get_the_missing_atomics_and_a_cpu_programs_build_is_unchanged() -> None:
    # the CUDA compiler gets runtime/cuda_atomics.h (atomicMax on int64, a scatter's last writer) in the
    # build `compile_sdfg` runs, as in `check_cuda_builds`
    from gradflow.runtime.compile import CUDA_PRELUDE, prepared_for_code_generation

    case = loops.CASES_BY_NAME["lp_jacobi_1d"]
    cpu = grad_graph(case.program, list(case.wrt), case.of, optimize=False)
    before = dace.Config.get("compiler", "cuda", "args")
    with prepared_for_code_generation(OPTIMIZE_GPU(cpu).unwrap().to_sdfg()):
        assert dace.Config.get("compiler", "cuda", "args").endswith(f"-include {CUDA_PRELUDE}")
    with prepared_for_code_generation(cpu.to_sdfg()):
        assert dace.Config.get("compiler", "cuda", "args") == before
    assert dace.Config.get("compiler", "cuda", "args") == before and CUDA_PRELUDE.is_file()
