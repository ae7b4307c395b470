"""NVIDIA GPUs: the pass that puts a program's dataflow on the GPU, and a compile-only check of its CUDA code.

- `offload.ToGpu` (`to_gpu`) and `OPTIMIZE_GPU`: a program, differentiated or not, becomes one whose maps
  run as CUDA kernels and whose arrays live in device memory (`docs/gpu.md`);
- `toolkit.find_toolkit`: the CUDA compiler, from the environment, the PATH or the `nvidia-cuda-nvcc`
  wheel (`pip install 'gradflow[cuda]'`);
- `cuda_check.check_cuda_builds`: generates the CUDA and host code of programs and compiles it with `nvcc`
  without running it, so the code a GPU would run is checked on a machine without one.
"""

from gradflow.gpu.cuda_check import CudaBuild, check_cuda_builds
from gradflow.gpu.offload import OPTIMIZE_GPU, ToGpu
from gradflow.gpu.toolkit import CudaToolkit, CudaToolkitError, find_toolkit

__all__ = ["OPTIMIZE_GPU", "CudaBuild", "CudaToolkit", "CudaToolkitError", "ToGpu", "check_cuda_builds",
           "find_toolkit"]
