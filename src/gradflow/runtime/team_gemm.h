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
// Pasted into the shim header after the wheel's cblas.h (gradflow.runtime.blas); C++, as DaCe emits C++.
#pragma once
#include <stdlib.h>
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

static inline void gradflow_team_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                                       const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N,
                                       const blasint K, const float alpha, const float *A, const blasint lda,
                                       const float *B, const blasint ldb, const float beta, float *C,
                                       const blasint ldc) {
    gradflow_team_gemm<float>(scipy_cblas_sgemm, order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static inline void gradflow_team_dgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                                       const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N,
                                       const blasint K, const double alpha, const double *A, const blasint lda,
                                       const double *B, const blasint ldb, const double beta, double *C,
                                       const blasint ldc) {
    gradflow_team_gemm<double>(scipy_cblas_dgemm, order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
