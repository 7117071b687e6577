// A stack of post-LayerNorm BERT layers on a few dozen packed tokens, fp32, in one call
// (fastbert/models/layers.py: run_lean for a small batch, e.g. one short text):
//   qkv = x Wqkv^T + b;  ctx = attention(qkv) per sequence;  h = LN(ctx Wo^T + b + x);
//   x = LN(GELU(h Wi^T + b) Wf^T + b + h)
// with fastbert's own GEMM (py_linear.cpp, its GELU and residual in the store) and attention
// (py_attention.cpp), and the LayerNorms here. Op by op, a layer was 8 Python-level calls with their
// checks, conversions and torch's dispatch, and torch's LayerNorm woke OpenMP threads that then spun
// on the cores the next GEMM needed; here a forward is one call, the GIL released throughout, on the
// module's own pool only (one 26-token MiniLM text on 2 threads: 2.8 ms p50 against 3.7), in one pool
// run whose threads share each step (Schedule). AVX-512 only:
// layers_forward returns False elsewhere (nothing written) and Python runs the layers one op at a time.
// Int8Layer / run_int8_layers: the same stack for fastbert.quantize's int8 Linears (AVX-512 VNNI),
// on the few-row int8 GEMM of py_quantized_linear.cpp and its per-row passes (ShortForward only).
// layer_norm_f32 is the same LayerNorm (with an optional residual added first) on its own
// (fastbert/ops/add_layer_norm.py's CPU fp32 inference path, e.g. the embeddings' LayerNorm).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu_attention.h"
#include "cpu_linear.h"
#include "cpu_passes.h"
#include "cpu_quantized.h"

namespace py = pybind11;

namespace fastbert {
namespace {

using F32 = py::array_t<float, py::array::c_style>;

constexpr int64_t kPanel = 32;

// One packed weight (linear_f32_pack's layout) and its bias: n outputs from k inputs.
struct Linear {
    F32 packed, bias;
    int64_t n, k;
    Linear(F32 p, F32 b, int64_t in, const char* name) : packed(std::move(p)), bias(std::move(b)), n(bias.size()), k(in) {
        if (bias.ndim() != 1 || packed.ndim() != 3 || packed.shape(0) != (n + kPanel - 1) / kPanel ||
            packed.shape(1) != k || packed.shape(2) != kPanel)
            throw std::invalid_argument(std::string(name) + ": packed must be (ceil(n / 32), " + std::to_string(k) +
                                        ", 32) for its bias of n entries");
        if (reinterpret_cast<uintptr_t>(packed.data()) % 64 != 0)
            throw std::invalid_argument(std::string(name) + ": packed must be 64-byte aligned");
    }
};

struct Norm {
    F32 weight, bias;
    float eps;
    Norm(F32 w, F32 b, float e, int64_t hidden, const char* name) : weight(std::move(w)), bias(std::move(b)), eps(e) {
        if (weight.ndim() != 1 || bias.ndim() != 1 || weight.size() != hidden || bias.size() != hidden)
            throw std::invalid_argument(std::string(name) + ": weight and bias must have hidden = " +
                                        std::to_string(hidden) + " entries");
    }
};

// A layer's shapes (Layer's or Int8Layer's), checked: head_dim 16, 32, ... 128, the QKV GEMM 3 x hidden
// outputs, the output projections hidden.
template <typename L>
void check_layer_shape(const L& layer, const char* name) {
    if (layer.head_dim % 16 != 0 || layer.head_dim > 128 || layer.heads < 1)
        throw std::invalid_argument(std::string(name) + " takes head_dim 16, 32, ... 128, got " +
                                    std::to_string(layer.head_dim));
    if (layer.qkv.n != 3 * layer.hidden || layer.out.n != layer.hidden || layer.ffn_out.n != layer.hidden)
        throw std::invalid_argument("qkv must give 3 x hidden outputs, out and ffn_out hidden (" +
                                    std::to_string(layer.hidden) + ")");
}

// One layer's parameters, checked once when built (python keeps it with the layer's lean plan).
class Layer {
 public:
    Layer(F32 qkv, F32 qkv_bias, F32 out, F32 out_bias, F32 norm1_weight, F32 norm1_bias, float eps1, F32 ffn_in,
          F32 ffn_in_bias, F32 ffn_out, F32 ffn_out_bias, F32 norm2_weight, F32 norm2_bias, float eps2, int64_t heads,
          int64_t head_dim)
        : hidden(heads * head_dim), heads(heads), head_dim(head_dim),
          qkv(std::move(qkv), std::move(qkv_bias), hidden, "qkv"),
          out(std::move(out), std::move(out_bias), hidden, "out"),
          ffn_in(std::move(ffn_in), std::move(ffn_in_bias), hidden, "ffn_in"),
          ffn_out(std::move(ffn_out), std::move(ffn_out_bias), this->ffn_in.n, "ffn_out"),
          norm1(std::move(norm1_weight), std::move(norm1_bias), eps1, hidden, "norm1"),
          norm2(std::move(norm2_weight), std::move(norm2_bias), eps2, hidden, "norm2") {
        check_layer_shape(*this, "layers_forward");
    }
    const int64_t hidden, heads, head_dim;
    const Linear qkv, out, ffn_in, ffn_out;
    const Norm norm1, norm2;
};

using I8 = py::array_t<int8_t, py::array::c_style>;

// One int8 weight as the few-row int8 GEMM reads it (int8_gemm_pack's panels) and the per_token
// rescale's per-column numbers (fastbert/ops/quantized_linear.py's PackedLinear): n outputs from k inputs.
struct Int8Linear {
    I8 packed;
    F32 w_scale, wsum, bias;
    int64_t n, k;
    Int8Linear(const py::tuple& parts, int64_t in, const char* name) {
        if (parts.size() != 4)
            throw std::invalid_argument(std::string(name) + ": takes (packed, w_scale, wsum, bias)");
        packed = parts[0].cast<I8>(), w_scale = parts[1].cast<F32>(), wsum = parts[2].cast<F32>();
        bias = parts[3].cast<F32>();
        n = bias.size(), k = in;
        if (bias.ndim() != 1 || w_scale.ndim() != 1 || wsum.ndim() != 1 || w_scale.size() != n || wsum.size() != n)
            throw std::invalid_argument(std::string(name) + ": w_scale, wsum and bias must have n entries");
        if (n % 16 != 0 || k % 16 != 0)
            throw std::invalid_argument(std::string(name) + ": takes n and k multiples of 16, got " + std::to_string(n) +
                                        " x " + std::to_string(k));
        if (packed.ndim() != 2 || packed.shape(0) != (n + kPanel - 1) / kPanel || packed.shape(1) != int8_panel_bytes(k))
            throw std::invalid_argument(std::string(name) + ": packed must be int8_gemm_pack's (" +
                                        std::to_string((n + kPanel - 1) / kPanel) + ", " +
                                        std::to_string(int8_panel_bytes(k)) + ")");
        if (reinterpret_cast<uintptr_t>(packed.data()) % 64 != 0)
            throw std::invalid_argument(std::string(name) + ": packed must be 64-byte aligned");
    }
    Int8Rescale rescale(const float* scale, const float* mid) const {
        return {scale, mid, wsum.data(), bias.data(), w_scale.data()};
    }
};

// A post-LayerNorm layer with int8 Linears (fastbert.quantize's per_token ones), as FastLayer.forward
// runs it: each GEMM's input quantized per row, the rescale (with the GELU, or the residual add and
// LayerNorm) after it. The same passes and the exact int32 sums torch's GEMMs give, so the same bits.
class Int8Layer {
 public:
    Int8Layer(const py::tuple& qkv, const py::tuple& out, const py::tuple& ffn_in, const py::tuple& ffn_out,
              F32 norm1_weight, F32 norm1_bias, float eps1, F32 norm2_weight, F32 norm2_bias, float eps2,
              int64_t heads, int64_t head_dim)
        : hidden(heads * head_dim), heads(heads), head_dim(head_dim), qkv(qkv, hidden, "qkv"), out(out, hidden, "out"),
          ffn_in(ffn_in, hidden, "ffn_in"), ffn_out(ffn_out, this->ffn_in.n, "ffn_out"),
          norm1(std::move(norm1_weight), std::move(norm1_bias), eps1, hidden, "norm1"),
          norm2(std::move(norm2_weight), std::move(norm2_bias), eps2, hidden, "norm2") {
        check_layer_shape(*this, "Int8Layer");
    }
    const int64_t hidden, heads, head_dim;
    const Int8Linear qkv, out, ffn_in, ffn_out;
    const Norm norm1, norm2;
};

#ifdef FASTBERT_AVX512
// LayerNorm of each row of x (rows, n) in place: two passes over a row that stays in L1.
AVX512 void layer_norm_rows(float* x, int64_t rows, int64_t n, const Norm& norm) {
    const float *w = norm.weight.data(), *b = norm.bias.data();
    const int64_t full = n / 16 * 16;
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - full)) - 1);
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x + r * n;
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < full; c += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(row + c));
        if (tail) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tail, row + full));
        const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(sum) / static_cast<float>(n));
        __m512 sq = _mm512_setzero_ps();
        for (int64_t c = 0; c < full; c += 16) {
            const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(row + c), mean);
            sq = _mm512_fmadd_ps(d, d, sq);
        }
        if (tail) {
            const __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, row + full), mean);
            sq = _mm512_fmadd_ps(d, d, sq);
        }
        const __m512 rstd =
            _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(n) + norm.eps));
        for (int64_t c = 0; c < full; c += 16) {
            const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + c), mean), rstd);
            _mm512_storeu_ps(row + c, _mm512_fmadd_ps(d, _mm512_loadu_ps(w + c), _mm512_loadu_ps(b + c)));
        }
        if (tail) {
            const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + full), mean), rstd);
            _mm512_mask_storeu_ps(row + full, tail,
                                  _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(tail, w + full), _mm512_maskz_loadu_ps(tail, b + full)));
        }
    }
}
#endif

#ifdef FASTBERT_AVX512
// A forward's steps in order, each cut into chunks that any thread of the forward may take: a thread
// takes the current step's next chunk until none is left, waits for the chunks others took, then goes
// on to the next step. No thread waits for another to start: a worker that wakes late joins at the
// current step, and without one the caller takes every chunk. One pool run per forward, where one per
// GEMM cost each a few microseconds of locks and wake-ups, and a short text's attention and
// LayerNorms ran on the caller alone. Which thread runs a chunk changes no result.
class Schedule {
 public:
    void add(int64_t chunks, std::function<void(int64_t)> fn) { steps_.push_back({chunks, std::move(fn)}); }

    void run(int threads) {
        counters_.reset(new Counter[steps_.size()]);
        run_tasks(threads, threads, [&](int64_t) { take_part(); });
        if (error_) std::rethrow_exception(error_);
    }

 private:
    struct alignas(64) Counter {
        std::atomic<int64_t> next{0}, done{0};
    };
    struct Step {
        int64_t chunks;
        std::function<void(int64_t)> fn;
    };

    void take_part() {
        for (size_t s = 0; s < steps_.size(); ++s) {
            Counter& c = counters_[s];
            const Step& step = steps_[s];
            for (int64_t i; (i = c.next.fetch_add(1, std::memory_order_relaxed)) < step.chunks;) {
                if (!failed_.load(std::memory_order_relaxed)) {
                    try {
                        step.fn(i);
                    } catch (...) {   // counted done all the same: no thread may wait for it forever
                        std::lock_guard<std::mutex> lock(mu_);
                        if (!error_) error_ = std::current_exception();
                        failed_ = true;
                    }
                }
                c.done.fetch_add(1, std::memory_order_release);
            }
            for (unsigned spins = 1; c.done.load(std::memory_order_acquire) < step.chunks; ++spins) {
                if (spins % 1024 == 0) std::this_thread::yield();   // the chunk's thread may have lost its core
                _mm_pause();
            }
        }
    }

    std::vector<Step> steps_;
    std::unique_ptr<Counter[]> counters_;
    std::atomic<bool> failed_{false};
    std::mutex mu_;
    std::exception_ptr error_;
};

// A step's chunks: one contiguous range per thread. Each thread then streams one run of panels (or
// heads), which the hardware prefetcher follows; four chunks per thread, taken in turn, made a
// 18-token forward 5-10% slower (2 threads) than one pool run per GEMM, one per thread 3-6% faster.
int64_t chunks_of(int64_t items, int threads) { return std::max<int64_t>(1, std::min<int64_t>(items, threads)); }

// h (tokens, hidden) in place through every layer, on `bounds` ((batch + 1,) checked cumulative
// lengths), as one Schedule run on up to `threads` threads. The caller has checked the shapes and
// released the GIL.
void run_layers(float* h, int64_t tokens, const int64_t* bounds, int64_t batch, const std::vector<const Layer*>& layers,
                float scale, int threads) {
    const int64_t hidden = layers[0]->hidden, heads = layers[0]->heads, head_dim = layers[0]->head_dim;
    int64_t widest = 0;
    for (const Layer* layer : layers) widest = std::max(widest, layer->ffn_in.n);
    std::vector<float> qkv(tokens * 3 * hidden), ctx(tokens * hidden), mid(tokens * hidden), ffn(tokens * widest);
    threads = std::max(1, threads);
    // a GEMM step: out = in W^T + bias (+ epilogue) over chunks of panels
    const auto gemm = [&](Schedule& plan, const float* in, int64_t k, const Linear& w, Epilogue epilogue,
                          const float* residual, float* out) {
        const int64_t panels = (w.n + kPanel - 1) / kPanel, chunks = chunks_of(panels, threads);
        plan.add(chunks, [=, &w](int64_t i) {
            linear_panels(in, tokens, k, w.packed.data(), w.n, w.bias.data(), epilogue, residual, out,
                          panels * i / chunks, panels * (i + 1) / chunks);
        });
    };
    // a LayerNorm step, in row ranges when the rows are many (below, the other core's cache misses on
    // the rows cost more than half the pass)
    constexpr int64_t kMinValuesPerChunk = 1 << 14;
    const int64_t norm_chunks = std::max<int64_t>(1, std::min<int64_t>(threads, tokens * hidden / kMinValuesPerChunk));
    const auto norm = [&](Schedule& plan, float* rows, const Norm& n) {
        plan.add(norm_chunks, [=, &n](int64_t i) {
            const int64_t r0 = tokens * i / norm_chunks, r1 = tokens * (i + 1) / norm_chunks;
            layer_norm_rows(rows + r0 * hidden, r1 - r0, hidden, n);
        });
    };
    Schedule plan;
    for (const Layer* L : layers) {
        const float* q = qkv.data();
        gemm(plan, h, hidden, L->qkv, Epilogue::kNone, nullptr, qkv.data());
        const int64_t tasks = batch * heads, chunks = chunks_of(tasks, threads);   // (sequence, head) tasks
        plan.add(chunks, [=, &ctx](int64_t c) {
            for (int64_t t = tasks * c / chunks; t < tasks * (c + 1) / chunks; ++t)
                attention_task(q, q + hidden, q + 2 * hidden, 3 * hidden, 3 * hidden, 3 * hidden, bounds, heads,
                               head_dim, ctx.data(), scale, t);
        });
        gemm(plan, ctx.data(), hidden, L->out, Epilogue::kResidual, h, mid.data());
        norm(plan, mid.data(), L->norm1);
        gemm(plan, mid.data(), hidden, L->ffn_in, Epilogue::kGelu, nullptr, ffn.data());
        gemm(plan, ffn.data(), L->ffn_in.n, L->ffn_out, Epilogue::kResidual, mid.data(), h);
        norm(plan, h, L->norm2);
    }
    plan.run(threads);
}

// run_layers for Int8Layers: h (tokens, hidden) in place, the same Schedule of steps, each GEMM's input
// quantized per row (scales and midpoints in rs / rm) and given to the GEMM as unsigned codes.
void run_int8_layers(float* h, int64_t tokens, const int64_t* bounds, int64_t batch,
                     const std::vector<const Int8Layer*>& layers, float scale, int threads) {
    const int64_t hidden = layers[0]->hidden, heads = layers[0]->heads, head_dim = layers[0]->head_dim;
    int64_t widest = 0;
    for (const Int8Layer* layer : layers) widest = std::max(widest, layer->ffn_in.n);
    std::vector<float> qkv(tokens * 3 * hidden), ctx(tokens * hidden), mid(tokens * hidden), ffn(tokens * widest);
    std::vector<int32_t> sums(tokens * hidden);
    std::vector<int8_t> codes(tokens * widest);
    std::vector<uint8_t> u(tokens * widest);
    std::vector<float> rs(tokens), rm(tokens);
    threads = std::max(1, threads);
    // a GEMM step: out = the rows' codes (u, k per row) times w, stored as `store` says, in chunks of panels
    const auto gemm = [&](Schedule& plan, int64_t k, const Int8Linear& w, Int8Store store, void* out) {
        const int64_t panels = (w.n + kPanel - 1) / kPanel, chunks = chunks_of(panels, threads);
        plan.add(chunks, [=, &w, &u, &rs, &rm](int64_t i) {
            int8_gemm_panels(u.data(), tokens, k, w.packed.data(), w.n, store, w.rescale(rs.data(), rm.data()), out,
                             panels * i / chunks, panels * (i + 1) / chunks);
        });
    };
    // a step on row ranges (one when the rows are few, as run_layers' LayerNorm)
    constexpr int64_t kMinValuesPerChunk = 1 << 14;
    const auto rows_step = [&](Schedule& plan, int64_t width, std::function<void(int64_t, int64_t)> fn) {
        const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads, tokens * width / kMinValuesPerChunk));
        plan.add(chunks, [=](int64_t i) { fn(tokens * i / chunks, tokens * (i + 1) / chunks); });
    };
    // rows [r0, r1) of x (width k) quantized, as the next GEMM takes them
    const auto quantize = [&](const float* x, int64_t k, int64_t r0, int64_t r1) {
        int8_quantize_rows_avx512(x + r0 * k, codes.data() + r0 * k, rs.data() + r0, rm.data() + r0, r1 - r0, k);
        int8_to_unsigned(codes.data() + r0 * k, u.data() + r0 * k, (r1 - r0) * k);
    };
    // rows [r0, r1) of y = LayerNorm(rescale(sums) + res), by w's rescale
    const auto add_norm = [&](const Int8Linear& w, const float* res, const Norm& n, float* y, int64_t r0, int64_t r1) {
        int8_rescale_add_norm_avx512(sums.data() + r0 * hidden, w.rescale(rs.data() + r0, rm.data() + r0),
                                     y + r0 * hidden, res + r0 * hidden, n.weight.data(), n.bias.data(), n.eps,
                                     r1 - r0, hidden);
    };
    Schedule plan;
    rows_step(plan, hidden, [=, &quantize](int64_t r0, int64_t r1) { quantize(h, hidden, r0, r1); });
    for (size_t li = 0; li < layers.size(); ++li) {
        const Int8Layer* L = layers[li];
        const bool last = li + 1 == layers.size();
        const float* q = qkv.data();
        gemm(plan, hidden, L->qkv, Int8Store::kRescale, qkv.data());
        const int64_t tasks = batch * heads, chunks = chunks_of(tasks, threads);   // (sequence, head) tasks
        plan.add(chunks, [=, &ctx](int64_t c) {
            for (int64_t t = tasks * c / chunks; t < tasks * (c + 1) / chunks; ++t)
                attention_task(q, q + hidden, q + 2 * hidden, 3 * hidden, 3 * hidden, 3 * hidden, bounds, heads,
                               head_dim, ctx.data(), scale, t);
        });
        rows_step(plan, hidden, [=, &quantize, &ctx](int64_t r0, int64_t r1) { quantize(ctx.data(), hidden, r0, r1); });
        gemm(plan, hidden, L->out, Int8Store::kSums, sums.data());
        rows_step(plan, hidden, [=, &add_norm, &quantize, &mid](int64_t r0, int64_t r1) {
            add_norm(L->out, h, L->norm1, mid.data(), r0, r1);
            quantize(mid.data(), hidden, r0, r1);
        });
        gemm(plan, hidden, L->ffn_in, Int8Store::kRescaleGelu, ffn.data());
        const int64_t width = L->ffn_in.n;
        rows_step(plan, width, [=, &quantize, &ffn](int64_t r0, int64_t r1) { quantize(ffn.data(), width, r0, r1); });
        gemm(plan, width, L->ffn_out, Int8Store::kSums, sums.data());
        rows_step(plan, hidden, [=, &add_norm, &quantize, &mid](int64_t r0, int64_t r1) {
            add_norm(L->ffn_out, mid.data(), L->norm2, h, r0, r1);
            if (!last) quantize(h, hidden, r0, r1);
        });
    }
    plan.run(threads);
}
#endif

// The layers' common shape (hidden), checked: one (heads, head_dim) for all.
template <typename L>
int64_t stack_width(const std::vector<const L*>& layers, const char* name) {
    for (const L* layer : layers)
        if (layer->hidden != layers[0]->hidden || layer->heads != layers[0]->heads ||
            layer->head_dim != layers[0]->head_dim)
            throw std::invalid_argument(std::string(name) + " takes layers of one shape (heads, head_dim)");
    return layers[0]->hidden;
}

// x (tokens, hidden) in place through every layer; cu_seqlens (batch + 1,) int64 bounds. False
// (x untouched) where this CPU or build has no AVX-512.
bool layers_forward(F32& x, const py::array_t<int64_t, py::array::c_style>& cu_seqlens,
                    const std::vector<const Layer*>& layers, float scale, int threads) {
    if (layers.empty()) return true;
    const int64_t hidden = stack_width(layers, "layers_forward");
    auto bx = x.request(true);
    if (bx.ndim != 2 || bx.shape[1] != hidden)
        throw std::invalid_argument("x must be (tokens, " + std::to_string(hidden) + ")");
    const int64_t tokens = bx.shape[0], batch = cu_seqlens.size() - 1;
    const int64_t* bounds = cu_seqlens.data();
    if (cu_seqlens.ndim() != 1 || batch < 0 || bounds[0] != 0 || bounds[batch] != tokens)
        throw std::invalid_argument("cu_seqlens must be 1-D, start at 0 and end at the token count");
    for (int64_t b = 0; b < batch; ++b)
        if (bounds[b + 1] < bounds[b]) throw std::invalid_argument("cu_seqlens must not decrease");
#ifdef FASTBERT_AVX512
    if (!has_avx512()) return false;
    py::gil_scoped_release nogil;
    run_layers(static_cast<float*>(bx.ptr), tokens, bounds, batch, layers, scale, threads);
    return true;
#else
    (void)scale, (void)threads;
    return false;
#endif
}

// out = LayerNorm(x + residual) over each row (residual may be None); all (rows, n) contiguous. Each
// row is computed alone with the same instructions, so its bits do not depend on the other rows (the
// int8 path relies on that). A large input is split into row ranges over up to `threads` threads.
// False (nothing written) where this CPU or build has no AVX-512.
bool layer_norm_f32(const F32& x, const std::optional<F32>& residual, const F32& weight, const F32& bias, float eps,
                    F32& out, int threads) {
    if (x.ndim() != 2 || out.ndim() != 2 || out.shape(0) != x.shape(0) || out.shape(1) != x.shape(1))
        throw std::invalid_argument("layer_norm_f32 takes x and out of one shape (rows, n)");
    if (residual && (residual->ndim() != 2 || residual->shape(0) != x.shape(0) || residual->shape(1) != x.shape(1)))
        throw std::invalid_argument("residual must have x's shape");
    const int64_t rows = x.shape(0), n = x.shape(1);
    const Norm norm(weight, bias, eps, n, "layer_norm_f32");
#ifdef FASTBERT_AVX512
    if (!has_avx512()) return false;
    const float *xp = x.data(), *rp = residual ? residual->data() : nullptr;
    float* op = out.mutable_data();
    py::gil_scoped_release nogil;
    constexpr int64_t kMinValuesPerTask = 1 << 16;   // below, a worker's wake-up costs more than it saves
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>({threads, rows, rows * n / kMinValuesPerTask}));
    run_tasks(tasks, threads, [&](int64_t t) {
        const int64_t r0 = rows * t / tasks, r1 = rows * (t + 1) / tasks;
        for (int64_t i = r0 * n; i < r1 * n; ++i) op[i] = rp ? xp[i] + rp[i] : xp[i];
        layer_norm_rows(op + r0 * n, r1 - r0, n, norm);
    });
    return true;
#else
    (void)rows, (void)threads;
    return false;
#endif
}

using I64 = py::array_t<int64_t, py::array::c_style>;

// A table's row index, checked: an out-of-range id is an IndexError naming the table, never a read
// past its end.
int64_t row_of(const int64_t* ids, int64_t i, int64_t rows, const char* what) {
    const int64_t id = ids[i];
    if (id < 0 || id >= rows)
        throw py::index_error(std::string(what) + " " + std::to_string(id) + " at token " + std::to_string(i) +
                              " is out of range for its table of " + std::to_string(rows) + " rows");
    return id;
}

// The embedding tables, checked: word and position (rows, n), token_type (at least one row of n) or None.
void check_tables(const F32& word, const F32& position, const std::optional<F32>& token_type, int64_t n,
                  const std::string& name) {
    if (n < 1 || word.ndim() != 2 || word.shape(1) != n || position.ndim() != 2 || position.shape(1) != n ||
        (token_type && (token_type->ndim() != 2 || token_type->shape(1) != n || token_type->shape(0) < 1)))
        throw std::invalid_argument(name + " takes embedding tables (rows, n) of one width n = " + std::to_string(n));
}

#ifdef FASTBERT_AVX512
// out rows r0..r1 = LayerNorm(word + (position + token_type)) of each token's three table rows
// (rows[3 r], rows[3 r + 1], rows[3 r + 2] or nullptr: no type table), the sum in that order.
void embed_rows(const float* const* rows, int64_t r0, int64_t r1, int64_t n, const Norm& norm, float* out) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *wr = rows[3 * r], *pr = rows[3 * r + 1], *tr = rows[3 * r + 2];
        float* o = out + r * n;
        for (int64_t c = 0; c < n; ++c) o[c] = wr[c] + (tr ? pr[c] + tr[c] : pr[c]);
    }
    layer_norm_rows(out + r0 * n, r1 - r0, n, norm);
}
#endif

// out = LayerNorm(word[ids] + (position[positions] + token_type[types])) over each row, the sum in that
// order as the embeddings module's torch ops add it; types None adds token_type's row 0 (all type 0),
// token_type None adds nothing. All arrays contiguous, the tables (rows, n). Rows are independent
// (the same instructions whatever the batch); a large input is split over up to `threads` threads.
// False (nothing written) where this CPU or build has no AVX-512.
bool embed_layer_norm_f32(const I64& ids, const I64& positions, const std::optional<I64>& types, const F32& word,
                          const F32& position, const std::optional<F32>& token_type, const F32& weight,
                          const F32& bias, float eps, F32& out, int threads) {
    const int64_t tokens = ids.size(), n = word.ndim() == 2 ? word.shape(1) : -1;
    if (ids.ndim() != 1 || positions.ndim() != 1 || positions.size() != tokens || (types && (types->ndim() != 1 ||
        types->size() != tokens)))
        throw std::invalid_argument("embed_layer_norm_f32 takes ids, positions and types of one shape (tokens,)");
    check_tables(word, position, token_type, n, "embed_layer_norm_f32");
    if (types && !token_type) throw std::invalid_argument("types need a token_type table");
    if (out.ndim() != 2 || out.shape(0) != tokens || out.shape(1) != n)
        throw std::invalid_argument("out must be (tokens, " + std::to_string(n) + ")");
    const Norm norm(weight, bias, eps, n, "embed_layer_norm_f32");
    const int64_t *id = ids.data(), *pos = positions.data(), *type = types ? types->data() : nullptr;
    const float *w = word.data(), *p = position.data(), *t = token_type ? token_type->data() : nullptr;
    std::vector<const float*> rows(3 * tokens);   // checked before any thread starts: errors surface here
    for (int64_t i = 0; i < tokens; ++i) {
        rows[3 * i] = w + row_of(id, i, word.shape(0), "input id") * n;
        rows[3 * i + 1] = p + row_of(pos, i, position.shape(0), "position id") * n;
        rows[3 * i + 2] = t ? t + (type ? row_of(type, i, token_type->shape(0), "token type id") : 0) * n : nullptr;
    }
#ifdef FASTBERT_AVX512
    if (!has_avx512()) return false;
    float* op = out.mutable_data();
    py::gil_scoped_release nogil;
    constexpr int64_t kMinValuesPerTask = 1 << 16;   // as layer_norm_f32
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>({threads, tokens, tokens * n / kMinValuesPerTask}));
    run_tasks(tasks, threads, [&](int64_t task) {
        embed_rows(rows.data(), tokens * task / tasks, tokens * (task + 1) / tasks, n, norm, op);
    });
    return true;
#else
    (void)threads;
    return false;
#endif
}

// One short sequence's whole forward (fastbert/models/short_forward.py: a CPU float32 batch of one
// text): the embeddings' lookups and LayerNorm as embed_layer_norm_f32 gives them (type 0, positions
// offset, offset + 1, ...), then every layer as layers_forward (Layers) or run_int8_layers (Int8Layers,
// on AVX-512 VNNI), in one call from a list of token ids.
// A short text's forward streams the weights through the caches, so each Python step around it runs
// cold: here the embeddings, the layers and their conversions are one step. The arrays are the
// model's own (views), held here; Python checks before each call that they still are.
class ShortForward {
 public:
    ShortForward(F32 word, F32 position, std::optional<F32> token_type, F32 weight, F32 bias, float eps,
                 int64_t offset, py::list layers, float scale)
        : word_(std::move(word)), position_(std::move(position)), token_type_(std::move(token_type)),
          norm_(std::move(weight), std::move(bias), eps, word_.ndim() == 2 ? word_.shape(1) : -1, "ShortForward"),
          offset_(offset), scale_(scale), held_(std::move(layers)) {
        for (const py::handle layer : held_) {
            if (py::isinstance<Int8Layer>(layer)) int8_.push_back(layer.cast<const Int8Layer*>());
            else layers_.push_back(layer.cast<const Layer*>());
        }
        if (layers_.empty() == int8_.empty())
            throw std::invalid_argument("ShortForward takes at least one layer, all Layers or all Int8Layers");
        hidden_ = layers_.empty() ? stack_width(int8_, "ShortForward") : stack_width(layers_, "ShortForward");
        check_tables(word_, position_, token_type_, hidden_, "ShortForward");   // the layers' width
        if (offset_ < 0) throw std::invalid_argument("ShortForward takes a position offset >= 0");
    }

    // ids -> the last layer's output (tokens, hidden); None where this CPU or build has no AVX-512.
    py::object run(const std::vector<int64_t>& ids, int threads) const {
        const int64_t tokens = static_cast<int64_t>(ids.size());
        if (tokens < 1) throw std::invalid_argument("ShortForward.run takes at least one token id");
        if (offset_ + tokens > position_.shape(0))
            throw py::index_error("position id " + std::to_string(offset_ + tokens - 1) + " is out of range for its "
                                  "table of " + std::to_string(position_.shape(0)) + " rows");
        const float *w = word_.data(), *p = position_.data(), *t = token_type_ ? token_type_->data() : nullptr;
        std::vector<const float*> rows(3 * tokens);
        for (int64_t i = 0; i < tokens; ++i) {
            rows[3 * i] = w + row_of(ids.data(), i, word_.shape(0), "input id") * hidden_;
            rows[3 * i + 1] = p + (offset_ + i) * hidden_;
            rows[3 * i + 2] = t;
        }
#ifdef FASTBERT_AVX512
        if (!has_avx512() || (!int8_.empty() && !int8_gemm_available())) return py::none();
        F32 out({tokens, hidden_});
        float* h = out.mutable_data();
        const int64_t bounds[2] = {0, tokens};
        {
            py::gil_scoped_release nogil;
            embed_rows(rows.data(), 0, tokens, hidden_, norm_, h);
            if (int8_.empty()) run_layers(h, tokens, bounds, 1, layers_, scale_, threads);
            else run_int8_layers(h, tokens, bounds, 1, int8_, scale_, threads);
        }
        return std::move(out);
#else
        (void)threads;
        return py::none();
#endif
    }

 private:
    F32 word_, position_;
    std::optional<F32> token_type_;
    Norm norm_;
    int64_t offset_, hidden_ = 0;
    float scale_;
    py::list held_;   // keeps the layer objects alive
    std::vector<const Layer*> layers_;
    std::vector<const Int8Layer*> int8_;
};

}  // namespace

void bind_layers(py::module_& m) {
    py::class_<Layer>(m, "Layer")
        .def(py::init<F32, F32, F32, F32, F32, F32, float, F32, F32, F32, F32, F32, F32, float, int64_t, int64_t>(),
             py::arg("qkv").noconvert(), py::arg("qkv_bias").noconvert(), py::arg("out").noconvert(),
             py::arg("out_bias").noconvert(), py::arg("norm1_weight").noconvert(), py::arg("norm1_bias").noconvert(),
             py::arg("eps1"), py::arg("ffn_in").noconvert(), py::arg("ffn_in_bias").noconvert(),
             py::arg("ffn_out").noconvert(), py::arg("ffn_out_bias").noconvert(), py::arg("norm2_weight").noconvert(),
             py::arg("norm2_bias").noconvert(), py::arg("eps2"), py::arg("heads"), py::arg("head_dim"));
    py::class_<Int8Layer>(m, "Int8Layer")
        .def(py::init<const py::tuple&, const py::tuple&, const py::tuple&, const py::tuple&, F32, F32, float, F32, F32,
                      float, int64_t, int64_t>(),
             py::arg("qkv"), py::arg("out"), py::arg("ffn_in"), py::arg("ffn_out"), py::arg("norm1_weight").noconvert(),
             py::arg("norm1_bias").noconvert(), py::arg("eps1"), py::arg("norm2_weight").noconvert(),
             py::arg("norm2_bias").noconvert(), py::arg("eps2"), py::arg("heads"), py::arg("head_dim"));
    m.def("layer_norm_f32", &layer_norm_f32, py::arg("x").noconvert(), py::arg("residual").noconvert().none(true),
          py::arg("weight").noconvert(), py::arg("bias").noconvert(), py::arg("eps"), py::arg("out").noconvert(),
          py::arg("threads") = 1);
    m.def("embed_layer_norm_f32", &embed_layer_norm_f32, py::arg("ids").noconvert(), py::arg("positions").noconvert(),
          py::arg("types").noconvert().none(true), py::arg("word").noconvert(), py::arg("position").noconvert(),
          py::arg("token_type").noconvert().none(true), py::arg("weight").noconvert(), py::arg("bias").noconvert(),
          py::arg("eps"), py::arg("out").noconvert(), py::arg("threads") = 1);
    py::class_<ShortForward>(m, "ShortForward")
        .def(py::init<F32, F32, std::optional<F32>, F32, F32, float, int64_t, py::list, float>(),
             py::arg("word").noconvert(), py::arg("position").noconvert(), py::arg("token_type").noconvert().none(true),
             py::arg("weight").noconvert(), py::arg("bias").noconvert(), py::arg("eps"), py::arg("offset"),
             py::arg("layers"), py::arg("scale"))
        .def("run", &ShortForward::run, py::arg("ids"), py::arg("threads") = 1);
    m.def("layers_forward", &layers_forward, py::arg("x").noconvert(), py::arg("cu_seqlens").noconvert(),
          py::arg("layers"), py::arg("scale"), py::arg("threads") = 1);
}

}  // namespace fastbert
