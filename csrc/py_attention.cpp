// Packed attention on the CPU for inference (fastbert/ops/length_runs.py), float32, no mask, no
// dropout: q, k, v (tokens, heads, head_dim) with head_dim a multiple of 16 up to 128, sequences
// given by cu_seqlens, out (tokens, heads, head_dim) contiguous. One (sequence, head) at a time, in
// one pass that keeps its scores in L1/L2: K^T packed once, then per block of query rows
//   s = scale * q K^T,   p = exp(s - max s),   o = (p V) / sum p.
// torch's CPU flash attention, called per run of equal lengths before, spent most of its time
// outside its GEMMs at BERT's small head dims (32, 64) and short lengths. Each (sequence, head) is
// computed alone, by one thread, with the same instructions whatever the batch and the thread
// count: a text's result is the same bits alone and in any batch. AVX-512 only (attention_packed
// returns False elsewhere and the caller takes torch's path). The GIL is released while it runs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_attention.h"
#include "cpu_passes.h"

namespace py = pybind11;

namespace fastbert {
namespace {

#ifdef FASTBERT_AVX512
// One sequence's head: q, k, v point at its first token, their rows qs, ks, vs floats apart; o at its
// first output row, os apart.
struct Head {
    const float *q, *k, *v;
    int64_t qs, ks, vs;
    float* o;
    int64_t os, len;
};

// scores[r][c0 + 16 j] for j < C, rows r < R: scale * q_r . K^T[:, c0 + 16 j]
template <int R, int C, int NV>
AVX512 inline void score_block(const float* const* qrow, const float* kt, int64_t lp, int64_t c0, float scale,
                               float* sc) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int d = 0; d < 16 * NV; ++d) {
        __m512 kv[C];
        for (int j = 0; j < C; ++j) kv[j] = _mm512_loadu_ps(kt + d * lp + c0 + 16 * j);
        for (int r = 0; r < R; ++r) {
            const __m512 qv = _mm512_set1_ps(qrow[r][d]);
            for (int j = 0; j < C; ++j) acc[r][j] = _mm512_fmadd_ps(qv, kv[j], acc[r][j]);
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < C; ++j) _mm512_storeu_ps(sc + r * lp + c0 + 16 * j, _mm512_mul_ps(acc[r][j], vs));
}

// R query rows from `i0` (rows past the end repeat the last one and are not stored).
template <int R, int NV>
AVX512 void query_block(const Head& h, int64_t i0, const float* kt, int64_t lp, float scale, float* sc) {
    const float* qrow[R];
    for (int r = 0; r < R; ++r) qrow[r] = h.q + std::min(i0 + r, h.len - 1) * h.qs;
    constexpr int C = R >= 8 ? 2 : 4;   // R x C score accumulators
    int64_t c0 = 0;
    for (; c0 + 16 * C <= lp; c0 += 16 * C) score_block<R, C, NV>(qrow, kt, lp, c0, scale, sc);
    for (; c0 < lp; c0 += 16) score_block<R, 1, NV>(qrow, kt, lp, c0, scale, sc);
    // softmax numerators in place, over the len real keys (the padded columns read as 0)
    const int64_t full = h.len / 16 * 16;
    const __mmask16 tail = static_cast<__mmask16>((1u << (h.len - full)) - 1);
    float inv_sum[R];
    for (int r = 0; r < R; ++r) {
        float* s = sc + r * lp;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t c = 0; c < full; c += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + c));
        if (tail) vmax = _mm512_mask_max_ps(vmax, tail, vmax, _mm512_maskz_loadu_ps(tail, s + full));
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t c = 0; c < full; c += 16) {
            const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + c), m));
            _mm512_storeu_ps(s + c, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        if (tail) {
            const __m512 e = _mm512_maskz_mov_ps(tail, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + full), m)));
            _mm512_storeu_ps(s + full, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        inv_sum[r] = 1.0f / _mm512_reduce_add_ps(vsum);
    }
    __m512 acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
    for (int64_t j = 0; j < h.len; ++j) {
        const float* vj = h.v + j * h.vs;
        __m512 vv[NV];
        for (int n = 0; n < NV; ++n) vv[n] = _mm512_loadu_ps(vj + 16 * n);
        for (int r = 0; r < R; ++r) {
            const __m512 p = _mm512_set1_ps(sc[r * lp + j]);
            for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_fmadd_ps(p, vv[n], acc[r][n]);
        }
    }
    for (int r = 0; r < R && i0 + r < h.len; ++r) {
        float* orow = h.o + (i0 + r) * h.os;
        const __m512 vi = _mm512_set1_ps(inv_sum[r]);
        for (int n = 0; n < NV; ++n) _mm512_storeu_ps(orow + 16 * n, _mm512_mul_ps(acc[r][n], vi));
    }
}

// out[c] = column c of the 16 x 16 block in rows r (r is overwritten)
AVX512 inline void transpose16(__m512* r, __m512* out) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                      c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));       // in 128-bit lane l: column 4 l + m of
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));   // rows 4 i .. 4 i + 3, m = 0 .. 3
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int m = 0; m < 4; ++m) {
        const __m512 a = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88), b = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd),
                     c = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88),
                     d = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
        out[m] = _mm512_shuffle_f32x4(a, c, 0x88);
        out[8 + m] = _mm512_shuffle_f32x4(a, c, 0xdd);
        out[4 + m] = _mm512_shuffle_f32x4(b, d, 0x88);
        out[12 + m] = _mm512_shuffle_f32x4(b, d, 0xdd);
    }
}

// kt: (16 NV, lp) scratch, lp = len rounded up to 16; sc: (R, lp) scratch.
template <int NV>
AVX512 void attend_head(const Head& h, float scale, std::vector<float>& kt, std::vector<float>& sc) {
    constexpr int R = NV <= 2 ? 8 : NV <= 4 ? 4 : 2;   // the p V accumulators: R * NV <= 16
    const int64_t lp = (h.len + 15) / 16 * 16;
    kt.resize(static_cast<size_t>(16 * NV * lp));
    sc.resize(static_cast<size_t>(R * lp));
    for (int64_t j0 = 0; j0 < lp; j0 += 16) {   // K^T in 16 x 16 blocks, the keys past len as zeros
        for (int n = 0; n < NV; ++n) {
            __m512 rows[16], cols[16];
            for (int j = 0; j < 16; ++j)
                rows[j] = j0 + j < h.len ? _mm512_loadu_ps(h.k + (j0 + j) * h.ks + 16 * n) : _mm512_setzero_ps();
            transpose16(rows, cols);
            for (int c = 0; c < 16; ++c) _mm512_storeu_ps(kt.data() + (16 * n + c) * lp + j0, cols[c]);
        }
    }
    for (int64_t i0 = 0; i0 < h.len; i0 += R) query_block<R, NV>(h, i0, kt.data(), lp, scale, sc.data());
}

AVX512 void attend(const Head& h, int nv, float scale, std::vector<float>& kt, std::vector<float>& sc) {
    switch (nv) {
        case 1: return attend_head<1>(h, scale, kt, sc);
        case 2: return attend_head<2>(h, scale, kt, sc);
        case 3: return attend_head<3>(h, scale, kt, sc);
        case 4: return attend_head<4>(h, scale, kt, sc);
        case 5: return attend_head<5>(h, scale, kt, sc);
        case 6: return attend_head<6>(h, scale, kt, sc);
        case 7: return attend_head<7>(h, scale, kt, sc);
        case 8: return attend_head<8>(h, scale, kt, sc);
        default: throw std::logic_error("head_dim / 16 out of range");
    }
}
#endif

using F32 = py::array_t<float>;   // strided views welcome: only the last dimension must be contiguous

// False (nothing written) where this CPU or build has no AVX-512.
bool attention_packed(const F32& q, const F32& k, const F32& v, const py::array_t<int64_t, py::array::c_style>& cu,
                      F32& out, float scale, int threads) {
    const auto bq = q.request(), bk = k.request(), bv = v.request(), bc = cu.request(), bo = out.request(true);
    if (bq.ndim != 3 || bk.shape != bq.shape || bv.shape != bq.shape || bo.shape != bq.shape)
        throw std::invalid_argument("attention_packed takes q, k, v and out of one shape (tokens, heads, head_dim)");
    const int64_t tokens = bq.shape[0], heads = bq.shape[1], dim = bq.shape[2];
    if (dim % 16 != 0 || dim < 16 || dim > 128)
        throw std::invalid_argument("attention_packed takes head_dim 16, 32, ... 128, got " + std::to_string(dim));
    const auto f = static_cast<int64_t>(sizeof(float));
    for (const auto* b : {&bq, &bk, &bv})
        if (b->strides[2] != f || b->strides[1] != dim * f || b->strides[0] % f != 0)
            throw std::invalid_argument("q, k, v must have each token's heads and head_dim contiguous");
    if (bo.strides[2] != f || bo.strides[1] != dim * f || bo.strides[0] != heads * dim * f)
        throw std::invalid_argument("out must be contiguous");
    if (bc.ndim != 1 || bc.shape[0] < 1) throw std::invalid_argument("cu_seqlens must be 1-D, batch + 1 entries");
    const auto* bounds = static_cast<const int64_t*>(bc.ptr);
    const int64_t batch = bc.shape[0] - 1;
    if (bounds[0] != 0 || bounds[batch] != tokens)
        throw std::invalid_argument("cu_seqlens must start at 0 and end at the token count");
    for (int64_t b = 0; b < batch; ++b)
        if (bounds[b + 1] < bounds[b]) throw std::invalid_argument("cu_seqlens must not decrease");
    py::gil_scoped_release nogil;
    return attention_rows(static_cast<const float*>(bq.ptr), static_cast<const float*>(bk.ptr),
                          static_cast<const float*>(bv.ptr), bq.strides[0] / f, bk.strides[0] / f, bv.strides[0] / f,
                          bounds, batch, heads, dim, static_cast<float*>(bo.ptr), scale, threads);
}

}  // namespace

void attention_task(const float* q, const float* k, const float* v, int64_t qs, int64_t ks, int64_t vs,
                    const int64_t* bounds, int64_t heads, int64_t dim, float* out, float scale, int64_t t) {
#ifdef FASTBERT_AVX512
    thread_local std::vector<float> kt, sc;
    const int64_t b = t / heads, h = t % heads, first = bounds[b];
    const Head head{q + first * qs + h * dim, k + first * ks + h * dim, v + first * vs + h * dim, qs, ks, vs,
                    out + (first * heads + h) * dim, heads * dim, bounds[b + 1] - first};
    if (head.len > 0) attend(head, static_cast<int>(dim / 16), scale, kt, sc);
#else
    (void)q, (void)k, (void)v, (void)qs, (void)ks, (void)vs, (void)bounds, (void)heads, (void)dim, (void)out;
    (void)scale, (void)t;
#endif
}

bool attention_rows(const float* q, const float* k, const float* v, int64_t qs, int64_t ks, int64_t vs,
                    const int64_t* bounds, int64_t batch, int64_t heads, int64_t dim, float* out, float scale,
                    int threads) {
#ifdef FASTBERT_AVX512
    if (!has_avx512()) return false;
    // one task per (sequence, head); a small batch (one short text) stays on the calling thread
    int64_t work = 0;
    for (int64_t b = 0; b < batch; ++b) work += (bounds[b + 1] - bounds[b]) * (bounds[b + 1] - bounds[b]);
    constexpr int64_t kMinWork = 1 << 13;   // query-key pairs per head, summed over the batch
    run_tasks(batch * heads, work < kMinWork ? 1 : threads, [&](int64_t t) {
        attention_task(q, k, v, qs, ks, vs, bounds, heads, dim, out, scale, t);
    });
    return true;
#else
    (void)q, (void)k, (void)v, (void)qs, (void)ks, (void)vs, (void)bounds, (void)batch, (void)heads, (void)dim;
    (void)out, (void)scale, (void)threads;
    return false;
#endif
}

void bind_attention(py::module_& m) {
    m.def("attention_packed", &attention_packed, py::arg("q").noconvert(), py::arg("k").noconvert(),
          py::arg("v").noconvert(), py::arg("cu_seqlens").noconvert(), py::arg("out").noconvert(),
          py::arg("scale"), py::arg("threads") = 1);
}

}  // namespace fastbert
