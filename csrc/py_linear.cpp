// fastbert's own fp32 GEMM for a few dozen rows (fastbert/ops/linear.py: a batch-1 text's layers):
//   linear_f32_pack   weight (n, k) -> packed (ceil(n / 32), k, 32): 32-column panels, each stored k
//                     by k, the columns past n zero
//   linear_f32        out (m, n) = x (m, k) W^T + bias, then nothing, the erf GELU, or + residual,
//                     in the kernel's store
// At a few dozen rows a GEMM mostly streams its weight, so each panel is read from memory once and
// used for every row of x, while the next one is prefetched; x (a few dozen rows of k floats) stays
// in the L2 cache. The microkernel keeps R x 32 outputs (R <= 14: 28 of the 32 vector registers)
// and sums x[r][j] * W[c][j] over slices of 256 j in ascending order, one fused multiply-add each,
// then adds the slices' sums in order, whatever R: a row's result does not depend on the other
// rows, on m, or on the thread count (the panels are split over the threads). AVX-512 only:
// linear_f32_available() is false elsewhere, and Python keeps MKL's GEMM there.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "cpu_linear.h"
#include "cpu_passes.h"

namespace py = pybind11;

namespace fastbert {
namespace {

constexpr int64_t kPanel = 32;  // columns per panel: two vectors
constexpr int kMaxRows = 14;    // rows per microkernel call
constexpr int64_t kSlice = 256; // k values per microkernel call: a slice of panel (32 KB) and x stay in L1

using F32 = py::array_t<float, py::array::c_style>;

bool available() {
#ifdef FASTBERT_AVX512
    return has_avx512();
#else
    return false;
#endif
}

#ifdef FASTBERT_AVX512

// What one call computes, shared by every row block and panel.
struct Gemm {
    const float *x, *packed, *bias, *residual;  // bias, residual: null when absent
    float* out;
    int64_t m, n, k;
    Epilogue epilogue;
};

// Rows [r0, r0 + R) times panel p over k in [j0, j1): the sum of that slice starts at zero and is
// added to the row's total in out (the bias, when j0 is 0); after the last slice the epilogue runs
// on the total before the (masked, for the last panel) store. prefetch: the weights that follow the
// slice in memory (the next slice or panel) are brought in meanwhile.
template <int R>
AVX512 void microkernel(const Gemm& g, int64_t r0, int64_t p, int64_t j0, int64_t j1, bool prefetch) {
    const int64_t c0 = p * kPanel, cols = std::min<int64_t>(kPanel, g.n - c0), k = g.k;
    const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
    const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const float* w = g.packed + (p * k + j0) * kPanel;
    const float* x = g.x + r0 * k;
    const char* next = reinterpret_cast<const char*>(w + (prefetch ? (j1 - j0) * kPanel : 0));
    for (int64_t j = j0; j < j1; ++j, w += kPanel, next += kPanel * sizeof(float)) {
        _mm_prefetch(next, _MM_HINT_T0);
        _mm_prefetch(next + 64, _MM_HINT_T0);
        const __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16);
        for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_set1_ps(x[r * k + j]);
            acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
        }
    }
    __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
    if (j0 == 0 && g.bias) {
        t0 = _mm512_maskz_loadu_ps(m0, g.bias + c0);
        t1 = _mm512_maskz_loadu_ps(m1, g.bias + c0 + 16);
    }
    for (int r = 0; r < R; ++r) {
        float* o = g.out + (r0 + r) * g.n + c0;
        if (j0 > 0) t0 = _mm512_maskz_loadu_ps(m0, o), t1 = _mm512_maskz_loadu_ps(m1, o + 16);
        __m512 v0 = _mm512_add_ps(t0, acc[r][0]), v1 = _mm512_add_ps(t1, acc[r][1]);
        if (j1 == k && g.epilogue == Epilogue::kGelu) {
            v0 = gelu_avx512(v0), v1 = gelu_avx512(v1);
        } else if (j1 == k && g.epilogue == Epilogue::kResidual) {
            const float* res = g.residual + (r0 + r) * g.n + c0;
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, res));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, res + 16));
        }
        _mm512_mask_storeu_ps(o, m0, v0);
        _mm512_mask_storeu_ps(o + 16, m1, v1);
    }
}

using Kernel = void (*)(const Gemm&, int64_t, int64_t, int64_t, int64_t, bool);

template <int... R>
constexpr auto kernel_table(std::integer_sequence<int, R...>) {
    return std::array<Kernel, sizeof...(R)>{&microkernel<R + 1>...};
}

// Panels [p0, p1), each in slices of kSlice k values, each slice used for every row block while it
// is in L1 (the rows split into blocks of near-equal size, at most kMaxRows each: 26 rows are
// 13 + 13). Summing a row's slices apart halves the rounding error of one running sum over k = 1536.
AVX512 void run_panels(const Gemm& g, int64_t p0, int64_t p1) {
    static constexpr auto kernels = kernel_table(std::make_integer_sequence<int, kMaxRows>{});
    const int64_t blocks = (g.m + kMaxRows - 1) / kMaxRows;
    for (int64_t p = p0; p < p1; ++p) {
        for (int64_t j0 = 0; j0 < g.k; j0 += kSlice) {
            const int64_t j1 = std::min(g.k, j0 + kSlice);
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t r0 = g.m * b / blocks, r1 = g.m * (b + 1) / blocks;
                kernels[r1 - r0 - 1](g, r0, p, j0, j1, b == blocks - 1 && (p + 1 < p1 || j1 < g.k));
            }
        }
    }
}

#endif

int64_t panels_of(int64_t n) { return (n + kPanel - 1) / kPanel; }

// out holds a row's partial sums between k slices: it may share no memory with an input
bool overlap(const float* a, int64_t a_size, const float* b, int64_t b_size) {
    return a < b + b_size && b < a + a_size;
}

void require_available() {
    if (!available()) throw std::runtime_error("linear_f32 needs a CPU with AVX-512 (linear_f32_available())");
}

void pack(const F32& weight, F32& packed) {
    require_available();
    const auto bw = weight.request(), bp = packed.request(true);
    if (bw.ndim != 2) throw std::invalid_argument("linear_f32_pack takes a weight (n, k)");
    const int64_t n = bw.shape[0], k = bw.shape[1];
    if (bp.ndim != 3 || bp.shape[0] != panels_of(n) || bp.shape[1] != k || bp.shape[2] != kPanel)
        throw std::invalid_argument("packed must have shape (" + std::to_string(panels_of(n)) + ", " +
                                    std::to_string(k) + ", 32) for a weight (" + std::to_string(n) + ", " +
                                    std::to_string(k) + ")");
    if (reinterpret_cast<uintptr_t>(bp.ptr) % 64 != 0) throw std::invalid_argument("packed must be 64-byte aligned");
    const auto* w = static_cast<const float*>(bw.ptr);
    auto* out = static_cast<float*>(bp.ptr);
    py::gil_scoped_release nogil;
    for (int64_t p = 0; p < panels_of(n); ++p)
        for (int64_t j = 0; j < k; ++j)
            for (int64_t c = 0; c < kPanel; ++c) {
                const int64_t row = p * kPanel + c;
                out[(p * k + j) * kPanel + c] = row < n ? w[row * k + j] : 0.0f;
            }
}

void linear(const F32& x, const F32& packed, const std::optional<F32>& bias, F32& out,
            const std::optional<F32>& residual, bool gelu, int threads) {
    require_available();
    const auto bx = x.request(), bp = packed.request(), bo = out.request(true);
    if (bx.ndim != 2 || bp.ndim != 3 || bp.shape[2] != kPanel || bp.shape[1] != bx.shape[1])
        throw std::invalid_argument("linear_f32 takes x (m, k) and packed (panels, k, 32) with the same k");
    const int64_t m = bx.shape[0], k = bx.shape[1];
    if (bo.ndim != 2 || bo.shape[0] != m || panels_of(bo.shape[1]) != bp.shape[0])
        throw std::invalid_argument("out must be (m, n) with packed's ceil(n / 32) panels");
    if (reinterpret_cast<uintptr_t>(bp.ptr) % 64 != 0) throw std::invalid_argument("packed must be 64-byte aligned");
    const int64_t n = bo.shape[1];
    if (bias && (bias->ndim() != 1 || bias->shape(0) != n)) throw std::invalid_argument("bias must have n entries");
    if (residual && gelu) throw std::invalid_argument("linear_f32 takes one epilogue: gelu or a residual, not both");
    if (residual && (residual->ndim() != 2 || residual->shape(0) != m || residual->shape(1) != n))
        throw std::invalid_argument("residual must have out's shape");
    const float* bias_p = bias ? bias->data() : nullptr;
    const float* res_p = residual ? residual->data() : nullptr;
    const auto* out_p = static_cast<const float*>(bo.ptr);
    const auto* x_p = static_cast<const float*>(bx.ptr);
    if (overlap(out_p, m * n, x_p, m * k) || (res_p && overlap(out_p, m * n, res_p, m * n)))
        throw std::invalid_argument("out must not share memory with x or the residual");
    if (m == 0 || n == 0) return;
    py::gil_scoped_release nogil;
    linear_rows(x_p, m, k, static_cast<const float*>(bp.ptr), n, bias_p,
                gelu ? Epilogue::kGelu : res_p ? Epilogue::kResidual : Epilogue::kNone, res_p,
                static_cast<float*>(bo.ptr), threads);
}

}  // namespace

void linear_rows(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                 Epilogue epilogue, const float* residual, float* out, int threads) {
#ifdef FASTBERT_AVX512
    const Gemm g{x, packed, bias, residual, out, m, n, k, epilogue};
    const int64_t panels = panels_of(n);
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(threads, panels));
    run_tasks(tasks, threads, [&](int64_t i) { run_panels(g, panels * i / tasks, panels * (i + 1) / tasks); });
#else
    (void)x, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)epilogue, (void)residual, (void)out;
    (void)threads;
#endif
}

void linear_panels(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                   Epilogue epilogue, const float* residual, float* out, int64_t p0, int64_t p1) {
#ifdef FASTBERT_AVX512
    run_panels(Gemm{x, packed, bias, residual, out, m, n, k, epilogue}, p0, p1);
#else
    (void)x, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)epilogue, (void)residual, (void)out;
    (void)p0, (void)p1;
#endif
}

void bind_linear(py::module_& m) {
    m.def("linear_f32_available", &available);
    // noconvert: a wrong dtype or a strided array is an error, never a silent copy the result is lost in
    m.def("linear_f32_pack", &pack, py::arg("weight").noconvert(), py::arg("packed").noconvert());
    m.def("linear_f32", &linear, py::arg("x").noconvert(), py::arg("packed").noconvert(),
          py::arg("bias").noconvert().none(true), py::arg("out").noconvert(),
          py::arg("residual").noconvert().none(true), py::arg("gelu"), py::arg("threads") = 1);
}

}  // namespace fastbert
