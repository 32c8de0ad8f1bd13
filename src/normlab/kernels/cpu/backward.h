// Backward kernels: the deterministic column sums, the general kernel, the fast paths and
// their AVX-512 versions.
#pragma once

#include "avx512.h"
#include "common.h"

namespace {

// ------------------------------------------------------------------------------------------
// Deterministic column reductions over groups of consecutive rows (see normlab_cpu.cpp)
// ------------------------------------------------------------------------------------------
struct Lanes {
  i64 rows, count;
  i64 begin(i64 p) const { return rows * p / count; }
  i64 of(i64 row) const {  // the lane holding `row`
    i64 p = row * count / rows;
    while (p + 1 < count && begin(p + 1) <= row) ++p;
    while (p > 0 && begin(p) > row) --p;
    return p;
  }
};

template <class A>
struct GroupSum {
  void* out = nullptr;  // [rows / group, dim] in dtype
  i64 dtype = kNoType, group = 1, dim = 0;
  A* slots = nullptr;  // [lanes, 2, dim]: a lane's partial first and last group

  bool active() const { return out != nullptr; }
  // Called by lane p when it has finished its rows of group k.
  void flush(const Lanes& lanes, i64 p, i64 k, const A* acc) const {
    i64 a = lanes.begin(p), b = lanes.begin(p + 1);
    if (k * group >= a && (k + 1) * group <= b) {
      store_row<A>(row_ptr(out, dtype, k, dim), dtype, dim, acc);
    } else {
      i64 slot = (k == a / group) ? 0 : 1;
      std::memcpy(slots + (p * 2 + slot) * dim, acc, sizeof(A) * size_t(dim));
    }
  }
  // After all lanes: add up, in lane order, the partial rows of every group that a lane boundary
  // cuts. There are fewer such groups than lanes, so this is O(lanes · dim) work.
  void combine(const Lanes& lanes, A* total) const {
    i64 last = -1;
    for (i64 p = 1; p < lanes.count; ++p) {
      const i64 row = lanes.begin(p), k = row / group;
      if (k * group == row || k == last) continue;  // the boundary is a group start
      last = k;
      std::fill(total, total + dim, A(0));
      const i64 p0 = lanes.of(k * group), p1 = lanes.of((k + 1) * group - 1);
      for (i64 q = p0; q <= p1; ++q) {
        const A* part = slots + (q * 2 + (k == lanes.begin(q) / group ? 0 : 1)) * dim;
        NL_SIMD for (i64 i = 0; i < dim; ++i) total[i] += part[i];
      }
      store_row<A>(row_ptr(out, dtype, k, dim), dtype, dim, total);
    }
  }
};

// ------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------
// clang-format off: a field and its dtype on one line, as the ctypes struct lists them
struct BackwardArgs {
  i64 rows, dim, nthreads, centre, lanes, stream;
  const void* h; i64 h_dtype;          // the normalised input, as saved
  const void* mean; const void* rstd;  // A values, [rows]; rstd null: no norm (gated sum only)
  const void* dy; i64 dy_dtype;        // null: y received no gradient
  const void* gain; i64 hat_round;
  const void* scale; i64 scale_dtype; i64 scale_group;
  const void* dh_in; i64 dh_in_dtype;  // incoming gradient of the h output, optional
  void* dx; i64 dx_dtype;
  void* dres; i64 dres_dtype;          // gradient of the residual (or of o in a gated sum)
  const void* gate; i64 gate_dtype; i64 gate_group;
  const void* other; i64 other_dtype;  // o of a gated sum
  void* dgain; i64 dgain_dtype;
  void* dbias; i64 dbias_dtype;
  void* dscale; i64 dscale_dtype;
  void* dshift; i64 dshift_dtype; i64 shift_group;
  void* dgate; i64 dgate_dtype;
  void* workspace;                     // A values, [active sums, lanes, 2, dim]
};
// clang-format on

// The five column sums: dgain, dbias, dscale, dshift, dgate, with their slots in the workspace.
template <class A>
void make_sums(const BackwardArgs& a, GroupSum<A>* sums) {
  A* work = static_cast<A*>(a.workspace);
  const i64 slot_size = a.lanes * 2 * a.dim;
  void* outs[5] = {a.dgain, a.dbias, a.dscale, a.dshift, a.dgate};
  i64 dtypes[5] = {a.dgain_dtype, a.dbias_dtype, a.dscale_dtype, a.dshift_dtype, a.dgate_dtype};
  i64 groups[5] = {a.rows, a.rows, a.scale_group, a.shift_group, a.gate_group};
  i64 used = 0;  // the workspace holds slots for the requested sums only
  for (int j = 0; j < 5; ++j) {
    sums[j].out = outs[j];
    sums[j].dtype = dtypes[j];
    sums[j].group = groups[j];
    sums[j].dim = a.dim;
    if (outs[j]) sums[j].slots = work + (used++) * slot_size;
  }
}

template <class A>
void combine_sums(const BackwardArgs& a, const GroupSum<A>* sums) {
  const Lanes lanes{a.rows, a.lanes};
  Buffer<A> total(a.dim);
  for (int j = 0; j < 5; ++j)
    if (sums[j].active()) sums[j].combine(lanes, total.p);
}

template <class A>
void backward(const BackwardArgs& a) {
  const i64 n = a.dim;
  const i64 acc = own_dtype<A>();
  const bool stream = a.stream != 0;
  const A* gain = static_cast<const A*>(a.gain);
  const A* means = static_cast<const A*>(a.mean);
  const A* rstds = static_cast<const A*>(a.rstd);
  const bool has_dy = a.dy && rstds;
  const bool round_hat = rounds(a.hat_round, acc);
  const bool round_h = rounds(a.h_dtype, acc);
  const Lanes lanes{a.rows, a.lanes};
  GroupSum<A> sums[5];
  make_sums<A>(a, sums);

#pragma omp parallel num_threads(int(a.nthreads)) if (a.nthreads > 1)
  {
    Buffer<A> hb(n), xb(n), gb(n), db(n), qb(n), sb(n), gt(n), accs(5 * n);
    Buffer<A> ec(kChunk), oc(kChunk), pc(kChunk);
    Buffer<double> tmp(kChunk);
    i64 current[5];
#pragma omp for schedule(static)
    for (i64 p = 0; p < a.lanes; ++p) {
      for (int j = 0; j < 5; ++j) current[j] = -1;
      const i64 last_row = lanes.begin(p + 1);
      for (i64 r = lanes.begin(p); r < last_row; ++r) {
        // Group bookkeeping: flush a sum whose group ended before this row.
        for (int j = 0; j < 5; ++j) {
          if (!sums[j].active()) continue;
          const i64 k = r / sums[j].group;
          if (k != current[j]) {
            if (current[j] >= 0) sums[j].flush(lanes, p, current[j], accs.p + j * n);
            std::fill(accs.p + j * n, accs.p + (j + 1) * n, A(0));
            current[j] = k;
          }
        }
        // Pass 1 over the row: x̂, the column sums of dy, d̂ and its row sums.
        A* dn = db.p;
        A c0 = 0, c1 = 0, rstd = 0;
        const A* xhat = xb.p;
        if (has_dy) {
          const A mean = a.centre ? means[r] : A(0);
          rstd = rstds[r];
          const A* h = view_row<A>(a.h, a.h_dtype, r, n, hb.p);
          if (a.centre) {
            NL_SIMD for (i64 i = 0; i < n; ++i) xb.p[i] = (h[i] - mean) * rstd;
          } else {
            NL_SIMD for (i64 i = 0; i < n; ++i) xb.p[i] = h[i] * rstd;
          }
          const A* g = view_row<A>(a.dy, a.dy_dtype, r, n, gb.p);
          const A* q = xhat;
          if (round_hat && sums[0].active()) {
            std::memcpy(qb.p, xhat, sizeof(A) * size_t(n));
            round_row<A>(qb.p, a.hat_round, n);
            q = qb.p;
          }
          A* const w = accs.p;  // dgain, dbias, dscale, dshift rows
          if (sums[0].active()) {
            NL_SIMD for (i64 i = 0; i < n; ++i) w[i] += g[i] * q[i];
          }
          if (sums[1].active()) {
            NL_SIMD for (i64 i = 0; i < n; ++i) w[n + i] += g[i];
          }
          if (sums[2].active()) {
            NL_SIMD for (i64 i = 0; i < n; ++i) w[2 * n + i] += g[i] * xhat[i];
          }
          if (sums[3].active()) {
            NL_SIMD for (i64 i = 0; i < n; ++i) w[3 * n + i] += g[i];
          }
          // d̂ = g·(1 + s)·gain, rounded like x̂.
          if (a.scale) {
            const A* s = view_row<A>(a.scale, a.scale_dtype, r / a.scale_group, n, sb.p);
            if (gain) {
              NL_SIMD for (i64 i = 0; i < n; ++i) dn[i] = (g[i] * (A(1) + s[i])) * gain[i];
            } else {
              NL_SIMD for (i64 i = 0; i < n; ++i) dn[i] = g[i] * (A(1) + s[i]);
            }
          } else if (gain) {
            NL_SIMD for (i64 i = 0; i < n; ++i) dn[i] = g[i] * gain[i];
          } else {
            std::memcpy(dn, g, sizeof(A) * size_t(n));
          }
          if (round_hat) round_row<A>(dn, a.hat_round, n);
          A dot = 0, total = 0;
          if (a.centre) {
            NL_SIMD_SUM2(dot, total) for (i64 i = 0; i < n; ++i) {
              dot += dn[i] * xhat[i];
              total += dn[i];
            }
          } else {
            NL_SIMD_SUM(dot) for (i64 i = 0; i < n; ++i) dot += dn[i] * xhat[i];
          }
          c1 = dot / A(n);
          c0 = total / A(n);
        }
        const A* gate_row =
            a.gate ? view_row<A>(a.gate, a.gate_dtype, r / a.gate_group, n, gt.p) : nullptr;
        const bool next = r + 1 < a.rows;
        // Pass 2, chunk by chunk: dh, its stores and the gated sums; the next row streams in.
        for (i64 c = 0; c < n; c += kChunk) {
          const i64 m = std::min(kChunk, n - c);
          if (next) {
            prefetch_chunk(a.h, a.h_dtype, r + 1, n, c, m);
            prefetch_chunk(a.dy, a.dy_dtype, r + 1, n, c, m);
            prefetch_chunk(a.dh_in, a.dh_in_dtype, r + 1, n, c, m);
            prefetch_chunk(a.other, a.other_dtype, r + 1, n, c, m);
            if (a.scale_group == 1) prefetch_chunk(a.scale, a.scale_dtype, r + 1, n, c, m);
            if (a.gate_group == 1) prefetch_chunk(a.gate, a.gate_dtype, r + 1, n, c, m);
          }
          A* d = dn + c;
          if (has_dy) {
            const A* xh = xhat + c;
            if (a.centre) {
              NL_SIMD for (i64 i = 0; i < m; ++i) d[i] = rstd * ((d[i] - c0) - xh[i] * c1);
            } else {
              NL_SIMD for (i64 i = 0; i < m; ++i) d[i] = rstd * (d[i] - xh[i] * c1);
            }
          } else {
            std::fill(d, d + m, A(0));
          }
          // Gradient of h: the norm's part rounded to h's dtype, plus the incoming one.
          if (round_h) round_row<A>(d, a.h_dtype, m);
          if (a.dh_in) {
            load_row<A>(static_cast<const char*>(a.dh_in) + (r * n + c) * dtype_size(a.dh_in_dtype),
                        a.dh_in_dtype, m, ec.p);
            NL_SIMD for (i64 i = 0; i < m; ++i) d[i] = d[i] + ec.p[i];
            if (round_h) round_row<A>(d, a.h_dtype, m);
          }
          if (a.dx)
            put_chunk<A>(row_ptr(a.dx, a.dx_dtype, r, n), a.dx_dtype, c, d, m, stream, tmp.p);
          if (!a.gate) {
            if (a.dres)
              put_chunk<A>(row_ptr(a.dres, a.dres_dtype, r, n), a.dres_dtype, c, d, m, stream,
                           tmp.p);
            continue;
          }
          const A* gc = gate_row + c;
          if (a.dres) {
            NL_SIMD for (i64 i = 0; i < m; ++i) pc.p[i] = d[i] * gc[i];
            put_chunk<A>(row_ptr(a.dres, a.dres_dtype, r, n), a.dres_dtype, c, pc.p, m, stream,
                         tmp.p);
          }
          if (sums[4].active()) {
            load_row<A>(static_cast<const char*>(a.other) + (r * n + c) * dtype_size(a.other_dtype),
                        a.other_dtype, m, oc.p);
            A* w = accs.p + 4 * n + c;
            NL_SIMD for (i64 i = 0; i < m; ++i) w[i] += d[i] * oc.p[i];
          }
        }
      }
      for (int j = 0; j < 5; ++j)
        if (sums[j].active() && current[j] >= 0)
          sums[j].flush(lanes, p, current[j], accs.p + j * n);
    }
    if (stream) stream_fence();
  }
  combine_sums<A>(a, sums);
}

#ifdef NL_AVX512
// Rows of one backward lane, on one dtype and op shape. Pass 1 runs over R rows at once, so the
// D-long column-sum rows (dgain, dbias, dscale, dshift) are read and written once per R rows and
// the row sums Σ d̂·x̂, Σ d̂ stay in registers; d̂ (the costly part: conversion, products and
// rounding) is kept in a row buffer for pass 2, which recomputes the cheap x̂ from h.
// Blocks of 64 columns run as two 32-column groups in the dtype's group order (see Pair): the
// gain, the d̂ rows and the column sums are kept in that order, and the sums are put back in
// column order before they leave the thread (permute_groups). The tail runs 16 columns at a time.
template <int DT, bool CENTRE, int AFF, bool ROUND, int SUM, bool TOKEN>
struct AvxBackward {
  typedef V16<DT> io;
  typedef typename io::T T;
  static constexpr bool GATED = SUM == kGated;
  static constexpr bool GAIN = AFF == kGain || AFF == kGainBias;

  const BackwardArgs& a;
  const i64 n;
  const i64 n64;      // columns in whole 64-column blocks
  const float* gain;  // in group order on the blocks
  const float* means;
  const float* rstds;
  const T* h;
  const T* dy;
  const T* scale;
  float* acc;   // this thread's [5, n] column sums: gain, bias, scale, shift, gate
  float* dhat;  // this thread's [R, n] d̂ rows
  bool stream;
  // Rows of 4 KiB or more: each starts a new page, where the hardware prefetchers stop, so pass 1
  // prefetches the next group of rows itself (pass 2 then prefetches nothing). Shorter rows
  // leave it to the hardware and pass 2 prefetches the next group's rows a block at a time.
  bool prefetch_in_sums;

  // Tail: 16 columns in column order, any mask.
  __m512 xhat_at(i64 r, i64 i, __mmask16 m, __m512 vm, __m512 vr) const {
    const __m512 v = io::load(h + r * n + i, m);
    return CENTRE ? _mm512_maskz_mul_ps(m, _mm512_sub_ps(v, vm), vr) : _mm512_mul_ps(v, vr);
  }
  // d̂ = dy·(1 + s)·gain, rounded like x̂ (zero in masked-off lanes). d̂ only enters sums and
  // dh = rstd·(d̂ − c0 − x̂·c1), so the rounding may flush a subnormal d̂ (see round_inner).
  __m512 dhat_at(i64 r, i64 i, __mmask16 m, __m512 g) const {
    __m512 d = g;
    if constexpr (GAIN) d = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, gain + i));
    if constexpr (AFF >= kScale) {
      const T* sr = scale + (r / a.scale_group) * n;
      d = _mm512_mul_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), io::load(sr + i, m)));
    }
    if constexpr (ROUND) d = io::round_inner(d);
    return d;
  }

  // Pass 1 over rows r0 … r0 + R − 1 (one group for every column sum): c0, c1 per row.
  template <int R>
  void row_sums(i64 r0, float* c0, float* c1) const {
    __m512 vm[R], vr[R], dot[R], tot[R];
    for (int k = 0; k < R; ++k) {
      vm[k] = _mm512_set1_ps(CENTRE ? means[r0 + k] : 0.0f);
      vr[k] = _mm512_set1_ps(rstds[r0 + k]);
      dot[k] = _mm512_setzero_ps();
      tot[k] = _mm512_setzero_ps();
    }
    float* const aw = acc;
    float* const ab = acc + n;
    float* const as = acc + 2 * n;
    float* const at = acc + 3 * n;
    const __m512 one = _mm512_set1_ps(1.0f);
    // Blocks: one 32-column group of every row, in group order.
    auto step32 = [&](i64 i) {
      Pair sw{_mm512_setzero_ps(), _mm512_setzero_ps()}, sb = sw, ss = sw, st = sw;
      Pair gain_v = sw;
      if (prefetch_in_sums && r0 + 2 * R <= a.rows) {  // the next group's rows, this group
        for (int k = 0; k < R; ++k) {
          prefetch_group(h + (r0 + R + k) * n + i);
          prefetch_group(dy + (r0 + R + k) * n + i);
        }
      }
      if constexpr (GAIN) gain_v = {_mm512_loadu_ps(gain + i), _mm512_loadu_ps(gain + i + 16)};
      for (int k = 0; k < R; ++k) {
        const i64 r = r0 + k;
        Pair xh = io::load32(h + r * n + i);
        if constexpr (CENTRE) xh = {_mm512_sub_ps(xh.a, vm[k]), _mm512_sub_ps(xh.b, vm[k])};
        xh = {_mm512_mul_ps(xh.a, vr[k]), _mm512_mul_ps(xh.b, vr[k])};
        const Pair g = io::load32(dy + r * n + i);
        if constexpr (GAIN) {
          const Pair q = ROUND ? io::round32_inner(xh) : xh;
          sw = {_mm512_add_ps(sw.a, _mm512_mul_ps(g.a, q.a)),
                _mm512_add_ps(sw.b, _mm512_mul_ps(g.b, q.b))};
        }
        if constexpr (AFF == kGainBias) sb = {_mm512_add_ps(sb.a, g.a), _mm512_add_ps(sb.b, g.b)};
        const Pair gx{_mm512_mul_ps(g.a, xh.a), _mm512_mul_ps(g.b, xh.b)};
        if constexpr (AFF >= kScale && !TOKEN)
          ss = {_mm512_add_ps(ss.a, gx.a), _mm512_add_ps(ss.b, gx.b)};
        if constexpr (AFF == kScaleShift && !TOKEN)
          st = {_mm512_add_ps(st.a, g.a), _mm512_add_ps(st.b, g.b)};
        if constexpr (TOKEN) {
          T* dsc = static_cast<T*>(a.dscale) + r * n;
          const bool s_stream = stream_ok(dsc, stream, io::kAlign);
          if (!io::store32(dsc + i, gx, s_stream)) io::store32_exact(dsc + i, gx, s_stream);
          if (AFF == kScaleShift && a.dshift) {
            T* dsh = static_cast<T*>(a.dshift) + r * n;
            const bool t_stream = stream_ok(dsh, stream, io::kAlign);
            if (!io::store32(dsh + i, g, t_stream)) io::store32_exact(dsh + i, g, t_stream);
          }
        }
        Pair d = g;
        if constexpr (GAIN) d = {_mm512_mul_ps(g.a, gain_v.a), _mm512_mul_ps(g.b, gain_v.b)};
        if constexpr (AFF >= kScale) {
          const Pair s = io::load32(scale + (r / a.scale_group) * n + i);
          d = {_mm512_mul_ps(g.a, _mm512_add_ps(one, s.a)),
               _mm512_mul_ps(g.b, _mm512_add_ps(one, s.b))};
        }
        if constexpr (ROUND) d = io::round32_inner(d);
        _mm512_storeu_ps(dhat + k * n + i, d.a);
        _mm512_storeu_ps(dhat + k * n + i + 16, d.b);
        dot[k] = _mm512_add_ps(dot[k],
                               _mm512_add_ps(_mm512_mul_ps(d.a, xh.a), _mm512_mul_ps(d.b, xh.b)));
        if constexpr (CENTRE) tot[k] = _mm512_add_ps(tot[k], _mm512_add_ps(d.a, d.b));
      }
      if constexpr (GAIN) {
        accumulate(aw + i, 0xFFFF, sw.a);
        accumulate(aw + i + 16, 0xFFFF, sw.b);
      }
      if constexpr (AFF == kGainBias) {
        accumulate(ab + i, 0xFFFF, sb.a);
        accumulate(ab + i + 16, 0xFFFF, sb.b);
      }
      if constexpr (AFF >= kScale && !TOKEN) {
        accumulate(as + i, 0xFFFF, ss.a);
        accumulate(as + i + 16, 0xFFFF, ss.b);
      }
      if constexpr (AFF == kScaleShift && !TOKEN) {
        accumulate(at + i, 0xFFFF, st.a);
        accumulate(at + i + 16, 0xFFFF, st.b);
      }
    };
    // Tail: 16 columns of every row, in column order.
    auto step = [&](i64 i, __mmask16 m) {
      __m512 sw = _mm512_setzero_ps(), sb = sw, ss = sw, st = sw;
      for (int k = 0; k < R; ++k) {
        const i64 r = r0 + k;
        const __m512 xh = xhat_at(r, i, m, vm[k], vr[k]);
        const __m512 g = io::load(dy + r * n + i, m);
        if constexpr (GAIN)
          sw = _mm512_add_ps(sw, _mm512_mul_ps(g, ROUND ? io::round_inner(xh) : xh));
        if constexpr (AFF == kGainBias) sb = _mm512_add_ps(sb, g);
        if constexpr (AFF >= kScale && !TOKEN) ss = _mm512_add_ps(ss, _mm512_mul_ps(g, xh));
        if constexpr (AFF == kScaleShift && !TOKEN) st = _mm512_add_ps(st, g);
        if constexpr (TOKEN) {
          T* dsc = static_cast<T*>(a.dscale) + r * n;
          const bool s_stream = stream_ok(dsc, stream, io::kAlign);
          io::store(dsc + i, _mm512_mul_ps(g, xh), m, s_stream);
          if (AFF == kScaleShift && a.dshift) {
            T* dsh = static_cast<T*>(a.dshift) + r * n;
            io::store(dsh + i, g, m, stream_ok(dsh, stream, io::kAlign));
          }
        }
        const __m512 d = dhat_at(r, i, m, g);
        _mm512_mask_storeu_ps(dhat + k * n + i, m, d);
        dot[k] = _mm512_add_ps(dot[k], _mm512_mul_ps(d, xh));
        if constexpr (CENTRE) tot[k] = _mm512_add_ps(tot[k], d);
      }
      if constexpr (GAIN) accumulate(aw + i, m, sw);
      if constexpr (AFF == kGainBias) accumulate(ab + i, m, sb);
      if constexpr (AFF >= kScale && !TOKEN) accumulate(as + i, m, ss);
      if constexpr (AFF == kScaleShift && !TOKEN) accumulate(at + i, m, st);
    };
    i64 i = 0;
    for (; i < n64; i += 32) step32(i);
    for (; i + 16 <= n; i += 16) step(i, 0xFFFF);
    if (i < n) step(i, lanes_left(n - i));
    for (int k = 0; k < R; ++k) {
      c1[k] = _mm512_reduce_add_ps(dot[k]) / float(n);
      c0[k] = CENTRE ? _mm512_reduce_add_ps(tot[k]) / float(n) : 0.0f;
    }
  }

  // Pass 2 over row r: dh = rstd·(d̂ − c0 − x̂·c1), rounded to h's dtype, + the incoming dh.
  // Evaluated as dh = (d̂ − (h − μ)·(rstd·c1))·rstd − rstd·c0, two fused multiply-adds: x̂ is
  // never formed, h − μ keeps LayerNorm free of cancellation, and no factor is rstd², which
  // underflows float32 for rows of magnitude beyond ~1e19. LayerNorm over D = 1 has both factors
  // zero, so dh is exactly 0 there, not the rounding error of rstd·c0.
  // `ahead` is the row to prefetch meanwhile: the same row of the next group of rows.
  void row_grad(i64 r, const float* db, float c0, float c1, i64 ahead) const {
    const T* const dh = a.dh_in ? static_cast<const T*>(a.dh_in) + r * n : nullptr;
    T* const dxr = static_cast<T*>(a.dx) + r * n;
    T* const dor = GATED ? static_cast<T*>(a.dres) + r * n : nullptr;
    const bool dx_stream = stream_ok(dxr, stream, io::kAlign);
    const bool do_stream = GATED && stream_ok(dor, stream, io::kAlign);
    on_bool(dh != nullptr, [&](auto with_dh) {
      on_bool(dx_stream && (!GATED || do_stream), [&](auto st) {
        row_grad_loop<decltype(with_dh)::value, decltype(st)::value>(r, db, c0, c1, ahead, dh, dxr,
                                                                     dor);
        return true;
      });
      return true;
    });
  }

  template <bool DH, bool STREAM>
  void row_grad_loop(i64 r, const float* __restrict db, float c0, float c1, i64 ahead,
                     const T* __restrict dh, T* __restrict dxr, T* __restrict dor) const {
    const float rstd = rstds[r];
    const __m512 vm = _mm512_set1_ps(CENTRE ? means[r] : 0.0f);
    // LayerNorm over D = 1: h − μ ≡ 0, so the norm passes exactly no gradient to h (a zero
    // factor, not the rounding error of rstd·c0 that grows with 1/√ε)
    const bool none = CENTRE && n == 1;
    const __m512 va = _mm512_set1_ps(none ? 0.0f : rstd);
    const __m512 va0 = _mm512_set1_ps(none ? -0.0f : -rstd * c0);
    const __m512 vb = _mm512_set1_ps(rstd * c1);
    const T* __restrict const hr = h + r * n;
    const T* const gt = GATED ? static_cast<const T*>(a.gate) + (r / a.gate_group) * n : nullptr;
    const T* const orow = GATED ? static_cast<const T*>(a.other) + r * n : nullptr;
    float* const ag = acc + 4 * n;
    const i64 rows = a.rows, gate_group = a.gate_group, scale_group = a.scale_group;
    const T* const dh_base = static_cast<const T*>(a.dh_in);
    const T* const other = static_cast<const T*>(a.other);
    const T* const gate = static_cast<const T*>(a.gate);
    const bool next = ahead < rows;
    auto grad = [&](__m512 hv, __m512 d) {  // before rounding and the incoming gradient
      if constexpr (CENTRE) hv = _mm512_sub_ps(hv, vm);
      return _mm512_fmadd_ps(_mm512_fnmadd_ps(hv, vb, d), va, va0);
    };
    // Tail: 16 columns in column order, any mask.
    auto step = [&](i64 i, __mmask16 m) {
      __m512 v = grad(io::load(hr + i, m), _mm512_maskz_loadu_ps(m, db + i));
      if constexpr (DH) v = _mm512_add_ps(io::round(v), io::load(dh + i, m));
      if constexpr (GATED) v = io::round(v);
      io::store(dxr + i, v, m, STREAM);  // the store rounds to h's dtype
      if constexpr (GATED) {
        io::store(dor + i, _mm512_mul_ps(v, io::load(gt + i, m)), m, STREAM);
        accumulate(ag + i, m, _mm512_mul_ps(v, io::load(orow + i, m)));
      }
    };
    // Blocks: a 32-column group in group order.
    auto put32 = [&](T* p, Pair v) {
      if (!io::store32(p, v, STREAM)) io::store32_exact(p, v, STREAM);
    };
    auto step32 = [&](i64 i) {
      const Pair hv = io::load32(hr + i);
      Pair v{grad(hv.a, _mm512_loadu_ps(db + i)), grad(hv.b, _mm512_loadu_ps(db + i + 16))};
      if constexpr (DH) {
        const Pair d = io::load32(dh + i);
        v = io::round32(v);
        v = {_mm512_add_ps(v.a, d.a), _mm512_add_ps(v.b, d.b)};
      }
      if constexpr (GATED) v = io::round32(v);
      put32(dxr + i, v);
      if constexpr (GATED) {
        const Pair g = io::load32(gt + i), o = io::load32(orow + i);
        put32(dor + i, {_mm512_mul_ps(v.a, g.a), _mm512_mul_ps(v.b, g.b)});
        accumulate(ag + i, 0xFFFF, _mm512_mul_ps(v.a, o.a));
        accumulate(ag + i + 16, 0xFFFF, _mm512_mul_ps(v.b, o.b));
      }
    };
    i64 i = 0;
    for (; i < n64; i += 64) {
      if (next) {  // the next row streams in while this one is written
        prefetch_block(h, ahead, n, i);
        prefetch_block(dy, ahead, n, i);
        if (DH) prefetch_block(dh_base, ahead, n, i);
        if (GATED) prefetch_block(other, ahead, n, i);
        if (AFF >= kScale && scale_group == 1) prefetch_block(scale, ahead, n, i);
        if (GATED && gate_group == 1) prefetch_block(gate, ahead, n, i);
      }
      step32(i);
      step32(i + 32);
    }
    for (; i < n; i += 16) step(i, lanes_left(n - i));
  }
};

template <int DT, bool CENTRE, int AFF, bool ROUND, int SUM, bool TOKEN>
void avx_backward(const BackwardArgs& a, GroupSum<float>* sums) {
  typedef AvxBackward<DT, CENTRE, AFF, ROUND, SUM, TOKEN> Kernel;
  const i64 n = a.dim;
  const i64 groups = 2 * (n / 64);
  const Lanes lanes{a.rows, a.lanes};
  constexpr int R = 4;
  Buffer<float> gain_groups(V16<DT>::kPermuted && a.gain ? n : 1);
  const float* gain = static_cast<const float*>(a.gain);
  if (V16<DT>::kPermuted && gain) {
    std::memcpy(gain_groups.p, gain, sizeof(float) * size_t(n));
    permute_groups<DT>(gain_groups.p, groups, true);
    gain = gain_groups.p;
  }

#pragma omp parallel num_threads(int(a.nthreads)) if (a.nthreads > 1)
  {
    Buffer<float> accs(5 * n), dhat(R * n);
    std::fill(accs.p, accs.p + 5 * n, 0.0f);
    const Kernel k{a,
                   n,
                   32 * groups,
                   gain,
                   static_cast<const float*>(a.mean),
                   static_cast<const float*>(a.rstd),
                   static_cast<const typename Kernel::T*>(a.h),
                   static_cast<const typename Kernel::T*>(a.dy),
                   static_cast<const typename Kernel::T*>(a.scale),
                   accs.p,
                   dhat.p,
                   a.stream != 0,
                   n * i64(sizeof(typename Kernel::T)) >= 4096};
    i64 current[5];
    auto flush = [&](int j, i64 p) {  // column sum j of group current[j], back in column order
      permute_groups<DT>(accs.p + j * n, groups, false);
      sums[j].flush(lanes, p, current[j], accs.p + j * n);
    };
#pragma omp for schedule(static)
    for (i64 p = 0; p < a.lanes; ++p) {
      for (int j = 0; j < 5; ++j) current[j] = -1;
      const i64 last_row = lanes.begin(p + 1);
      i64 r = lanes.begin(p);
      while (r < last_row) {
        // Rows r … r + R − 1 go together when they share every column sum's group.
        i64 take = std::min<i64>(R, last_row - r);
        for (int j = 0; j < 5; ++j) {
          if (!sums[j].active()) continue;
          const i64 g = r / sums[j].group;
          if (g != current[j]) {
            if (current[j] >= 0) flush(j, p);
            std::fill(accs.p + j * n, accs.p + (j + 1) * n, 0.0f);
            current[j] = g;
          }
          take = std::min(take, (g + 1) * sums[j].group - r);
        }
        float c0[R], c1[R];
        if (take == R) {
          k.template row_sums<R>(r, c0, c1);
        } else {
          take = 1;
          k.template row_sums<1>(r, c0, c1);
        }
        for (i64 q = 0; q < take; ++q) {
          const i64 ahead = k.prefetch_in_sums ? a.rows : r + q + R;  // a.rows: none
          k.row_grad(r + q, dhat.p + q * n, c0[q], c1[q], ahead);
        }
        r += take;
      }
      for (int j = 0; j < 5; ++j)
        if (sums[j].active() && current[j] >= 0) flush(j, p);
    }
    if (a.stream) stream_fence();
  }
}
#endif  // NL_AVX512

// Second backward pass over one chunk: dh = rstd·(d̂ − c0 − x̂·c1), rounded to h's dtype, +
// the incoming gradient of h; stores dx and, for a gated sum, do = dh·gate and Σ dh·o.
template <int DT, bool CENTRE, bool GATED, bool DH>
void fast_dh_chunk(const BackwardArgs& a, i64 r, i64 c, i64 m, float rstd, float c0, float c1,
                   const float* xb, const float* db, const typename Io<DT>::T* gate_row,
                   float* gate_acc, typename Io<DT>::T* tc, bool stream) {
  typedef Io<DT> io;
  typedef typename io::T T;
  const i64 n = a.dim;
  const T* dh = static_cast<const T*>(a.dh_in) + r * n + c;
  const T* o = static_cast<const T*>(a.other) + r * n + c;
  T* dx = static_cast<T*>(a.dx) + r * n + c;
  T* dres = static_cast<T*>(a.dres) + r * n + c;
  T* dxd = stream ? tc : dx;
  T* dod = stream ? tc + kChunk : dres;
  const float* xs = xb + c;
  const float* ds = db + c;
  const T* gs = GATED ? gate_row + c : nullptr;
  float* ga = GATED ? gate_acc + c : nullptr;
  NL_SIMD for (i64 i = 0; i < m; ++i) {
    float v = CENTRE ? rstd * ((ds[i] - c0) - xs[i] * c1) : rstd * (ds[i] - xs[i] * c1);
    v = io::rnd(v);
    if (DH) v = io::rnd(v + io::ld(dh[i]));
    dxd[i] = io::st(v);
    if (GATED) {
      dod[i] = io::st(v * io::ld(gs[i]));
      ga[i] += v * io::ld(o[i]);
    }
  }
  if (stream) {
    put_bytes(dx, tc, m * i64(sizeof(T)), true);
    if (GATED) put_bytes(dres, tc + kChunk, m * i64(sizeof(T)), true);
  }
}

template <int DT, bool CENTRE, int AFF, bool ROUND, int SUM, bool TOKEN>
void fast_backward(const BackwardArgs& a, GroupSum<float>* sums) {
  typedef Io<DT> io;
  typedef typename io::T T;
  constexpr bool GATED = SUM == kGated;
  const i64 n = a.dim;
  const bool stream = a.stream != 0;
  const float* gain = static_cast<const float*>(a.gain);
  const float* means = static_cast<const float*>(a.mean);
  const float* rstds = static_cast<const float*>(a.rstd);
  const T* h = static_cast<const T*>(a.h);
  const T* dy = static_cast<const T*>(a.dy);
  const T* scale = static_cast<const T*>(a.scale);
  const T* gate = static_cast<const T*>(a.gate);
  const Lanes lanes{a.rows, a.lanes};
  const bool dh = a.dh_in != nullptr;

#pragma omp parallel num_threads(int(a.nthreads)) if (a.nthreads > 1)
  {
    Buffer<float> xb(n), db(n), accs(5 * n);
    Buffer<T> tc(2 * kChunk);
    std::fill(accs.p, accs.p + 5 * n, 0.0f);
    i64 current[5];
#pragma omp for schedule(static)
    for (i64 p = 0; p < a.lanes; ++p) {
      for (int j = 0; j < 5; ++j) current[j] = -1;
      const i64 last_row = lanes.begin(p + 1);
      for (i64 r = lanes.begin(p); r < last_row; ++r) {
        for (int j = 0; j < 5; ++j) {
          if (!sums[j].active()) continue;
          const i64 k = r / sums[j].group;
          if (k != current[j]) {
            if (current[j] >= 0) sums[j].flush(lanes, p, current[j], accs.p + j * n);
            std::fill(accs.p + j * n, accs.p + (j + 1) * n, 0.0f);
            current[j] = k;
          }
        }
        const float mean = CENTRE ? means[r] : 0.0f;
        const float rstd = rstds[r];
        const T* hr = h + r * n;
        const T* gr = dy + r * n;
        const T* sr = AFF >= kScale ? scale + (r / a.scale_group) * n : nullptr;
        float* aw = accs.p;          // Σ dy·q       (gain)
        float* ab = accs.p + n;      // Σ dy         (bias)
        float* as = accs.p + 2 * n;  // Σ dy·x̂      (scale)
        float* at = accs.p + 3 * n;  // Σ dy         (shift)
        float dot = 0, total = 0;
        if constexpr (TOKEN) {
          // Per-token modulation: dscale = dy·x̂ and dshift = dy are rows of their own.
          T* dsc = static_cast<T*>(a.dscale) + r * n;
          T* dsh = AFF == kScaleShift ? static_cast<T*>(a.dshift) + r * n : nullptr;
          for (i64 c = 0; c < n; c += kChunk) {
            const i64 m = std::min(kChunk, n - c);
            T* sd = stream ? tc.p : dsc + c;
            T* td = stream ? tc.p + kChunk : (dsh ? dsh + c : tc.p + kChunk);
            NL_SIMD_SUM2(dot, total) for (i64 i = 0; i < m; ++i) {
              const i64 j = c + i;
              float xh = CENTRE ? (io::ld(hr[j]) - mean) * rstd : io::ld(hr[j]) * rstd;
              float g = io::ld(gr[j]);
              sd[i] = io::st(g * xh);
              if (AFF == kScaleShift) td[i] = io::st(g);
              float d = g * (1.0f + io::ld(sr[j]));
              xb.p[j] = xh;
              db.p[j] = d;
              dot += d * xh;
              total += d;
            }
            if (stream) {
              put_bytes(dsc + c, tc.p, m * i64(sizeof(T)), true);
              if (dsh) put_bytes(dsh + c, tc.p + kChunk, m * i64(sizeof(T)), true);
            }
          }
        } else {
          NL_SIMD_SUM2(dot, total) for (i64 i = 0; i < n; ++i) {
            float xh = CENTRE ? (io::ld(hr[i]) - mean) * rstd : io::ld(hr[i]) * rstd;
            float g = io::ld(gr[i]);
            float d = g;
            if (AFF == kGain || AFF == kGainBias) {
              aw[i] += g * (ROUND ? io::rnd(xh) : xh);
              d = g * gain[i];
            }
            if (AFF == kGainBias) ab[i] += g;
            if (AFF >= kScale) {
              as[i] += g * xh;
              d = g * (1.0f + io::ld(sr[i]));
            }
            if (AFF == kScaleShift) at[i] += g;
            if (ROUND) d = io::rnd(d);
            xb.p[i] = xh;
            db.p[i] = d;
            dot += d * xh;
            total += d;
          }
        }
        const float c1 = dot / float(n), c0 = CENTRE ? total / float(n) : 0.0f;
        const T* gate_row = GATED ? gate + (r / a.gate_group) * n : nullptr;
        const bool next = r + 1 < a.rows;
        for (i64 c = 0; c < n; c += kChunk) {
          const i64 m = std::min(kChunk, n - c);
          if (next) {
            prefetch_chunk(a.h, DT, r + 1, n, c, m);
            prefetch_chunk(a.dy, DT, r + 1, n, c, m);
            if (dh) prefetch_chunk(a.dh_in, DT, r + 1, n, c, m);
            if (GATED) prefetch_chunk(a.other, DT, r + 1, n, c, m);
            if (AFF >= kScale && a.scale_group == 1) prefetch_chunk(a.scale, DT, r + 1, n, c, m);
            if (GATED && a.gate_group == 1) prefetch_chunk(a.gate, DT, r + 1, n, c, m);
          }
          float* gate_acc = accs.p + 4 * n;
          if (dh)
            fast_dh_chunk<DT, CENTRE, GATED, true>(a, r, c, m, rstd, c0, c1, xb.p, db.p, gate_row,
                                                   gate_acc, tc.p, stream);
          else
            fast_dh_chunk<DT, CENTRE, GATED, false>(a, r, c, m, rstd, c0, c1, xb.p, db.p, gate_row,
                                                    gate_acc, tc.p, stream);
        }
      }
      for (int j = 0; j < 5; ++j)
        if (sums[j].active() && current[j] >= 0)
          sums[j].flush(lanes, p, current[j], accs.p + j * n);
    }
    if (stream) stream_fence();
  }
}

bool try_fast_backward(const BackwardArgs& a) {
  GroupSum<float> sums[5];
  make_sums<float>(a, sums);
  const i64 dt = a.h_dtype;
  if ((dt != kF32 && dt != kBF16) || !a.dy || !a.rstd || a.dy_dtype != dt) return false;
  if (!a.dx || a.dx_dtype != dt || (a.dh_in && a.dh_in_dtype != dt)) return false;
  if (a.scale && a.scale_dtype != dt) return false;
  const bool gated = a.gate != nullptr;
  if (gated &&
      (a.gate_dtype != dt || !a.other || a.other_dtype != dt || !a.dres || a.dres_dtype != dt))
    return false;
  if (!gated && a.dres) return false;
  int aff;
  if (a.gain && !a.scale)
    aff = a.dbias ? kGainBias : kGain;
  else if (!a.gain && a.scale)
    aff = a.dshift ? kScaleShift : kScale;
  else if (!a.gain && !a.scale && !a.dbias && !a.dshift)
    aff = kPlain;
  else
    return false;
  if (aff == kPlain && (a.dgain || a.dscale)) return false;
  const bool token = aff >= kScale && a.scale_group == 1 && (aff == kScale || a.shift_group == 1);
  if (token && (!a.dscale || a.dscale_dtype != dt || (a.dshift && a.dshift_dtype != dt)))
    return false;
  if (token) {  // written row by row, not through the group sums
    sums[2].out = nullptr;
    sums[3].out = nullptr;
  }
  const bool round = rounds(a.hat_round, kF32);
  if (round && a.hat_round != dt) return false;
  const int sum = gated ? kGated : kNoSum;
  return on_int<kF32, kBF16>(int(dt), [&](auto D) {
    return on_bool(a.centre != 0, [&](auto C) {
      return on_int<kPlain, kGain, kGainBias, kScale, kScaleShift>(aff, [&](auto F) {
        return on_bool(round, [&](auto R) {
          return on_int<kNoSum, kGated>(sum, [&](auto S) {
            return on_bool(token, [&](auto K) {
              constexpr int d = decltype(D)::value, f = decltype(F)::value, s = decltype(S)::value;
              constexpr bool c = decltype(C)::value, r = decltype(R)::value, k = decltype(K)::value;
              if constexpr (fast_shape<d, c, f, r, s, k>()) {
#ifdef NL_AVX512
                avx_backward<d, c, f, r, s, k>(a, sums);
#else
                fast_backward<d, c, f, r, s, k>(a, sums);
#endif
                combine_sums<float>(a, sums);
                return true;
              } else {
                return false;
              }
            });
          });
        });
      });
    });
  });
}

}  // namespace
