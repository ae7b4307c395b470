// gradflow's convolution kernels (the BLAS expansion of gradflow.library.convolution's nodes).
// Pasted into the CBLAS shim after team_gemm.h, so `cblas_?gemm` below is the shim's.
//
// One image at a time: its unfolded input (C*KH*KW rows, one column per output pixel; 147 KB for 16
// channels, 3x3, 16x16) stays in L2 where the whole batch's (4.7 MB) did not, each product writes one image
// of the NCHW output directly (M x pixels = weights (M x C*KH*KW) @ unfolded), and no unfolded matrix is
// kept for the backward pass (the weight gradient unfolds again). A 1x1 convolution with stride 1 reads
// the image as its own unfolded matrix. Measured on a 16-channel 3x3 convolution over 32 16x16 images
// (float32, one thread): forward + both gradients 1.5 ms, against 2.2 ms for one whole-batch im2col
// product each, whose OpenBLAS calls leave the small-matrix kernels (<= 1e6 multiply-adds) the per-image
// products use.
//
// With several OpenMP threads (and outside a parallel region) the images are split over the team; each
// thread has its own unfolding buffer and, for the weight gradient, its own partial sum, added into the
// result in thread order after the region (deterministic for a given thread count). The products run
// concurrently on OpenBLAS's small-matrix kernels, in the three orientations used here (NN, TN, NT);
// its both-transposed (TT) small kernel gives wrong results under concurrent calls of different shapes
// and is never called here. Channels-last operands (`nhwc`, NPBench's layout) are unfolded with one row
// per output pixel instead, whose columns follow the weights' (KH, KW, C, M) rows.
#pragma once
#include <omp.h>
#include <algorithm>
#include <cstring>
#include <vector>

namespace gradflow_conv {

struct Shape {
    long N, C, H, W;        // input (already zero-padded)
    long M, KH, KW;         // output channels, kernel
    long OH, OW;            // output
    long SH, SW, DH, DW;    // strides, dilations
    long nhwc;              // 0: x (N, C, H, W), w (M, C, KH, KW), y (N, M, OH, OW)
                            // 1: x (N, H, W, C), w (KH, KW, C, M), y (N, OH, OW, M)
    long pixels() const { return OH * OW; }
    long rows() const { return C * KH * KW; }
    // a 1x1 kernel with stride 1 over the whole input: the image is its own unfolded matrix
    bool direct() const { return KH == 1 && KW == 1 && SH == 1 && SW == 1 && OH == H && OW == W; }
};

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, long m, long n, long k, const float* a, long lda,
                 const float* b, long ldb, float beta, float* c, long ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, long m, long n, long k, const double* a, long lda,
                 const double* b, long ldb, double beta, double* c, long ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

// col[(c, kh, kw), (oh, ow)] = x[c, oh * SH + kh * DH, ow * SW + kw * DW] for one image
template <typename T>
void unfold(const Shape& s, const T* __restrict__ x, T* __restrict__ col) {
    const long P = s.pixels();
    for (long c = 0; c < s.C; ++c)
        for (long kh = 0; kh < s.KH; ++kh)
            for (long kw = 0; kw < s.KW; ++kw) {
                T* d = col + ((c * s.KH + kh) * s.KW + kw) * P;
                for (long oh = 0; oh < s.OH; ++oh) {
                    const T* src = x + (c * s.H + oh * s.SH + kh * s.DH) * s.W + kw * s.DW;
                    T* dst = d + oh * s.OW;
                    if (s.SW == 1) {
                        std::memcpy(dst, src, sizeof(T) * s.OW);
                    } else {
                        for (long ow = 0; ow < s.OW; ++ow) dst[ow] = src[ow * s.SW];
                    }
                }
            }
}

// the adjoint of `unfold`: x[c, oh * SH + kh * DH, ow * SW + kw * DW] += col[(c, kh, kw), (oh, ow)]
template <typename T>
void fold_add(const Shape& s, const T* __restrict__ col, T* __restrict__ x) {
    const long P = s.pixels();
    for (long c = 0; c < s.C; ++c)
        for (long kh = 0; kh < s.KH; ++kh)
            for (long kw = 0; kw < s.KW; ++kw) {
                const T* src = col + ((c * s.KH + kh) * s.KW + kw) * P;
                for (long oh = 0; oh < s.OH; ++oh) {
                    T* dst = x + (c * s.H + oh * s.SH + kh * s.DH) * s.W + kw * s.DW;
                    const T* row = src + oh * s.OW;
                    for (long ow = 0; ow < s.OW; ++ow) dst[ow * s.SW] += row[ow];
                }
            }
}

// channels last: col[(oh, ow), (kh, kw, c)] = x[oh * SH + kh * DH, ow * SW + kw * DW, c] for one image (the
// rows of the weights (KH, KW, C, M) are in the same order)
template <typename T>
void unfold_last(const Shape& s, const T* __restrict__ x, T* __restrict__ col) {
    const long R = s.rows();
    for (long oh = 0; oh < s.OH; ++oh)
        for (long ow = 0; ow < s.OW; ++ow) {
            T* d = col + (oh * s.OW + ow) * R;
            for (long kh = 0; kh < s.KH; ++kh)
                for (long kw = 0; kw < s.KW; ++kw)
                    std::memcpy(d + (kh * s.KW + kw) * s.C,
                                x + ((oh * s.SH + kh * s.DH) * s.W + ow * s.SW + kw * s.DW) * s.C, sizeof(T) * s.C);
        }
}

template <typename T>
void fold_add_last(const Shape& s, const T* __restrict__ col, T* __restrict__ x) {
    const long R = s.rows();
    for (long oh = 0; oh < s.OH; ++oh)
        for (long ow = 0; ow < s.OW; ++ow) {
            const T* src = col + (oh * s.OW + ow) * R;
            for (long kh = 0; kh < s.KH; ++kh)
                for (long kw = 0; kw < s.KW; ++kw) {
                    T* dst = x + ((oh * s.SH + kh * s.DH) * s.W + ow * s.SW + kw * s.DW) * s.C;
                    const T* row = src + (kh * s.KW + kw) * s.C;
                    for (long c = 0; c < s.C; ++c) dst[c] += row[c];
                }
        }
}

// Threads for a loop over n images: the team when there is one to start, else 1.
inline int image_threads(long n) {
    if (n < 2 || omp_in_parallel()) return 1;
    return (int)std::min<long>(omp_get_max_threads(), n);
}

// f(thread, first image, end image) on each thread's share of the images (contiguous blocks)
template <typename F>
void over_images(long n, int threads, F&& f) {
    if (threads <= 1) {
        f(0, 0L, n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const long t = omp_get_thread_num(), team = omp_get_num_threads();
        f((int)t, n * t / team, n * (t + 1) / team);
    }
}

// y[n] = w @ unfold(x[n]) for every image (y overwritten)
template <typename T>
void forward(const Shape& s, const T* x, const T* w, T* y) {
    const long P = s.pixels(), R = s.rows(), in = s.C * s.H * s.W;
    over_images(s.N, image_threads(s.N), [&](int, long lo, long hi) {
        std::vector<T> col(s.direct() ? 0 : R * P);
        for (long n = lo; n < hi; ++n) {
            const T* b = x + n * in;
            if (!s.direct()) {
                s.nhwc ? unfold_last(s, b, col.data()) : unfold(s, b, col.data());
                b = col.data();
            }
            if (s.nhwc)  // y[n] (pixels x M) = col (pixels x R) @ w (R x M)
                gemm(CblasNoTrans, CblasNoTrans, P, s.M, R, b, R, w, s.M, T(0), y + n * s.M * P, s.M);
            else  // y[n] (M x pixels) = w (M x R) @ col (R x pixels)
                gemm(CblasNoTrans, CblasNoTrans, s.M, P, R, w, R, b, P, T(0), y + n * s.M * P, P);
        }
    });
}

// dx[n] += fold(w^T @ dy[n]) for every image
template <typename T>
void grad_input(const Shape& s, const T* dy, const T* w, T* dx) {
    const long P = s.pixels(), R = s.rows(), in = s.C * s.H * s.W;
    over_images(s.N, image_threads(s.N), [&](int, long lo, long hi) {
        std::vector<T> col(s.direct() ? 0 : R * P);
        for (long n = lo; n < hi; ++n) {
            const T* g = dy + n * s.M * P;
            const bool direct = s.direct();
            T* out = direct ? dx + n * in : col.data();
            if (s.nhwc)  // (pixels x R) = dy[n] (pixels x M) @ w^T
                gemm(CblasNoTrans, CblasTrans, P, R, s.M, g, s.M, w, s.M, T(direct), out, R);
            else  // (R x pixels) = w^T @ dy[n] (M x pixels)
                gemm(CblasTrans, CblasNoTrans, R, P, s.M, w, R, g, P, T(direct), out, P);
            if (!direct) s.nhwc ? fold_add_last(s, col.data(), dx + n * in) : fold_add(s, col.data(), dx + n * in);
        }
    });
}

// dw += sum over images of dy[n] @ unfold(x[n])^T
template <typename T>
void grad_weights(const Shape& s, const T* x, const T* dy, T* dw) {
    const long P = s.pixels(), R = s.rows(), in = s.C * s.H * s.W, size = s.M * R;
    const int threads = image_threads(s.N);
    std::vector<T> partial(threads > 1 ? threads * size : 0, T(0));
    over_images(s.N, threads, [&](int t, long lo, long hi) {
        std::vector<T> col(s.direct() ? 0 : R * P);
        T* acc = threads > 1 ? partial.data() + t * size : dw;
        for (long n = lo; n < hi; ++n) {
            const T* b = x + n * in;
            if (!s.direct()) {
                s.nhwc ? unfold_last(s, b, col.data()) : unfold(s, b, col.data());
                b = col.data();
            }
            if (s.nhwc)  // dw (R x M) += col^T @ dy[n] (pixels x M)
                gemm(CblasTrans, CblasNoTrans, R, s.M, P, b, R, dy + n * s.M * P, s.M, T(1), acc, s.M);
            else  // dw (M x R) += dy[n] (M x pixels) @ col^T
                gemm(CblasNoTrans, CblasTrans, s.M, R, P, dy + n * s.M * P, P, b, P, T(1), acc, R);
        }
    });
    for (int t = 0; t < (threads > 1 ? threads : 0); ++t)
        for (long i = 0; i < size; ++i) dw[i] += partial[t * size + i];
}

}  // namespace gradflow_conv
