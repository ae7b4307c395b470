// torch's own 2-D convolution (oneDNN where torch has it) for gradflow's float32 convolution kernels.
//
// Built once per torch version by `gradflow.torch.convolution` and loaded with RTLD_GLOBAL, so the kernels
// of `runtime/conv_kernels.h` (compiled into every program) find `gradflow_aten_conv2d` with dlsym and
// hand it their operands; where it is not loaded they run their own (per-image unfolding and products).
// The operands are gradflow's buffers wrapped without a copy; torch pads the input (the kernels hand over
// only convolutions whose zeros after the input are as many as before it). Returns 1 when it computed the
// result, 0 when the caller must (an exception from torch: nothing has been written then but a partial
// forward output, which the caller overwrites).
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>

#include <atomic>
#include <cstdint>
#include <vector>

static std::atomic<long> calls{0};
static std::atomic<int> enabled{1};

// shape: N, C, H, W (unpadded input), M, KH, KW, OH, OW, SH, SW, DH, DW, PH, PW (conv_kernels.h's Shape, NCHW)
// op 0: out (y) = conv(a = x, b = w); op 1: out (dx) += the input gradient of a = dy, b = w;
// op 2: out (dw) += the weight gradient of a = x, b = dy
extern "C" int gradflow_aten_conv2d(int op, const long* s, const float* a, const float* b, float* out) {
    if (!enabled.load(std::memory_order_relaxed)) return 0;
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const std::vector<int64_t> stride{s[9], s[10]}, padding{s[13], s[14]}, dilation{s[11], s[12]}, none{0, 0};
    const std::vector<int64_t> xs{s[0], s[1], s[2], s[3]}, ws{s[4], s[1], s[5], s[6]}, ys{s[0], s[4], s[7], s[8]};
    auto wrap = [&](const float* p, const std::vector<int64_t>& shape) {
        return at::from_blob(const_cast<float*>(p), shape, f32);
    };
    try {
        if (op == 0) {
            wrap(out, ys).copy_(at::convolution(wrap(a, xs), wrap(b, ws), std::nullopt, stride, padding, dilation,
                                                false, none, 1));
        } else if (op == 1) {  // the input's values do not enter its gradient: `out` stands in for it
            auto dx = wrap(out, xs);
            auto r = at::convolution_backward(wrap(a, ys), dx, wrap(b, ws), std::nullopt, stride, padding,
                                              dilation, false, none, 1, {true, false, false});
            dx.add_(std::get<0>(r));
        } else {  // nor the weights' values the weights' gradient
            auto dw = wrap(out, ws);
            auto r = at::convolution_backward(wrap(b, ys), wrap(a, xs), dw, std::nullopt, stride, padding,
                                              dilation, false, none, 1, {false, true, false});
            dw.add_(std::get<1>(r));
        }
    } catch (...) {
        return 0;
    }
    calls.fetch_add(1, std::memory_order_relaxed);
    return 1;
}

// how many kernel calls torch has computed in this process (what tests check the route with)
extern "C" long gradflow_aten_conv2d_calls() { return calls.load(); }

// 0: every call returns 0 (the kernels compute), until 1 again (benchmarks/conv_route.py interleaves both)
extern "C" void gradflow_aten_conv2d_enable(int on) { enabled.store(on); }
