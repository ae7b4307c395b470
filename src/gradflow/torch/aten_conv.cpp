// torch's own 2-D convolution (oneDNN where torch has it) for gradflow's float32 convolution kernels.
//
// Built once per torch version by `gradflow.torch.convolution` and loaded with RTLD_GLOBAL, so the kernels
// of `runtime/conv_kernels.h` (compiled into every program) find `gradflow_aten_conv2d` with dlsym and
// hand it their operands; where it is not loaded they run their own (per-image unfolding and products).
// The operands are gradflow's buffers wrapped without a copy; torch pads the input (the kernels hand over
// only convolutions whose output extent torch's padding, the same zeros on both sides, gives). Returns 1
// when it computed the result, 0 when the caller must (an exception from torch: nothing has been written
// then but a partial forward output, which the caller overwrites).
//
// It also keeps the process's routes: which of the two computes each (operation, shape, thread count).
// The kernels time both at the first call of one (mode "auto"; which is faster depends on the machine:
// oneDNN's AVX-512 convolutions against MKL's products on an AMD host, for one) and record the faster
// here, once per process whichever program asks.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

static std::atomic<long> calls{0};
// 0: the kernels compute every convolution; 1: torch every one it can; 2: the faster, timed per shape
static std::atomic<int> mode{2};
// (op, the kernels' 15 shape values, threads) -> 1 torch, 0 the kernels
using Key = std::array<long, 17>;
static std::mutex routes_lock;
static std::map<Key, int> routes;

static Key key_of(int op, const long* s) {
    Key k;
    k[0] = op;
    for (int i = 0; i < 16; ++i) k[i + 1] = s[i];
    return k;
}

// shape: N, C, H, W (unpadded input), M, KH, KW, OH, OW, SH, SW, DH, DW, PH, PW (conv_kernels.h's Shape, NCHW)
// op 0: out (y) = conv(a = x, b = w); op 1: out (dx) += the input gradient of a = dy, b = w;
// op 2: out (dw) += the weight gradient of a = x, b = dy
extern "C" int gradflow_aten_conv2d(int op, const long* s, const float* a, const float* b, float* out) {
    if (mode.load(std::memory_order_relaxed) == 0) return 0;
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

// s: the 15 shape values and the thread count. 1: torch computes op, 0: the kernels, 2: not decided yet
// (the kernels time both and call `gradflow_aten_conv2d_decide`)
extern "C" int gradflow_aten_conv2d_route(int op, const long* s) {
    const int m = mode.load(std::memory_order_relaxed);
    if (m != 2) return m;
    std::lock_guard<std::mutex> hold(routes_lock);
    auto found = routes.find(key_of(op, s));
    return found == routes.end() ? 2 : found->second;
}

// records `torch` (1 or 0) as the route of (op, s) unless one is recorded already; the route recorded
extern "C" int gradflow_aten_conv2d_decide(int op, const long* s, int torch) {
    std::lock_guard<std::mutex> hold(routes_lock);
    return routes.emplace(key_of(op, s), torch).first->second;
}

// the recorded routes as rows of 18 (op, 15 shape values, threads, route) into out, at most `capacity`
// rows; how many there are
extern "C" long gradflow_aten_conv2d_routes(long* out, long capacity) {
    std::lock_guard<std::mutex> hold(routes_lock);
    long row = 0;
    for (const auto& [k, torch] : routes) {
        if (row < capacity) {
            for (int i = 0; i < 17; ++i) out[row * 18 + i] = k[i];
            out[row * 18 + 17] = torch;
        }
        ++row;
    }
    return row;
}

extern "C" void gradflow_aten_conv2d_forget() {
    std::lock_guard<std::mutex> hold(routes_lock);
    routes.clear();
}

extern "C" void gradflow_aten_conv2d_set_mode(int m) { mode.store(m); }
