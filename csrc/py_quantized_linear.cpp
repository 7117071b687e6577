// The row-wise passes around fastbert's dynamic int8 GEMM (fastbert/ops/quantized_linear.py), each
// one pass over memory instead of several torch ops (about a third of an int8 encode before):
//   quantize_rows  x (rows, k) float32 -> q int8, scale, mid per row: x ~= mid_r + scale_r * q,
//                  mid_r = (max + min) / 2, scale_r = (max - min) / 254, q = round((x - mid) / scale)
//                  (half to even, as torch.round), a constant row: q = 0, scale 1e-30.
//   rescale_rows   y (rows, n) in place: y = scale_r * y + mid_r * wsum_c + bias_c, then GELU (erf)
//                  when asked: the int32 sums times the weight scales become the layer's output.
//                  y is the GEMM's output as the caller has it: float32 sums already times the weight
//                  scales (oneDNN's), or the int32 sums themselves and the weight scales (w_scale;
//                  torch._int_mm's), made float32 here as oneDNN makes them, float(sum) * w_scale_c
//                  rounded, so both give the same bits; the float32 result overwrites the int32 sums.
//   rescale_add_norm   the same, + residual, then LayerNorm over the row (gamma, beta, eps): the
//                  post-LN step after an output projection, in the same pass.
//   rescale_gelu_quantize   rescale_rows with the GELU, then quantize_rows of each row straight from
//                  a buffer in L1: the FFN's inner activation becomes the next GEMM's int8 input
//                  without its float32 rows going through memory (4 * hidden floats per token).
// Every row is computed on its own, so a row's result does not depend on the others (a text's vector
// is the same in any batch). AVX-512 where the CPU has it, plain C++ elsewhere or with simd=False
// (same formulas; the erf differs by < 1e-6). The GIL is released while they run; a large input is
// split into `threads` row ranges on a pool of the module's own (for_row_ranges).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu_passes.h"
#include "cpu_quantized.h"

namespace py = pybind11;

namespace fastbert {
namespace {

constexpr float kStep = 1.0f / 254.0f, kMinScale = 1e-30f;

using F32 = py::array_t<float, py::array::c_style>;
using I8 = py::array_t<int8_t, py::array::c_style>;

void row_params(float hi, float lo, float* scale, float* mid) {
    *mid = (hi + lo) * 0.5f;
    *scale = std::max((hi - lo) * kStep, kMinScale);
}

void quantize_rows_plain(const float* x, int8_t* q, float* scale, float* mid, int64_t rows, int64_t k) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * k;
        float hi = -INFINITY, lo = INFINITY;
        for (int64_t j = 0; j < k; ++j) {
            hi = std::max(hi, xr[j]);
            lo = std::min(lo, xr[j]);
        }
        row_params(hi, lo, scale + r, mid + r);
        const float m = mid[r], inv = 1.0f / scale[r];
        for (int64_t j = 0; j < k; ++j)
            q[r * k + j] = static_cast<int8_t>(std::clamp(std::nearbyint((xr[j] - m) * inv), -127.0f, 127.0f));
    }
}

float gelu(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); }

// A GEMM output's element c as the rescale takes it: a float32 sum already times its weight scale, or
// an int32 sum times it here (one rounding, as oneDNN's, never fused into the rescale's FMA).
inline float sum_at(const float* y, const float*, int64_t c) { return y[c]; }
inline float sum_at(const int32_t* y, const float* w_scale, int64_t c) { return static_cast<float>(y[c]) * w_scale[c]; }

// y's rows rescaled into out's (out may be y's memory, as float32)
template <typename A>
void rescale_rows_plain(const A* y, const float* w_scale, float* out, const float* scale, const float* mid,
                        const float* wsum, const float* bias, int64_t rows, int64_t n, bool act) {
    for (int64_t r = 0; r < rows; ++r) {
        const A* yr = y + r * n;
        float* outr = out + r * n;
        for (int64_t c = 0; c < n; ++c) {
            const float v = scale[r] * sum_at(yr, w_scale, c) + (mid[r] * wsum[c] + bias[c]);
            outr[c] = act ? gelu(v) : v;
        }
    }
}

// acc's rows (the GEMM's output) rescaled, added to res's and normalized into y's (y is acc's memory)
template <typename A>
void rescale_add_norm_plain(const A* acc, const float* w_scale, float* y, const float* scale, const float* mid,
                            const float* wsum, const float* bias, const float* res, const float* gamma,
                            const float* beta, float eps, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
        const A* ar = acc + r * n;
        float* yr = y + r * n;
        const float* rr = res + r * n;
        float sum = 0.0f;
        for (int64_t c = 0; c < n; ++c) {
            yr[c] = scale[r] * sum_at(ar, w_scale, c) + (mid[r] * wsum[c] + bias[c]) + rr[c];
            sum += yr[c];
        }
        const float mean = sum / n;
        float var = 0.0f;
        for (int64_t c = 0; c < n; ++c) var += (yr[c] - mean) * (yr[c] - mean);
        const float rstd = 1.0f / std::sqrt(var / n + eps);
        for (int64_t c = 0; c < n; ++c) yr[c] = (yr[c] - mean) * rstd * gamma[c] + beta[c];
    }
}

// the few-row int8 GEMM's weight layout (int8_gemm_pack, below)
constexpr int64_t kI8Panel = 32, kI8Group = 4, kI8GroupBytes = kI8Panel * kI8Group;

#ifdef FASTBERT_AVX512

AVX512 void quantize_rows_avx512(const float* x, int8_t* q, float* scale, float* mid, int64_t rows, int64_t k) {
    const __m512 lo_q = _mm512_set1_ps(-127.0f), hi_q = _mm512_set1_ps(127.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * k;
        int8_t* qr = q + r * k;
        __m512 vhi = _mm512_set1_ps(-INFINITY), vlo = _mm512_set1_ps(INFINITY);
        int64_t j = 0;
        for (; j + 16 <= k; j += 16) {
            const __m512 v = _mm512_loadu_ps(xr + j);
            vhi = _mm512_max_ps(vhi, v);
            vlo = _mm512_min_ps(vlo, v);
        }
        float hi = _mm512_reduce_max_ps(vhi), lo = _mm512_reduce_min_ps(vlo);
        for (int64_t t = j; t < k; ++t) {
            hi = std::max(hi, xr[t]);
            lo = std::min(lo, xr[t]);
        }
        row_params(hi, lo, scale + r, mid + r);
        const float m = mid[r], inv = 1.0f / scale[r];
        const __m512 vm = _mm512_set1_ps(m), vinv = _mm512_set1_ps(inv);
        for (j = 0; j + 16 <= k; j += 16) {   // the row is still in L1
            __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(xr + j), vm), vinv);
            v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm512_min_ps(_mm512_max_ps(v, lo_q), hi_q);
            _mm512_mask_cvtsepi32_storeu_epi8(qr + j, 0xFFFF, _mm512_cvtps_epi32(v));
        }
        for (; j < k; ++j)
            qr[j] = static_cast<int8_t>(std::clamp(std::nearbyint((xr[j] - m) * inv), -127.0f, 127.0f));
    }
}

// sum_at for 16 columns
AVX512 inline __m512 sums_at(const float* y, const float*, int64_t c) { return _mm512_loadu_ps(y + c); }
AVX512 inline __m512 sums_at(const int32_t* y, const float* w_scale, int64_t c) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(y + c)), _mm512_loadu_ps(w_scale + c));
}

template <typename A>
AVX512 void rescale_rows_avx512(const A* y, const float* w_scale, float* out, const float* scale, const float* mid,
                                const float* wsum, const float* bias, int64_t rows, int64_t n, bool act) {
    for (int64_t r = 0; r < rows; ++r) {
        const A* yr = y + r * n;
        float* outr = out + r * n;
        const __m512 vs = _mm512_set1_ps(scale[r]), vm = _mm512_set1_ps(mid[r]);
        int64_t c = 0;
        for (; c + 16 <= n; c += 16) {
            const __m512 t = _mm512_fmadd_ps(vm, _mm512_loadu_ps(wsum + c), _mm512_loadu_ps(bias + c));
            __m512 v = _mm512_fmadd_ps(vs, sums_at(yr, w_scale, c), t);
            _mm512_storeu_ps(outr + c, act ? gelu_avx512(v) : v);
        }
        for (; c < n; ++c) {
            const float v = scale[r] * sum_at(yr, w_scale, c) + (mid[r] * wsum[c] + bias[c]);
            outr[c] = act ? gelu(v) : v;
        }
    }
}

template <typename A>
AVX512 void rescale_add_norm_avx512(const A* acc, const float* w_scale, float* y, const float* scale, const float* mid,
                                    const float* wsum, const float* bias, const float* res, const float* gamma,
                                    const float* beta, float eps, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
        const A* ar = acc + r * n;
        float* yr = y + r * n;
        const float* rr = res + r * n;
        const __m512 vs = _mm512_set1_ps(scale[r]), vm = _mm512_set1_ps(mid[r]);
        __m512 vsum = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 16 <= n; c += 16) {
            __m512 t = _mm512_fmadd_ps(vm, _mm512_loadu_ps(wsum + c), _mm512_loadu_ps(bias + c));
            t = _mm512_add_ps(_mm512_fmadd_ps(vs, sums_at(ar, w_scale, c), t), _mm512_loadu_ps(rr + c));
            _mm512_storeu_ps(yr + c, t);
            vsum = _mm512_add_ps(vsum, t);
        }
        float sum = _mm512_reduce_add_ps(vsum);
        for (int64_t t = c; t < n; ++t) {
            yr[t] = scale[r] * sum_at(ar, w_scale, t) + (mid[r] * wsum[t] + bias[t]) + rr[t];
            sum += yr[t];
        }
        const float mean = sum / n;
        const __m512 vmean = _mm512_set1_ps(mean);
        __m512 vvar = _mm512_setzero_ps();
        for (c = 0; c + 16 <= n; c += 16) {   // the row is still in L1
            const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(yr + c), vmean);
            vvar = _mm512_fmadd_ps(d, d, vvar);
        }
        float var = _mm512_reduce_add_ps(vvar);
        for (int64_t t = c; t < n; ++t) var += (yr[t] - mean) * (yr[t] - mean);
        const float rstd = 1.0f / std::sqrt(var / n + eps);
        const __m512 vr = _mm512_set1_ps(rstd);
        for (c = 0; c + 16 <= n; c += 16) {
            const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(yr + c), vmean), vr);
            _mm512_storeu_ps(yr + c, _mm512_fmadd_ps(d, _mm512_loadu_ps(gamma + c), _mm512_loadu_ps(beta + c)));
        }
        for (; c < n; ++c) yr[c] = (yr[c] - mean) * rstd * gamma[c] + beta[c];
    }
}

// ---- the few-row int8 GEMM (int8_gemm; the int8 short forward in py_layers.cpp) ----
// At a few dozen rows (one short text) a GEMM mostly streams its weight: torch's int8 GEMMs took 2-5x
// the time of reading the int8 weight once there (18 rows; 12-29 us per MiniLM shape in a loop, 53 us
// cold in an encode). Here each 32-column panel is read once for all the rows, as linear_f32 does in
// fp32. Layout: panel p holds k / 4 groups of 128 bytes (columns p*32 .. p*32+15, then +16 .. +31, each
// column's 4 consecutive inputs), then 32 int32 corrections. vpdpbusd multiplies unsigned by signed
// bytes, so the activation codes q (signed, -127..127) enter as u = q + 128 (q xor 0x80, made once per
// GEMM: flipped in the loop, the xor took a third of the vector ports) and each column's sum drops
// 128 * sum_k W_ck after: exact int32 arithmetic, the same sums as torch._int_mm.
constexpr int kI8MaxRows = 14;           // 28 accumulators of the 32 vector registers
constexpr int64_t kI8SliceGroups = 128;  // 512 inputs, a 16 KB slice of panel, stays in L1 across row blocks

struct I8Gemm {
    const uint8_t* u;
    const int8_t* packed;
    int64_t m, n, k, panel_bytes;
    Int8Store store;
    Int8Rescale rs;
    void* out;
};

// rows [r0, r0 + R) times panel p over groups [g0, g1): added to the partial sums in out (g0 > 0); after
// the last group, corrected and stored as g.store says.
template <int R>
AVX512_VNNI void int8_microkernel(const I8Gemm& g, int64_t r0, int64_t p, int64_t g0, int64_t g1, bool prefetch) {
    const int64_t c0 = p * kI8Panel, cols = std::min<int64_t>(kI8Panel, g.n - c0), groups = g.k / kI8Group;
    const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
    const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
    const int8_t* panel = g.packed + p * g.panel_bytes;
    const int8_t* w = panel + g0 * kI8GroupBytes;
    const auto* x = reinterpret_cast<const uint8_t*>(g.u) + r0 * g.k;   // 4 codes at a time
    const char* next = reinterpret_cast<const char*>(w + (prefetch ? (g1 - g0) * kI8GroupBytes : 0));
    __m512i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int64_t j = g0; j < g1; ++j, w += kI8GroupBytes, next += kI8GroupBytes) {
        _mm_prefetch(next, _MM_HINT_T0);
        _mm_prefetch(next + 64, _MM_HINT_T0);
        const __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 64);
        for (int r = 0; r < R; ++r) {
            int32_t four;
            std::memcpy(&four, x + r * g.k + j * kI8Group, sizeof four);
            const __m512i u = _mm512_set1_epi32(four);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], u, w0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], u, w1);
        }
    }
    const bool last = g1 == groups;
    const auto* corr = reinterpret_cast<const int32_t*>(panel + groups * kI8GroupBytes);
    const __mmask16 masks[2] = {m0, m1};
    for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        for (int h = 0; h < 2; ++h) {
            const __mmask16 mk = masks[h];
            if (!mk) continue;
            const int64_t c = c0 + 16 * h;
            auto* o = static_cast<int32_t*>(g.out) + row * g.n + c;
            __m512i s = acc[r][h];
            if (g0 > 0) s = _mm512_add_epi32(s, _mm512_maskz_loadu_epi32(mk, o));
            if (!last || g.store == Int8Store::kSums) {
                if (last) s = _mm512_sub_epi32(s, _mm512_maskz_loadu_epi32(mk, corr + 16 * h));
                _mm512_mask_storeu_epi32(o, mk, s);
                continue;
            }
            s = _mm512_sub_epi32(s, _mm512_maskz_loadu_epi32(mk, corr + 16 * h));
            // rescale_rows_avx512's instructions, in its order
            const __m512 t = _mm512_fmadd_ps(_mm512_set1_ps(g.rs.mid[row]), _mm512_maskz_loadu_ps(mk, g.rs.wsum + c),
                                             _mm512_maskz_loadu_ps(mk, g.rs.bias + c));
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_maskz_loadu_ps(mk, g.rs.w_scale + c));
            __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(g.rs.scale[row]), f, t);
            if (g.store == Int8Store::kRescaleGelu) v = gelu_avx512(v);
            _mm512_mask_storeu_ps(reinterpret_cast<float*>(o), mk, v);
        }
    }
}

using I8Kernel = void (*)(const I8Gemm&, int64_t, int64_t, int64_t, int64_t, bool);

template <int... R>
constexpr auto int8_kernel_table(std::integer_sequence<int, R...>) {
    return std::array<I8Kernel, sizeof...(R)>{&int8_microkernel<R + 1>...};
}

// Panels [p0, p1), each in slices of groups used by every row block while in L1 (rows in blocks of
// near-equal size, at most kI8MaxRows each); one slice when the rows are one block.
AVX512_VNNI void int8_run_panels(const I8Gemm& g, int64_t p0, int64_t p1) {
    static constexpr auto kernels = int8_kernel_table(std::make_integer_sequence<int, kI8MaxRows>{});
    const int64_t blocks = (g.m + kI8MaxRows - 1) / kI8MaxRows, groups = g.k / kI8Group;
    const int64_t slice = blocks == 1 ? groups : kI8SliceGroups;
    for (int64_t p = p0; p < p1; ++p) {
        for (int64_t g0 = 0; g0 < groups; g0 += slice) {
            const int64_t g1 = std::min(groups, g0 + slice);
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t r0 = g.m * b / blocks, r1 = g.m * (b + 1) / blocks;
                kernels[r1 - r0 - 1](g, r0, p, g0, g1, b == blocks - 1 && (p + 1 < p1 || g1 < groups));
            }
        }
    }
}

#endif

// body(first, end) over `rows` rows of `cols` values: on the calling thread alone for a small input
// (a worker's wake-up would cost more than it saves), else in up to `threads` row ranges at once.
// the AVX-512 form where asked and the CPU has it, else the plain one
void quantize_rows_any(const float* x, int8_t* q, float* scale, float* mid, int64_t rows, int64_t k, bool simd) {
#ifdef FASTBERT_AVX512
    if (simd && has_avx512()) return quantize_rows_avx512(x, q, scale, mid, rows, k);
#endif
    quantize_rows_plain(x, q, scale, mid, rows, k);
}

template <typename A>
void rescale_rows_any(const A* y, const float* w_scale, float* out, const float* scale, const float* mid,
                      const float* wsum, const float* bias, int64_t rows, int64_t n, bool act, bool simd) {
#ifdef FASTBERT_AVX512
    if (simd && has_avx512()) return rescale_rows_avx512(y, w_scale, out, scale, mid, wsum, bias, rows, n, act);
#endif
    rescale_rows_plain(y, w_scale, out, scale, mid, wsum, bias, rows, n, act);
}

void for_row_ranges(int64_t rows, int64_t cols, int threads, const std::function<void(int64_t, int64_t)>& body) {
    constexpr int64_t kMinValuesPerTask = 1 << 15;
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>({threads, rows, rows * cols / kMinValuesPerTask}));
    run_tasks(tasks, threads, [&](int64_t i) { body(rows * i / tasks, rows * (i + 1) / tasks); });
}

void check_rows(const py::buffer_info& b, int64_t rows, const char* name) {
    if (b.ndim < 1 || b.shape[0] != rows)
        throw std::invalid_argument(std::string(name) + " must have one entry per row (" + std::to_string(rows) + ")");
}

void quantize_rows(const F32& x, I8& q, F32& scale, F32& mid, int threads, bool simd) {
    const auto bx = x.request(), bq = q.request(true), bs = scale.request(true), bm = mid.request(true);
    if (bx.ndim != 2 || bq.ndim != 2 || bq.shape != bx.shape)
        throw std::invalid_argument("quantize_rows takes x (rows, k) and q of the same shape");
    const int64_t rows = bx.shape[0], k = bx.shape[1];
    check_rows(bs, rows, "scale");
    check_rows(bm, rows, "mid");
    const auto* xp = static_cast<const float*>(bx.ptr);
    auto* qp = static_cast<int8_t*>(bq.ptr);
    auto *sp = static_cast<float*>(bs.ptr), *mp = static_cast<float*>(bm.ptr);
    py::gil_scoped_release nogil;
    for_row_ranges(rows, k, threads, [&](int64_t a, int64_t b) {
        quantize_rows_any(xp + a * k, qp + a * k, sp + a, mp + a, b - a, k, simd);
    });
}

// A GEMM's output y (rows, n) as the rescale passes take it, and the inputs they share, checked against
// it: per row scale and mid, per column wsum and bias; w_scale (per column) exactly when y holds int32 sums.
struct RescaleInputs {
    void* y;
    int64_t rows, n;
    const float *scale, *mid, *wsum, *bias, *w_scale = nullptr;
    RescaleInputs(const py::array& sums, const std::optional<F32>& ws, const F32& s, const F32& m, const F32& w,
                  const F32& b, bool writable) {
        const bool int_sums = py::isinstance<py::array_t<int32_t>>(sums);
        if (!int_sums && !py::isinstance<py::array_t<float>>(sums))
            throw std::invalid_argument("the GEMM's output y must be float32 or int32");
        if (!(sums.flags() & py::array::c_style) || sums.ndim() != 2)
            throw std::invalid_argument("the GEMM's output y must be a C-contiguous (rows, n) array");
        if (int_sums != ws.has_value())
            throw std::invalid_argument("w_scale goes with int32 sums, and only with them");
        const auto by = sums.request(writable);
        y = by.ptr, rows = by.shape[0], n = by.shape[1];
        const auto bs = s.request(), bm = m.request(), bw = w.request(), bb = b.request();
        check_rows(bs, rows, "scale");
        check_rows(bm, rows, "mid");
        if (bw.size != n || bb.size != n) throw std::invalid_argument("wsum and bias must have n entries");
        scale = static_cast<const float*>(bs.ptr), mid = static_cast<const float*>(bm.ptr);
        wsum = static_cast<const float*>(bw.ptr), bias = static_cast<const float*>(bb.ptr);
        if (int_sums) {
            const auto bz = ws->request();
            if (bz.size != n) throw std::invalid_argument("w_scale must have n entries");
            w_scale = static_cast<const float*>(bz.ptr);
        }
    }
    // fn(y's sums as the type they have)
    template <typename Fn>
    void visit(Fn&& fn) const {
        if (w_scale) fn(static_cast<const int32_t*>(y));
        else fn(static_cast<const float*>(y));
    }
};

void rescale_rows(const py::array& y, const F32& scale, const F32& mid, const F32& wsum, const F32& bias,
                  bool gelu_after, int threads, bool simd, const std::optional<F32>& w_scale) {
    const RescaleInputs in(y, w_scale, scale, mid, wsum, bias, true);
    const int64_t n = in.n;
    auto* out = static_cast<float*>(in.y);   // in place, as float32 over the sums
    py::gil_scoped_release nogil;
    in.visit([&](auto* sums) {
        for_row_ranges(in.rows, n, threads, [&](int64_t a, int64_t b) {
            rescale_rows_any(sums + a * n, in.w_scale, out + a * n, in.scale + a, in.mid + a, in.wsum, in.bias, b - a,
                             n, gelu_after, simd);
        });
    });
}

// rescale_rows with the GELU, then quantize_rows of its result into q, qscale, qmid, row by row through
// an L1-sized buffer: the same codes, without writing the fp32 rows out and reading them back.
void rescale_gelu_quantize(const py::array& y, const F32& scale, const F32& mid, const F32& wsum, const F32& bias,
                           I8& q, F32& qscale, F32& qmid, int threads, bool simd, const std::optional<F32>& w_scale) {
    const RescaleInputs in(y, w_scale, scale, mid, wsum, bias, false);
    const int64_t n = in.n;
    const auto bq = q.request(true), bs = qscale.request(true), bm = qmid.request(true);
    if (bq.ndim != 2 || bq.shape[0] != in.rows || bq.shape[1] != n)
        throw std::invalid_argument("rescale_gelu_quantize takes y (rows, n) and q of the same shape");
    check_rows(bs, in.rows, "qscale");
    check_rows(bm, in.rows, "qmid");
    auto* qp = static_cast<int8_t*>(bq.ptr);
    auto *qsp = static_cast<float*>(bs.ptr), *qmp = static_cast<float*>(bm.ptr);
    py::gil_scoped_release nogil;
    in.visit([&](auto* sums) {
        for_row_ranges(in.rows, n, threads, [&](int64_t a, int64_t b) {
            std::vector<float> row(static_cast<size_t>(n));
            for (int64_t r = a; r < b; ++r) {
                rescale_rows_any(sums + r * n, in.w_scale, row.data(), in.scale + r, in.mid + r, in.wsum, in.bias, 1,
                                 n, true, simd);
                quantize_rows_any(row.data(), qp + r * n, qsp + r, qmp + r, 1, n, simd);
            }
        });
    });
}

void rescale_add_norm(const py::array& y, const F32& scale, const F32& mid, const F32& wsum, const F32& bias,
                      const F32& res, const F32& gamma, const F32& beta, float eps, int threads, bool simd,
                      const std::optional<F32>& w_scale) {
    const RescaleInputs in(y, w_scale, scale, mid, wsum, bias, true);
    const int64_t n = in.n;
    const auto br = res.request(), bg = gamma.request(), bt = beta.request();
    if (br.ndim != 2 || br.shape[0] != in.rows || br.shape[1] != n)
        throw std::invalid_argument("rescale_add_norm takes y (rows, n) and a residual of the same shape");
    if (bg.size != n || bt.size != n) throw std::invalid_argument("gamma and beta must have n entries");
    auto* out = static_cast<float*>(in.y);   // in place, as float32 over the sums
    const auto *rp = static_cast<const float*>(br.ptr), *gp = static_cast<const float*>(bg.ptr),
               *tp = static_cast<const float*>(bt.ptr);
    py::gil_scoped_release nogil;
    in.visit([&](auto* sums) {
        for_row_ranges(in.rows, n, threads, [&](int64_t a, int64_t b) {
            (void)simd;
#ifdef FASTBERT_AVX512
            if (simd && has_avx512())
                return rescale_add_norm_avx512(sums + a * n, in.w_scale, out + a * n, in.scale + a, in.mid + a,
                                               in.wsum, in.bias, rp + a * n, gp, tp, eps, b - a, n);
#endif
            rescale_add_norm_plain(sums + a * n, in.w_scale, out + a * n, in.scale + a, in.mid + a, in.wsum, in.bias,
                                   rp + a * n, gp, tp, eps, b - a, n);
        });
    });
}


int64_t i8_panels_of(int64_t n) { return (n + kI8Panel - 1) / kI8Panel; }

// weight (n, k) int8 -> packed (ceil(n / 32), int8_panel_bytes(k)), 64-byte aligned (the layout above)
void int8_gemm_pack(const I8& weight, I8& packed) {
    const auto bw = weight.request(), bp = packed.request(true);
    if (bw.ndim != 2 || bw.shape[1] % kI8Group != 0)
        throw std::invalid_argument("int8_gemm_pack takes a weight (n, k) with k a multiple of 4");
    const int64_t n = bw.shape[0], k = bw.shape[1], groups = k / kI8Group, bytes = int8_panel_bytes(k);
    if (bp.ndim != 2 || bp.shape[0] != i8_panels_of(n) || bp.shape[1] != bytes)
        throw std::invalid_argument("packed must have shape (" + std::to_string(i8_panels_of(n)) + ", " +
                                    std::to_string(bytes) + ") for a weight (" + std::to_string(n) + ", " +
                                    std::to_string(k) + ")");
    if (reinterpret_cast<uintptr_t>(bp.ptr) % 64 != 0) throw std::invalid_argument("packed must be 64-byte aligned");
    const auto* w = static_cast<const int8_t*>(bw.ptr);
    auto* out = static_cast<int8_t*>(bp.ptr);
    py::gil_scoped_release nogil;
    for (int64_t p = 0; p < i8_panels_of(n); ++p) {
        int8_t* panel = out + p * bytes;
        int32_t corr[kI8Panel];
        for (int64_t c = 0; c < kI8Panel; ++c) {
            const int64_t col = p * kI8Panel + c;
            int32_t sum = 0;
            for (int64_t j = 0; j < k; ++j) {
                const int8_t v = col < n ? w[col * k + j] : 0;
                panel[(j / kI8Group) * kI8GroupBytes + (c / 16) * 64 + (c % 16) * kI8Group + j % kI8Group] = v;
                sum += v;
            }
            corr[c] = 128 * sum;
        }
        std::memcpy(panel + groups * kI8GroupBytes, corr, sizeof corr);
    }
}

// out (m, n) int32 = q (m, k) int8 times packed's columns: exact sums, the panels split over up to `threads`
// (a test's and a bench's entry: the int8 short forward calls int8_gemm_panels itself)
void int8_gemm(const I8& q, const I8& packed, py::array_t<int32_t, py::array::c_style>& out, int threads) {
    if (!int8_gemm_available()) throw std::runtime_error("int8_gemm needs a CPU with AVX-512 VNNI (int8_gemm_available())");
    const auto bq = q.request(), bp = packed.request(), bo = out.request(true);
    if (bq.ndim != 2 || bq.shape[1] % kI8Group != 0 || bp.ndim != 2 || bp.shape[1] != int8_panel_bytes(bq.shape[1]))
        throw std::invalid_argument("int8_gemm takes q (m, k), k a multiple of 4, and a weight packed for that k");
    const int64_t m = bq.shape[0], k = bq.shape[1];
    if (bo.ndim != 2 || bo.shape[0] != m || i8_panels_of(bo.shape[1]) != bp.shape[0])
        throw std::invalid_argument("out must be (m, n) with packed's ceil(n / 32) panels");
    if (reinterpret_cast<uintptr_t>(bp.ptr) % 64 != 0) throw std::invalid_argument("packed must be 64-byte aligned");
    const int64_t n = bo.shape[1], panels = bp.shape[0];
    if (m == 0 || n == 0) return;
    const auto* pp = static_cast<const int8_t*>(bp.ptr);
    py::gil_scoped_release nogil;
    std::vector<uint8_t> u(static_cast<size_t>(m * k));
    int8_to_unsigned(static_cast<const int8_t*>(bq.ptr), u.data(), m * k);
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(threads, panels));
    run_tasks(tasks, threads, [&](int64_t i) {
        int8_gemm_panels(u.data(), m, k, pp, n, Int8Store::kSums, Int8Rescale{}, bo.ptr, panels * i / tasks,
                         panels * (i + 1) / tasks);
    });
}

}  // namespace

bool int8_gemm_available() {
#ifdef FASTBERT_AVX512
    return has_avx512_vnni();
#else
    return false;
#endif
}

int64_t int8_panel_bytes(int64_t k) { return (k / kI8Group) * kI8GroupBytes + kI8Panel * 4; }

void int8_to_unsigned(const int8_t* q, uint8_t* u, int64_t count) {
    for (int64_t i = 0; i < count; ++i) u[i] = static_cast<uint8_t>(q[i] ^ 0x80);
}

void int8_gemm_panels(const uint8_t* u, int64_t m, int64_t k, const int8_t* packed, int64_t n, Int8Store store,
                      const Int8Rescale& rescale, void* out, int64_t p0, int64_t p1) {
#ifdef FASTBERT_AVX512
    int8_run_panels(I8Gemm{u, packed, m, n, k, int8_panel_bytes(k), store, rescale, out}, p0, p1);
#else
    (void)u, (void)m, (void)k, (void)packed, (void)n, (void)store, (void)rescale, (void)out, (void)p0, (void)p1;
#endif
}

void int8_quantize_rows_avx512(const float* x, int8_t* q, float* scale, float* mid, int64_t rows, int64_t k) {
#ifdef FASTBERT_AVX512
    quantize_rows_avx512(x, q, scale, mid, rows, k);
#else
    (void)x, (void)q, (void)scale, (void)mid, (void)rows, (void)k;
#endif
}

void int8_rescale_add_norm_avx512(const int32_t* sums, const Int8Rescale& rs, float* y, const float* res,
                                  const float* gamma, const float* beta, float eps, int64_t rows, int64_t n) {
#ifdef FASTBERT_AVX512
    rescale_add_norm_avx512(sums, rs.w_scale, y, rs.scale, rs.mid, rs.wsum, rs.bias, res, gamma, beta, eps, rows, n);
#else
    (void)sums, (void)rs, (void)y, (void)res, (void)gamma, (void)beta, (void)eps, (void)rows, (void)n;
#endif
}

void bind_int8_rows(py::module_& m) {
    // noconvert: a wrong dtype or a strided array is an error, never a silent copy the result is lost in
    // (y, float32 or int32, is checked in RescaleInputs)
    m.def("int8_quantize_rows", &quantize_rows, py::arg("x").noconvert(), py::arg("q").noconvert(),
          py::arg("scale").noconvert(), py::arg("mid").noconvert(), py::arg("threads") = 1, py::arg("simd") = true);
    m.def("int8_rescale_rows", &rescale_rows, py::arg("y"), py::arg("scale").noconvert(),
          py::arg("mid").noconvert(), py::arg("wsum").noconvert(), py::arg("bias").noconvert(),
          py::arg("gelu"), py::arg("threads") = 1, py::arg("simd") = true,
          py::arg("w_scale").noconvert() = py::none());
    m.def("int8_rescale_gelu_quantize", &rescale_gelu_quantize, py::arg("y"),
          py::arg("scale").noconvert(), py::arg("mid").noconvert(), py::arg("wsum").noconvert(),
          py::arg("bias").noconvert(), py::arg("q").noconvert(), py::arg("qscale").noconvert(),
          py::arg("qmid").noconvert(), py::arg("threads") = 1, py::arg("simd") = true,
          py::arg("w_scale").noconvert() = py::none());
    m.def("int8_rescale_add_norm", &rescale_add_norm, py::arg("y"), py::arg("scale").noconvert(),
          py::arg("mid").noconvert(), py::arg("wsum").noconvert(), py::arg("bias").noconvert(),
          py::arg("residual").noconvert(), py::arg("gamma").noconvert(), py::arg("beta").noconvert(),
          py::arg("eps"), py::arg("threads") = 1, py::arg("simd") = true,
          py::arg("w_scale").noconvert() = py::none());
    m.def("int8_gemm_available", &int8_gemm_available);
    m.def("int8_panel_bytes", &int8_panel_bytes, py::arg("k"));
    m.def("int8_gemm_pack", &int8_gemm_pack, py::arg("weight").noconvert(), py::arg("packed").noconvert());
    m.def("int8_gemm", &int8_gemm, py::arg("q").noconvert(), py::arg("packed").noconvert(), py::arg("out").noconvert(),
          py::arg("threads") = 1);
}

}  // namespace fastbert
