// Forced into every CUDA file of a GPU program (`nvcc -include`, runtime/compile.py): the atomics DaCe's
// write-conflict resolution calls that CUDA does not overload. DaCe's int64 is `int64_t`, which is `long`
// here; CUDA has atomicMax and atomicMin for `long long`, the same 64 bits under another type, so the
// reduction of a scatter's last writer (a write-conflict max into int64) found no overload. Declared
// before DaCe's headers: their templates call atomicMax unqualified on fundamental types, which looks only
// at the declarations before the template.
#pragma once
#ifdef __CUDACC__
static_assert(sizeof(long) == sizeof(long long), "long and long long differ in size");

__device__ __forceinline__ long atomicMax(long* address, long value) {
    return static_cast<long>(atomicMax(reinterpret_cast<long long*>(address), static_cast<long long>(value)));
}

__device__ __forceinline__ long atomicMin(long* address, long value) {
    return static_cast<long>(atomicMin(reinterpret_cast<long long*>(address), static_cast<long long>(value)));
}
#endif
