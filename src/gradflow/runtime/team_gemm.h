// gradflow: matrix products shared out over the calling OpenMP team.
//
// gradflow runs OpenBLAS on the calling thread (its own pool's spinning workers starved OpenMP's and
// torch's threads). A large product then used one core while the SDFG's maps used all of them. These
// wrappers keep OpenBLAS single-threaded and split a large product into one block per OpenMP thread
// instead, on the team the maps already use: by rows or columns of C (no thread reads another's output),
// or, for a small C with a long inner dimension (a weight gradient: C is channels x taps, K is every
// pixel of the batch), by K into private partial products that are then added into C by column blocks.
// Inside a parallel region (a product in a map), with one OpenMP thread, with OpenBLAS threads of its
// own, or where a thread's block would be small, the call goes to OpenBLAS unchanged.
//
// Every block has more than GRADFLOW_TEAM_MIN_BLOCK multiply-adds. Below 1e6 the wheel's OpenBLAS
// (SkylakeX kernels) takes its "small matrix" path, and two of those running at once on two threads now
// and then wrote a block with another call's layout (2 wrong results in 95k concurrent 6x7x100 calls, none
// single-threaded or with the Haswell kernels); blocks above it take the packed path, which gave none in
// 30k concurrent calls. The bound also keeps a fork and join (a few us) small against the block.
//
// Which BLAS runs each block: torch's MKL where torch carries one (gradflow imports torch; the x86
// wheels' libtorch_cpu.so exports MKL's Fortran sgemm_/dgemm_, found at a library's first product with
// dlopen(RTLD_NOLOAD)), on one thread per call as OpenBLAS runs; else the wheel's OpenBLAS. Which of the
// two is faster depends on the machine and the shape: a 32x512 by 512x512 float32 product on one core
// took MKL 103 us and OpenBLAS 148 us on one host, 192 and 171 us on an AVX-512 AMD one (where MKL runs its
// AVX2 path). So with both at hand GRADFLOW_BLAS=auto (the default, read at the first product) times them
// at the first product of each shape (element size, layout, transposes, M, N, K, OpenMP threads) called
// outside a parallel region: MKL and OpenBLAS in turn, three times, on the same C, restored between them, the
// faster recorded for this library's later products of that shape, its result left in C. Products inside
// a parallel region (in a map) run on MKL: OpenBLAS's small-matrix path is not safe under concurrent calls
// (below). GRADFLOW_BLAS=mkl keeps MKL, =openblas OpenBLAS; so does OPENBLAS_NUM_THREADS above 1 (the
// user chose OpenBLAS's threads).
//
// Pasted into the shim header after the wheel's cblas.h (gradflow.runtime.blas); C++, as DaCe emits C++.
#pragma once
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <array>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef GRADFLOW_TEAM_MIN_BLOCK
#define GRADFLOW_TEAM_MIN_BLOCK 1.25e6  // multiply-adds per thread (~35 us at 70 GFLOP/s)
#endif
#define GRADFLOW_TEAM_MAX_PARTIAL (1 << 16)  // elements of C for which a K split keeps private copies
#ifndef GRADFLOW_TEAM_TRACE
#define GRADFLOW_TEAM_TRACE(how, team)  // tests record which split a call took: 'k', 'm', 'n' or '1'
#endif

template <typename T>
using gradflow_fortran_gemm = void (*)(const char *, const char *, const blasint *, const blasint *,
                                       const blasint *, const T *, const T *, const blasint *, const T *,
                                       const blasint *, const T *, T *, const blasint *);

struct gradflow_mkl {
    gradflow_fortran_gemm<float> sgemm = nullptr;
    gradflow_fortran_gemm<double> dgemm = nullptr;
    int (*threads_local)(int) = nullptr;  // MKL_Set_Num_Threads_Local: this thread's count, the old one back
    bool measured = false;                 // GRADFLOW_BLAS=auto: MKL or OpenBLAS, timed per product shape
};

// torch's MKL when it is loaded and chosen (see above), else all members null; found once per library
static const gradflow_mkl &gradflow_mkl_found() {
    static const gradflow_mkl found = [] {
        gradflow_mkl mkl;
        const char *choice = getenv("GRADFLOW_BLAS");
        if ((choice && strcmp(choice, "openblas") == 0) || scipy_openblas_get_num_threads() != 1)
            return mkl;
        void *torch = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
        if (!torch)
            return mkl;
        mkl.sgemm = (gradflow_fortran_gemm<float>)dlsym(torch, "sgemm_");
        mkl.dgemm = (gradflow_fortran_gemm<double>)dlsym(torch, "dgemm_");
        mkl.threads_local = (int (*)(int))dlsym(torch, "MKL_Set_Num_Threads_Local");
        if (!mkl.sgemm || !mkl.dgemm || !mkl.threads_local)
            mkl = gradflow_mkl();
        else
            mkl.measured = !(choice && strcmp(choice, "mkl") == 0);
        dlclose(torch);  // drops the reference NOLOAD took; torch stays loaded
        return mkl;
    }();
    return found;
}

// a column-major cblas_?gemm through a Fortran ?gemm_ on this thread alone
template <typename T>
static void gradflow_fortran_call(gradflow_fortran_gemm<T> gemm, int (*threads_local)(int),
                                  const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb, const blasint M,
                                  const blasint N, const blasint K, const T alpha, const T *A, const blasint lda,
                                  const T *B, const blasint ldb, const T beta, T *C, const blasint ldc) {
    const char a = ta == CblasNoTrans ? 'N' : ta == CblasTrans ? 'T' : 'C';
    const char b = tb == CblasNoTrans ? 'N' : tb == CblasTrans ? 'T' : 'C';
    const int before = threads_local(1);
    gemm(&a, &b, &M, &N, &K, &alpha, A, &lda, B, &ldb, &beta, C, &ldc);
    threads_local(before);
}

template <typename T, typename Call>
static void gradflow_team_gemm(Call call, const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                               const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N, const blasint K,
                               const T alpha, const T *A, const blasint lda, const T *B, const blasint ldb,
                               const T beta, T *C, const blasint ldc) {
    // column-major C (M x N) = alpha op(A) op(B) + beta C, as cblas_?gemm; a row-major call is transposed
    if (order == CblasRowMajor) {
        gradflow_team_gemm<T>(call, CblasColMajor, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
        return;
    }
    int team = 1;
    char how = '1';
#ifdef _OPENMP
    const blasint widest = M > N ? M : N;
    how = K >= 4 * widest && (long)M * N <= GRADFLOW_TEAM_MAX_PARTIAL ? 'k' : M >= N ? 'm' : 'n';
    const blasint split = how == 'k' ? K : how == 'm' ? M : N;  // the dimension cut into blocks
    const double rest = (double)M * N * K / split;               // multiply-adds per unit of it
    // a user who gave OpenBLAS threads of its own (OPENBLAS_NUM_THREADS) gets OpenBLAS's threading instead
    if (!omp_in_parallel() && scipy_openblas_get_num_threads() == 1)
        for (int threads = omp_get_max_threads(); threads >= 2; --threads)
            if ((double)(split / threads) * rest > GRADFLOW_TEAM_MIN_BLOCK) {
                team = threads;
                break;
            }
    T *partial = nullptr;
    if (team >= 2 && how == 'k') {
        partial = (T *)malloc(sizeof(T) * (size_t)M * N * (team - 1));
        if (!partial) team = 1;
    }
#endif
    if (team < 2) {
        GRADFLOW_TEAM_TRACE('1', 1);
        call(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#ifdef _OPENMP
    GRADFLOW_TEAM_TRACE(how, team);
    const bool a_plain = ta == CblasNoTrans, b_plain = tb == CblasNoTrans;
#pragma omp parallel num_threads(team)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const blasint lo = (blasint)((long)split * t / nt), hi = (blasint)((long)split * (t + 1) / nt);
        if (how == 'k') {
            // thread t multiplies its slice of K into C (t = 0, with beta) or into its own partial product
            const T *a = a_plain ? A + (long)lo * lda : A + lo;
            const T *b = b_plain ? B + lo : B + (long)lo * ldb;
            if (t == 0)
                call(order, ta, tb, M, N, hi - lo, alpha, a, lda, b, ldb, beta, C, ldc);
            else
                call(order, ta, tb, M, N, hi - lo, alpha, a, lda, b, ldb, (T)0, partial + (long)(t - 1) * M * N, M);
#pragma omp barrier
            const blasint j0 = (blasint)((long)N * t / nt), j1 = (blasint)((long)N * (t + 1) / nt);
            for (int s = 1; s < nt; ++s) {
                const T *p = partial + (long)(s - 1) * M * N;
                for (blasint j = j0; j < j1; ++j)
                    for (blasint i = 0; i < M; ++i) C[i + (long)j * ldc] += p[i + (long)j * M];
            }
        } else if (how == 'm') {
            call(order, ta, tb, hi - lo, N, K, alpha, a_plain ? A + lo : A + (long)lo * lda, lda, B, ldb, beta,
                 C + lo, ldc);
        } else {
            call(order, ta, tb, M, hi - lo, K, alpha, A, lda, b_plain ? B + (long)lo * ldb : B + lo, ldb, beta,
                 C + (long)lo * ldc, ldc);
        }
    }
    free(partial);
#endif
}

// GRADFLOW_BLAS=auto: the library recorded for each product shape of this library (0 MKL, 1 OpenBLAS)
typedef std::array<long, 8> gradflow_gemm_shape;  // element size, order, ta, tb, M, N, K, OpenMP threads
static std::mutex gradflow_gemm_routes_lock;
static std::map<gradflow_gemm_shape, int> gradflow_gemm_routes;

// how many shapes have a recorded library (what tests check the measurement with)
static size_t gradflow_gemm_routes_recorded() {
    std::lock_guard<std::mutex> hold(gradflow_gemm_routes_lock);
    return gradflow_gemm_routes.size();
}

// the stored matrix C (M x N in `order`, leading dimension ldc) to or from a packed copy
template <typename T>
static void gradflow_gemm_copy_c(const enum CBLAS_ORDER order, const blasint M, const blasint N, T *C,
                                 const blasint ldc, T *packed, bool save) {
    const long lines = order == CblasRowMajor ? M : N, length = order == CblasRowMajor ? N : M;
    for (long i = 0; i < lines; ++i)
        memcpy(save ? packed + i * length : C + i * (long)ldc, save ? C + i * (long)ldc : packed + i * length,
               sizeof(T) * length);
}

// cblas_?gemm by the team, each block through MKL or OpenBLAS (see above)
template <typename T>
static void gradflow_gemm(void (*openblas)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
                                           const enum CBLAS_TRANSPOSE, const blasint, const blasint, const blasint,
                                           const T, const T *, const blasint, const T *, const blasint, const T,
                                           T *, const blasint),
                          gradflow_fortran_gemm<T> mkl, int (*threads_local)(int), bool measured,
                          const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                          const blasint M, const blasint N, const blasint K, const T alpha, const T *A,
                          const blasint lda, const T *B, const blasint ldb, const T beta, T *C, const blasint ldc) {
    if (mkl == nullptr) {
        gradflow_team_gemm<T>(openblas, order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    auto block = [mkl, threads_local](const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE a_t,
                                      const enum CBLAS_TRANSPOSE b_t, const blasint m, const blasint n,
                                      const blasint k, const T al, const T *a, const blasint la, const T *b,
                                      const blasint lb, const T be, T *c, const blasint lc) {
        gradflow_fortran_call<T>(mkl, threads_local, a_t, b_t, m, n, k, al, a, la, b, lb, be, c, lc);
    };  // team_gemm hands every block over column-major
    auto run = [&](int library) {
        if (library == 1)
            gradflow_team_gemm<T>(openblas, order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        else
            gradflow_team_gemm<T>(block, order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    };
    int threads = 1;
#ifdef _OPENMP
    if (measured && omp_in_parallel())
        measured = false;
    threads = omp_get_max_threads();
#endif
    if (!measured) {
        run(0);
        return;
    }
    const gradflow_gemm_shape shape{(long)sizeof(T), (long)order, (long)ta, (long)tb, M, N, K, threads};
    int library = -1;
    {
        std::lock_guard<std::mutex> hold(gradflow_gemm_routes_lock);
        auto found = gradflow_gemm_routes.find(shape);
        if (found != gradflow_gemm_routes.end())
            library = found->second;
    }
    if (library >= 0) {
        run(library);
        return;
    }
    // C enters the result unless beta is 0 (then BLAS does not read it): kept for each trial
    std::vector<T> before(beta == (T)0 ? 0 : (size_t)M * N);
    if (!before.empty())
        gradflow_gemm_copy_c<T>(order, M, N, C, ldc, before.data(), true);
    auto trial = [&](int library) {
        if (!before.empty())
            gradflow_gemm_copy_c<T>(order, M, N, C, ldc, before.data(), false);
        const auto start = std::chrono::steady_clock::now();
        run(library);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    // each library three times in turn, the fastest of each kept: a trial the scheduler interrupts (another
    // process's compile on a shared core) counts at most once a side
    double mkl_time = std::numeric_limits<double>::infinity(), openblas_time = mkl_time;
    for (int round = 0; round < 3; ++round) {
        mkl_time = std::min(mkl_time, trial(0));
        openblas_time = std::min(openblas_time, trial(1));
    }
    {
        std::lock_guard<std::mutex> hold(gradflow_gemm_routes_lock);
        library = gradflow_gemm_routes.emplace(shape, openblas_time < mkl_time ? 1 : 0).first->second;
    }
    if (library == 0)  // C holds OpenBLAS's result
        trial(0);
}

static inline void gradflow_team_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                                       const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N,
                                       const blasint K, const float alpha, const float *A, const blasint lda,
                                       const float *B, const blasint ldb, const float beta, float *C,
                                       const blasint ldc) {
    const gradflow_mkl &mkl = gradflow_mkl_found();
    gradflow_gemm<float>(scipy_cblas_sgemm, mkl.sgemm, mkl.threads_local, mkl.measured, order, ta, tb, M, N, K,
                         alpha, A, lda, B, ldb, beta, C, ldc);
}

static inline void gradflow_team_dgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                                       const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N,
                                       const blasint K, const double alpha, const double *A, const blasint lda,
                                       const double *B, const blasint ldb, const double beta, double *C,
                                       const blasint ldc) {
    const gradflow_mkl &mkl = gradflow_mkl_found();
    gradflow_gemm<double>(scipy_cblas_dgemm, mkl.dgemm, mkl.threads_local, mkl.measured, order, ta, tb, M, N,
                          K, alpha, A, lda, B, ldb, beta, C, ldc);
}
