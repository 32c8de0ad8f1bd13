// Forward kernels: the general one (any dtypes, float or double statistics), the fast paths
// (one dtype, float statistics) and their AVX-512 versions.
#pragma once

#include "avx512.h"
#include "common.h"

namespace {

// ------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------
// clang-format off: a field and its dtype on one line, as the ctypes struct lists them
struct ForwardArgs {
  i64 rows, dim, nthreads, centre, stream;
  double eps;
  const void* x; i64 x_dtype;
  const void* res; i64 res_dtype;      // h = x + res, or with a gate h = x + gate * res
  const void* gate; i64 gate_dtype; i64 gate_group;
  void* h_out; i64 h_dtype;            // when a sum is formed: h is rounded to h_dtype and stored
  const void* gain; const void* bias;  // A values, [dim]
  i64 hat_round;                       // dtype x̂ is rounded to before the gain, or -1
  const void* scale; i64 scale_dtype; i64 scale_group;
  const void* shift; i64 shift_dtype; i64 shift_group;
  void* y; i64 y_dtype;                // null: only h is produced (gated residual)
  void* mean_out; void* rstd_out;      // A values, [rows], optional
};
// clang-format on

// y = ((v − μ)·rstd · gain + bias) · (1 + s) + t, factors chosen at compile time.
template <class A, bool CENTRE, bool GAIN, bool BIAS, bool SCALE, bool SHIFT>
void affine_row(A* out, const A* v, A mean, A rstd, const A* gain, const A* bias, const A* s,
                const A* t, i64 n) {
  NL_SIMD for (i64 i = 0; i < n; ++i) {
    A u = CENTRE ? (v[i] - mean) * rstd : v[i] * rstd;
    if (GAIN) u = u * gain[i];
    if (BIAS) u = u + bias[i];
    if (SCALE) u = u * (A(1) + s[i]);
    if (SHIFT) u = u + t[i];
    out[i] = u;
  }
}

template <class A>
using AffineFn = void (*)(A*, const A*, A, A, const A*, const A*, const A*, const A*, i64);

template <class A, bool C, bool G, bool B, bool S>
AffineFn<A> pick_affine_shift(bool t) {
  return t ? affine_row<A, C, G, B, S, true> : affine_row<A, C, G, B, S, false>;
}
template <class A, bool C, bool G, bool B>
AffineFn<A> pick_affine_scale(bool s, bool t) {
  return s ? pick_affine_shift<A, C, G, B, true>(t) : pick_affine_shift<A, C, G, B, false>(t);
}
template <class A, bool C, bool G>
AffineFn<A> pick_affine_bias(bool b, bool s, bool t) {
  return b ? pick_affine_scale<A, C, G, true>(s, t) : pick_affine_scale<A, C, G, false>(s, t);
}
template <class A, bool C>
AffineFn<A> pick_affine_gain(bool g, bool b, bool s, bool t) {
  return g ? pick_affine_bias<A, C, true>(b, s, t) : pick_affine_bias<A, C, false>(b, s, t);
}
template <class A>
AffineFn<A> pick_affine(bool c, bool g, bool b, bool s, bool t) {
  return c ? pick_affine_gain<A, true>(g, b, s, t) : pick_affine_gain<A, false>(g, b, s, t);
}

template <class A>
void forward(const ForwardArgs& a) {
  const i64 n = a.dim;
  const i64 acc = own_dtype<A>();
  const A eps = A(a.eps);
  const A* gain = static_cast<const A*>(a.gain);
  const A* bias = static_cast<const A*>(a.bias);
  const bool sum_formed = a.res != nullptr;
  const bool stream = a.stream != 0;
  const bool round_hat = rounds(a.hat_round, acc);
  const bool affine_after = gain || bias || a.scale || a.shift;
  // With x̂ rounding the gain and the rest are applied in a second pass over the rounded x̂.
  AffineFn<A> first = round_hat ? pick_affine<A>(a.centre != 0, false, false, false, false)
                                : pick_affine<A>(a.centre != 0, gain, bias, a.scale, a.shift);
  AffineFn<A> second = pick_affine<A>(false, gain, bias, a.scale, a.shift);

#pragma omp parallel num_threads(int(a.nthreads)) if (a.nthreads > 1)
  {
    Buffer<A> hb(n), tb(n), gb(n), sb(n), zb(n), yc(kChunk);
    Buffer<double> tmp(kChunk);
#pragma omp for schedule(static)
    for (i64 r = 0; r < a.rows; ++r) {
      const bool next = r + 1 < a.rows;
      const A* h;
      A sum = 0, sum_sq = 0;
      if (!sum_formed) {
        h = load_row_sums<A>(a.x, a.x_dtype, r, n, hb.p, &sum, &sum_sq);
      } else {
        load_row<A>(row_ptr(const_cast<void*>(a.x), a.x_dtype, r, n), a.x_dtype, n, hb.p);
        const A* o = view_row<A>(a.res, a.res_dtype, r, n, tb.p);
        if (a.gate) {
          const A* g = view_row<A>(a.gate, a.gate_dtype, r / a.gate_group, n, gb.p);
          NL_SIMD for (i64 i = 0; i < n; ++i) hb.p[i] = hb.p[i] + g[i] * o[i];
        } else {
          NL_SIMD for (i64 i = 0; i < n; ++i) hb.p[i] = hb.p[i] + o[i];
        }
        round_row<A>(hb.p, a.h_dtype, n);
        h = hb.p;
        A s = 0, q = 0;
        NL_SIMD_SUM2(s, q) for (i64 i = 0; i < n; ++i) {
          s += h[i];
          q += h[i] * h[i];
        }
        sum = s;
        sum_sq = q;
      }
      A mean = 0, rstd = 0;
      if (a.y) {
        if (a.centre) {
          mean = sum / A(n);
          A c2 = 0;
          NL_SIMD_SUM(c2) for (i64 i = 0; i < n; ++i) {
            A d = h[i] - mean;
            c2 += d * d;
          }
          rstd = A(1) / std::sqrt(c2 / A(n) + eps);
        } else {
          rstd = A(1) / std::sqrt(sum_sq / A(n) + eps);
        }
        if (a.mean_out) static_cast<A*>(a.mean_out)[r] = mean;
        if (a.rstd_out) static_cast<A*>(a.rstd_out)[r] = rstd;
      }
      const A* s =
          a.scale ? view_row<A>(a.scale, a.scale_dtype, r / a.scale_group, n, sb.p) : nullptr;
      const A* t =
          a.shift ? view_row<A>(a.shift, a.shift_dtype, r / a.shift_group, n, zb.p) : nullptr;
      void* y_row = a.y ? row_ptr(a.y, a.y_dtype, r, n) : nullptr;
      void* h_row = a.h_out ? row_ptr(a.h_out, a.h_dtype, r, n) : nullptr;
      for (i64 c = 0; c < n; c += kChunk) {
        const i64 m = std::min(kChunk, n - c);
        if (next) {  // the next row's inputs arrive while this row's outputs are computed
          prefetch_chunk(a.x, a.x_dtype, r + 1, n, c, m);
          prefetch_chunk(a.res, a.res_dtype, r + 1, n, c, m);
          if (a.gate_group == 1) prefetch_chunk(a.gate, a.gate_dtype, r + 1, n, c, m);
          if (a.scale_group == 1) prefetch_chunk(a.scale, a.scale_dtype, r + 1, n, c, m);
          if (a.shift_group == 1) prefetch_chunk(a.shift, a.shift_dtype, r + 1, n, c, m);
        }
        if (h_row) put_chunk<A>(h_row, a.h_dtype, c, h + c, m, stream, tmp.p);
        if (!y_row) continue;
        first(yc.p, h + c, mean, rstd, at(gain, c), at(bias, c), at(s, c), at(t, c), m);
        if (round_hat) {
          round_row<A>(yc.p, a.hat_round, m);
          if (affine_after)
            second(yc.p, yc.p, A(0), A(1), at(gain, c), at(bias, c), at(s, c), at(t, c), m);
        }
        put_chunk<A>(y_row, a.y_dtype, c, yc.p, m, stream, tmp.p);
      }
    }
    if (stream) stream_fence();
  }
}

template <int DT, bool CENTRE, int AFF, bool ROUND, int SUM>
void fast_forward(const ForwardArgs& a) {
  typedef Io<DT> io;
  typedef typename io::T T;
  const i64 n = a.dim;
  const float eps = float(a.eps);
  const float* gain = static_cast<const float*>(a.gain);
  const float* bias = static_cast<const float*>(a.bias);
  const bool stream = a.stream != 0;
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.res);
  const T* gate = static_cast<const T*>(a.gate);
  const T* scale = static_cast<const T*>(a.scale);
  const T* shift = static_cast<const T*>(a.shift);
  T* y = static_cast<T*>(a.y);
  T* h_out = static_cast<T*>(a.h_out);
  float* mean_out = static_cast<float*>(a.mean_out);
  float* rstd_out = static_cast<float*>(a.rstd_out);

#pragma omp parallel num_threads(int(a.nthreads)) if (a.nthreads > 1)
  {
    Buffer<float> hb(SUM != kNoSum ? n : 1);
    Buffer<T> tc(kChunk);
#pragma omp for schedule(static)
    for (i64 r = 0; r < a.rows; ++r) {
      const T* xr = x + r * n;
      float* hp = hb.p;
      float sum = 0, sum_sq = 0;
      if constexpr (SUM == kNoSum) {
        if constexpr (CENTRE) {
          NL_SIMD_SUM(sum) for (i64 i = 0; i < n; ++i) sum += io::ld(xr[i]);
        } else {
          NL_SIMD_SUM(sum_sq) for (i64 i = 0; i < n; ++i) {
            float v = io::ld(xr[i]);
            sum_sq += v * v;
          }
        }
      } else {
        const T* rr = res + r * n;
        const T* gr = SUM == kGated ? gate + (r / a.gate_group) * n : nullptr;
        NL_SIMD_SUM2(sum, sum_sq) for (i64 i = 0; i < n; ++i) {
          float v;
          if constexpr (SUM == kGated)
            v = io::ld(xr[i]) + io::ld(gr[i]) * io::ld(rr[i]);
          else
            v = io::ld(xr[i]) + io::ld(rr[i]);
          v = io::rnd(v);
          hp[i] = v;
          sum += v;
          sum_sq += v * v;
        }
      }
      float mean = 0, rstd;
      if constexpr (CENTRE) {
        mean = sum / float(n);
        float c2 = 0;
        if constexpr (SUM == kNoSum) {
          NL_SIMD_SUM(c2) for (i64 i = 0; i < n; ++i) {
            float d = io::ld(xr[i]) - mean;
            c2 += d * d;
          }
        } else {
          NL_SIMD_SUM(c2) for (i64 i = 0; i < n; ++i) {
            float d = hp[i] - mean;
            c2 += d * d;
          }
        }
        rstd = 1.0f / std::sqrt(c2 / float(n) + eps);
      } else {
        rstd = 1.0f / std::sqrt(sum_sq / float(n) + eps);
      }
      if (mean_out) mean_out[r] = mean;
      if (rstd_out) rstd_out[r] = rstd;
      const T* sr = AFF >= kScale ? scale + (r / a.scale_group) * n : nullptr;
      const T* tr = AFF == kScaleShift ? shift + (r / a.shift_group) * n : nullptr;
      const bool next = r + 1 < a.rows;
      for (i64 c = 0; c < n; c += kChunk) {
        const i64 m = std::min(kChunk, n - c);
        if (next) {
          prefetch_chunk(a.x, DT, r + 1, n, c, m);
          if (SUM != kNoSum) prefetch_chunk(a.res, DT, r + 1, n, c, m);
          if (SUM == kGated && a.gate_group == 1) prefetch_chunk(a.gate, DT, r + 1, n, c, m);
          if (AFF >= kScale && a.scale_group == 1) prefetch_chunk(a.scale, DT, r + 1, n, c, m);
          if (AFF == kScaleShift && a.shift_group == 1) prefetch_chunk(a.shift, DT, r + 1, n, c, m);
        }
        if (SUM != kNoSum && h_out) {
          T* hd = stream ? tc.p : h_out + r * n + c;
          const float* hs = hp + c;
          NL_SIMD for (i64 i = 0; i < m; ++i) hd[i] = io::st(hs[i]);
          if (stream) put_bytes(h_out + r * n + c, tc.p, m * i64(sizeof(T)), true);
        }
        T* yd = stream ? tc.p : y + r * n + c;
        const T* xs = xr + c;
        const float* hs = hp + c;
        NL_SIMD for (i64 i = 0; i < m; ++i) {
          float v = SUM == kNoSum ? io::ld(xs[i]) : hs[i];
          float u = CENTRE ? (v - mean) * rstd : v * rstd;
          if (ROUND) u = io::rnd(u);
          if (AFF == kGain || AFF == kGainBias) u = u * gain[c + i];
          if (AFF == kGainBias) u = u + bias[c + i];
          if (AFF >= kScale) u = u * (1.0f + io::ld(sr[c + i]));
          if (AFF == kScaleShift) u = u + io::ld(tr[c + i]);
          yd[i] = io::st(u);
        }
        if (stream) put_bytes(y + r * n + c, tc.p, m * i64(sizeof(T)), true);
      }
    }
    if (stream) stream_fence();
  }
}

#ifdef NL_AVX512
// Row statistics. RMSNorm: m = Σh²/D. LayerNorm takes Σh and Σh² in the same pass and uses
// σ² = Σh²/D − μ² when μ² ≤ that σ² (the cancellation then costs at most one bit more than a
// centred sum: the relative error stays a few float32 ulps); a row whose mean dominates its
// spread (or that holds inf or NaN) gets the exact second pass σ² = Σ(h − μ)²/D over the row,
// which is still in L1. Either way rstd = 1/sqrt(σ² + ε).
template <bool CENTRE>
inline void row_stats(float sum, float sq, i64 n, float eps, float& mean, float& rstd,
                      bool& exact_pass) {
  if constexpr (CENTRE) {
    mean = sum / float(n);
    const float var = sq / float(n) - mean * mean;
    exact_pass = !(mean * mean <= var);
    rstd = exact_pass ? 0.0f : 1.0f / std::sqrt(var + eps);
  } else {
    mean = 0.0f;
    exact_pass = false;
    rstd = 1.0f / std::sqrt(sq / float(n) + eps);
  }
}

template <int DT, bool CENTRE, int AFF, bool ROUND, int SUM>
void avx_forward(const ForwardArgs& a) {
  typedef V16<DT> io;
  typedef typename io::T T;
  // Blocks of 64 columns run as two 32-column groups in the dtype's group order (see Pair),
  // with gain and bias reordered to match; the columns after the last block run 16 at a time.
  const i64 blocks = a.dim / 64;
  Buffer<float> gain_groups(io::kPermuted && a.gain ? a.dim : 1);
  Buffer<float> bias_groups(io::kPermuted && a.bias ? a.dim : 1);
  const float* gain_row = static_cast<const float*>(a.gain);
  const float* bias_row = static_cast<const float*>(a.bias);
  if (io::kPermuted && gain_row) {
    std::memcpy(gain_groups.p, gain_row, sizeof(float) * size_t(a.dim));
    permute_groups<DT>(gain_groups.p, 2 * blocks, true);
    gain_row = gain_groups.p;
  }
  if (io::kPermuted && bias_row) {
    std::memcpy(bias_groups.p, bias_row, sizeof(float) * size_t(a.dim));
    permute_groups<DT>(bias_groups.p, 2 * blocks, true);
    bias_row = bias_groups.p;
  }
  // With the "llama" rounding, a subnormal x̂ that the fast rounding flushed, times an infinite
  // or NaN gain, reads NaN instead of ±0; only then do the output groups also test for NaN.
  bool gain_finite = true;
  if (ROUND && gain_row) {
    __mmask16 odd = 0;  // lanes that held ±inf or NaN
    for (i64 c = 0; c < a.dim; c += 16)
      odd |= _mm512_fpclass_ps_mask(_mm512_maskz_loadu_ps(lanes_left(a.dim - c), gain_row + c),
                                    0x01 | 0x08 | 0x10 | 0x80);
    gain_finite = odd == 0;
  }

#pragma omp parallel num_threads(int(a.nthreads)) if (a.nthreads > 1)
  {
    // Private copies: an outlined parallel region reaches shared variables through a pointer and
    // would reload them after every store.
    const i64 n = a.dim, rows = a.rows, n64 = 64 * blocks;
    const i64 gate_group = a.gate_group, scale_group = a.scale_group, shift_group = a.shift_group;
    const float eps = float(a.eps);
    const float* const gain = gain_row;
    const float* const bias = bias_row;
    const bool nan_test = ROUND && !gain_finite;
    const T* const x = static_cast<const T*>(a.x);
    const T* const res = static_cast<const T*>(a.res);
    const T* const gate = static_cast<const T*>(a.gate);
    const T* const scale = static_cast<const T*>(a.scale);
    const T* const shift = static_cast<const T*>(a.shift);
    T* const y = static_cast<T*>(a.y);
    T* const h_out = static_cast<T*>(a.h_out);
    float* const mean_out = static_cast<float*>(a.mean_out);
    float* const rstd_out = static_cast<float*>(a.rstd_out);
    const bool stream = a.stream != 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    Buffer<float> hb(SUM != kNoSum ? n : 1);
    float* const hp = hb.p;  // the rounded sum h, in group order on the blocks
#pragma omp for schedule(static)
    for (i64 r = 0; r < rows; ++r) {
      const T* const xr = x + r * n;
      const T* const rr = SUM != kNoSum ? res + r * n : nullptr;
      const T* const gr = SUM == kGated ? gate + (r / gate_group) * n : nullptr;
      T* const hr = SUM != kNoSum && h_out ? h_out + r * n : nullptr;
      const bool h_stream = hr && stream_ok(hr, stream, io::kAlign);
      // h for 16 columns of the tail: x, or the rounded sum (kept in hb for the second pass).
      auto h_at = [=](i64 i, __mmask16 m) -> __m512 {
        if constexpr (SUM == kNoSum) {
          return io::load(xr + i, m);
        } else {
          __m512 o = io::load(rr + i, m);
          if constexpr (SUM == kGated) o = _mm512_mul_ps(io::load(gr + i, m), o);
          const __m512 v = io::round(_mm512_add_ps(io::load(xr + i, m), o));
          _mm512_mask_storeu_ps(hp + i, m, v);
          return v;
        }
      };
      // The same for a 32-column group, in group order; the blocks of h are stored here, from
      // the conversion that rounds them.
      auto h32 = [=](i64 i) -> Pair {
        if constexpr (SUM == kNoSum) {
          return io::load32(xr + i);
        } else {
          Pair o = io::load32(rr + i);
          if constexpr (SUM == kGated) {
            const Pair g = io::load32(gr + i);
            o = {_mm512_mul_ps(g.a, o.a), _mm512_mul_ps(g.b, o.b)};
          }
          const Pair v0 = io::load32(xr + i);
          const Pair v = io::round32_store({_mm512_add_ps(v0.a, o.a), _mm512_add_ps(v0.b, o.b)},
                                           hr ? hr + i : nullptr, h_stream);
          _mm512_storeu_ps(hp + i, v.a);
          _mm512_storeu_ps(hp + i + 16, v.b);
          return v;
        }
      };
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      __m512 q0 = s0, q1 = s0, q2 = s0, q3 = s0;
      i64 i = 0;
#if defined(__AVX512BF16__)
      if constexpr (DT == kBF16 && SUM == kNoSum) {
        // Σx² (and Σx = Σx·1) straight from the bf16 pairs: the products are exact in float32
        // and are summed in float32 (a subnormal x counts as 0, which no float32 sum notices).
        // Four independent accumulators: the instruction's latency, not its throughput, would
        // bound a loop with fewer.
        const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
        auto dot_block = [&](i64 c, __m512& q, __m512& s) {
          const __m512bh v = (__m512bh)_mm512_loadu_si512(xr + c);
          q = _mm512_dpbf16_ps(q, v, v);
          if constexpr (CENTRE) s = _mm512_dpbf16_ps(s, v, ones);
        };
        for (; i + 128 <= n; i += 128) {
          dot_block(i, q0, s0);
          dot_block(i + 32, q1, s1);
          dot_block(i + 64, q2, s2);
          dot_block(i + 96, q3, s3);
        }
        for (; i + 64 <= n; i += 64) {
          dot_block(i, q0, s0);
          dot_block(i + 32, q1, s1);
        }
      }
#endif
      for (; i + 64 <= n; i += 64) {
        const Pair v0 = h32(i), v1 = h32(i + 32);
        if constexpr (CENTRE) {
          s0 = _mm512_add_ps(s0, v0.a);
          s1 = _mm512_add_ps(s1, v0.b);
          s2 = _mm512_add_ps(s2, v1.a);
          s3 = _mm512_add_ps(s3, v1.b);
        }
        q0 = _mm512_add_ps(q0, _mm512_mul_ps(v0.a, v0.a));
        q1 = _mm512_add_ps(q1, _mm512_mul_ps(v0.b, v0.b));
        q2 = _mm512_add_ps(q2, _mm512_mul_ps(v1.a, v1.a));
        q3 = _mm512_add_ps(q3, _mm512_mul_ps(v1.b, v1.b));
      }
      for (; i < n; i += 16) {
        const __m512 v = h_at(i, lanes_left(n - i));
        if constexpr (CENTRE) s0 = _mm512_add_ps(s0, v);
        q0 = _mm512_add_ps(q0, _mm512_mul_ps(v, v));
      }
      float mean, rstd;
      bool exact_pass;
      row_stats<CENTRE>(CENTRE ? hsum(s0, s1, s2, s3) : 0.0f, hsum(q0, q1, q2, q3), n, eps, mean,
                        rstd, exact_pass);
      if (CENTRE && exact_pass) {  // (column order does not matter to a sum)
        const __m512 vm = _mm512_set1_ps(mean);
        __m512 c0 = _mm512_setzero_ps(), c1 = c0;
        for (i = 0; i < n; i += 32) {
          const __mmask16 m0 = lanes_left(n - i), m1 = lanes_left(n - i - 16);
          const __m512 v0 =
              SUM == kNoSum ? io::load(xr + i, m0) : _mm512_maskz_loadu_ps(m0, hp + i);
          const __m512 d0 = _mm512_maskz_sub_ps(m0, v0, vm);
          c0 = _mm512_add_ps(c0, _mm512_mul_ps(d0, d0));
          if (i + 16 < n) {
            const __m512 v1 =
                SUM == kNoSum ? io::load(xr + i + 16, m1) : _mm512_maskz_loadu_ps(m1, hp + i + 16);
            const __m512 d1 = _mm512_maskz_sub_ps(m1, v1, vm);
            c1 = _mm512_add_ps(c1, _mm512_mul_ps(d1, d1));
          }
        }
        const __m512 zero = _mm512_setzero_ps();
        rstd = 1.0f / std::sqrt(hsum(c0, c1, zero, zero) / float(n) + eps);
      }
      if (mean_out) mean_out[r] = mean;
      if (rstd_out) rstd_out[r] = rstd;
      const T* const sr = AFF >= kScale ? scale + (r / scale_group) * n : nullptr;
      const T* const tr = AFF == kScaleShift ? shift + (r / shift_group) * n : nullptr;
      const bool next = r + 1 < rows;
      T* const yr = y + r * n;
      const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd);
      // The output pass, with the non-temporal choice fixed outside the loop.
      auto out_pass = [=](auto y_stream, auto h_stream) {
        constexpr bool ys = decltype(y_stream)::value, hs = decltype(h_stream)::value;
        (void)hs;                      // unused without a residual sum
        auto normed = [=](__m512 v) {  // x̂
          return CENTRE ? _mm512_mul_ps(_mm512_sub_ps(v, vm), vr) : _mm512_mul_ps(v, vr);
        };
        // ((x̂ rounded or not) · gain + bias) · (1 + s) + t; s, t in the same order as u
        auto affine = [=](__m512 u, const float* g, const float* b, __m512 s, __m512 t) {
          if constexpr (AFF == kGain || AFF == kGainBias) u = _mm512_mul_ps(u, _mm512_loadu_ps(g));
          if constexpr (AFF == kGainBias) u = _mm512_add_ps(u, _mm512_loadu_ps(b));
          if constexpr (AFF >= kScale) u = _mm512_mul_ps(u, _mm512_add_ps(one, s));
          if constexpr (AFF == kScaleShift) u = _mm512_add_ps(u, t);
          return u;
        };
        // Tail: 16 columns in column order, any mask, exact.
        auto out_at = [=](i64 c, __mmask16 m) {
          __m512 v;
          if constexpr (SUM == kNoSum) {
            v = io::load(xr + c, m);
          } else {
            v = _mm512_maskz_loadu_ps(m, hp + c);
            if (hr) io::store(hr + c, v, m, hs);
          }
          __m512 u = normed(v);
          if constexpr (ROUND) u = io::round(u);
          if constexpr (AFF == kGain || AFF == kGainBias)
            u = _mm512_mul_ps(u, _mm512_maskz_loadu_ps(m, gain + c));
          if constexpr (AFF == kGainBias) u = _mm512_add_ps(u, _mm512_maskz_loadu_ps(m, bias + c));
          if constexpr (AFF >= kScale)
            u = _mm512_mul_ps(u, _mm512_add_ps(one, io::load(sr + c, m)));
          if constexpr (AFF == kScaleShift) u = _mm512_add_ps(u, io::load(tr + c, m));
          io::store(yr + c, u, m, ys);
        };
        // Blocks: a 32-column group in group order. A group with a ±0 result (or a
        // subnormal the fast rounding flushed) is recomputed with exact rounding.
        auto out32 = [=](i64 c) {
          Pair v;
          if constexpr (SUM == kNoSum) {
            v = io::load32(xr + c);
          } else {
            v = {_mm512_loadu_ps(hp + c), _mm512_loadu_ps(hp + c + 16)};  // h: stored already
          }
          Pair s{}, t{};
          if constexpr (AFF >= kScale) s = io::load32(sr + c);
          if constexpr (AFF == kScaleShift) t = io::load32(tr + c);
          Pair u{normed(v.a), normed(v.b)};
          const Pair x_hat = u;
          if constexpr (ROUND) u = io::round32_inner(u);
          u = {affine(u.a, gain + c, bias + c, s.a, t.a),
               affine(u.b, gain + c + 16, bias + c + 16, s.b, t.b)};
          const bool stored =
              nan_test ? io::store32_strict(yr + c, u, ys) : io::store32(yr + c, u, ys);
          if (__builtin_expect(!stored, 0)) {
            u = x_hat;
            if constexpr (ROUND) u = {io::round(u.a), io::round(u.b)};
            u = {affine(u.a, gain + c, bias + c, s.a, t.a),
                 affine(u.b, gain + c + 16, bias + c + 16, s.b, t.b)};
            io::store32_exact(yr + c, u, ys);
          }
        };
        i64 c = 0;
        for (; c < n64; c += 64) {
          if (next) {  // the next row streams in while this one is written
            prefetch_block(x, r + 1, n, c);
            if (SUM != kNoSum) prefetch_block(res, r + 1, n, c);
            if (SUM == kGated && gate_group == 1) prefetch_block(gate, r + 1, n, c);
            if (AFF >= kScale && scale_group == 1) prefetch_block(scale, r + 1, n, c);
            if (AFF == kScaleShift && shift_group == 1) prefetch_block(shift, r + 1, n, c);
          }
          out32(c);
          out32(c + 32);
        }
        for (; c < n; c += 16) out_at(c, lanes_left(n - c));
      };
      const bool y_stream = stream_ok(yr, stream, io::kAlign);
      on_bool(y_stream, [&](auto ys) {
        if constexpr (SUM == kNoSum) {
          out_pass(ys, std::false_type{});
        } else {
          on_bool(h_stream, [&](auto hs) {
            out_pass(ys, hs);
            return true;
          });
        }
        return true;
      });
    }
    if (stream) stream_fence();
  }
}
#endif  // NL_AVX512

bool try_fast_forward(const ForwardArgs& a) {
  const i64 dt = a.x_dtype;
  if ((dt != kF32 && dt != kBF16) || !a.y || a.y_dtype != dt) return false;
  if (a.res && (a.res_dtype != dt || a.h_dtype != dt)) return false;
  if (a.gate && a.gate_dtype != dt) return false;
  if ((a.scale && a.scale_dtype != dt) || (a.shift && a.shift_dtype != dt)) return false;
  int aff;
  if (!a.gain && !a.bias && !a.scale && !a.shift)
    aff = kPlain;
  else if (a.gain && !a.bias && !a.scale && !a.shift)
    aff = kGain;
  else if (a.gain && a.bias && !a.scale && !a.shift)
    aff = kGainBias;
  else if (!a.gain && !a.bias && a.scale && !a.shift)
    aff = kScale;
  else if (!a.gain && !a.bias && a.scale && a.shift)
    aff = kScaleShift;
  else
    return false;
  const bool round = rounds(a.hat_round, kF32);
  if (round && a.hat_round != dt) return false;
  const int sum = !a.res ? kNoSum : (a.gate ? kGated : kAdd);
  return on_int<kF32, kBF16>(int(dt), [&](auto D) {
    return on_bool(a.centre != 0, [&](auto C) {
      return on_int<kPlain, kGain, kGainBias, kScale, kScaleShift>(aff, [&](auto F) {
        return on_bool(round, [&](auto R) {
          return on_int<kNoSum, kAdd, kGated>(sum, [&](auto S) {
            constexpr int d = decltype(D)::value, f = decltype(F)::value, s = decltype(S)::value;
            constexpr bool c = decltype(C)::value, r = decltype(R)::value;
            if constexpr (fast_shape<d, c, f, r, s, false>()) {
#ifdef NL_AVX512
              avx_forward<d, c, f, r, s>(a);
#else
              fast_forward<d, c, f, r, s>(a);
#endif
              return true;
            } else {
              return false;
            }
          });
        });
      });
    });
  });
}

}  // namespace
