// AVX-512 vector helpers of the fast paths (compiled only where the CPU has AVX-512).
#pragma once

#include "common.h"

// ------------------------------------------------------------------------------------------
// AVX-512 versions of the fast paths (16 float lanes; bfloat16 rounding by vcvtneps2bf16 where
// the CPU has it, with the rare NaN and subnormal lanes redone in software so that every result
// stays bit-identical to PyTorch's rounding). The loops mirror fast_forward / fast_backward.
// ------------------------------------------------------------------------------------------
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define NL_AVX512 1

namespace {

inline __m512 bf16x16_to_float(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m256i float_to_bf16x16_soft(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

inline __m256i float_to_bf16x16(__m512 v) {
#if defined(__AVX512BF16__)
  const __m256i fast = (__m256i)_mm512_cvtneps_pbh(v);
  // The instruction flushes subnormals and keeps NaN payloads: redo those lanes in software.
  const __mmask16 odd = _mm512_fpclass_ps_mask(v, 0x01 | 0x20 | 0x80);
  if (__builtin_expect(odd == 0, 1)) return fast;
  return _mm256_mask_blend_epi16(odd, fast, float_to_bf16x16_soft(v));
#else
  return float_to_bf16x16_soft(v);
#endif
}

// A group of 32 columns as two float vectors (Pair: a holds positions 0–15, b 16–31) in the
// order that is cheapest for the dtype. float32 keeps the column order. bfloat16 widens a group
// with vpunpck{l,h}wd, which interleave inside 128-bit lanes, so position q holds column
// 8·((q mod 16) div 4) + 4·(q div 16) + q mod 4; one vpermw restores the order when the group
// is stored. Everything in between is elementwise, so the kernels keep their float rows (gain,
// bias, the h and d̂ buffers, column sums) in the same order: see permute_groups.
struct Pair {
  __m512 a, b;
};

template <int DT>
struct V16;
template <>
struct V16<kF32> {
  typedef float T;
  static constexpr uintptr_t kAlign = 64;
  static constexpr bool kPermuted = false;
  static __m512 load(const T* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(T* p, __m512 v, __mmask16 m, bool stream) {
    if (stream && m == 0xFFFF)
      _mm512_stream_ps(p, v);
    else
      _mm512_mask_storeu_ps(p, m, v);
  }
  static __m512 round(__m512 v) { return v; }
  static __m512 round_inner(__m512 v) { return v; }
  static Pair load32(const T* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }
  static Pair round32(Pair v) { return v; }
  static Pair round32_inner(Pair v) { return v; }
  static Pair round32_store(Pair v, T* p, bool stream) {
    if (p) store32_exact(p, v, stream);
    return v;
  }
  static bool store32(T* p, Pair v, bool stream) {
    store32_exact(p, v, stream);
    return true;
  }
  static bool store32_strict(T* p, Pair v, bool stream) { return store32(p, v, stream); }
  static void store32_exact(T* p, Pair v, bool stream) {
    store(p, v.a, 0xFFFF, stream);
    store(p + 16, v.b, 0xFFFF, stream);
  }
};
template <>
struct V16<kBF16> {
  typedef uint16_t T;
  static constexpr uintptr_t kAlign = 32;
  static constexpr bool kPermuted = true;
  static __m512 load(const T* p, __mmask16 m) {
    return bf16x16_to_float(_mm256_maskz_loadu_epi16(m, p));
  }
  static void store(T* p, __m512 v, __mmask16 m, bool stream) {
    const __m256i b = float_to_bf16x16(v);
    if (stream && m == 0xFFFF)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), b);
    else
      _mm256_mask_storeu_epi16(p, m, b);
  }
  static __m512 round(__m512 v) { return bf16x16_to_float(float_to_bf16x16(v)); }
  // For a rounding inside a sum, not a stored result: may flush a subnormal (|v| < 2^-126) to
  // zero, which no float32 sum of normal terms can notice.
  static __m512 round_inner(__m512 v) {
#if defined(__AVX512BF16__)
    return bf16x16_to_float((__m256i)_mm512_cvtneps_pbh(v));
#else
    return round(v);
#endif
  }

  // Group order <-> column order of 32 bf16 words.
  static __m512i to_columns(__m512i w) {
    const __m512i order =
        _mm512_set_epi16(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8, 23, 22, 21,
                         20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    return _mm512_permutexvar_epi16(order, w);
  }
  static Pair widen(__m512i w) {  // 32 words in column order -> a Pair in group order
    const __m512i z = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w))};
  }
  static Pair load32(const T* p) { return widen(_mm512_loadu_si512(p)); }
  // The 32 values rounded to bf16 as words in group order (fast: may flush subnormals and keep
  // NaN payloads), and the exact conversion.
  static __m512i narrow_fast(Pair v) {
#if defined(__AVX512BF16__)
    return (__m512i)_mm512_cvtne2ps_pbh(v.b, v.a);
#else
    return narrow_exact(v);
#endif
  }
  static __m512i narrow_exact(Pair v) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(float_to_bf16x16(v.a)), float_to_bf16x16(v.b),
                              1);
  }
  // True when a word is ±0. Only such words can differ in value from the exact conversion (a
  // flushed subnormal reads as zero, also when an earlier fast rounding flushed it), so one test
  // replaces a check of every input. A NaN stays a NaN (quieted, sign and high payload bits
  // kept; PyTorch's own vectorised and scalar conversions also write different NaN patterns).
  static bool suspect(__m512i w) {
    return _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x7FFF)) != 0;
  }
  static Pair round32_inner(Pair v) { return widen(to_columns(narrow_fast(v))); }
  static Pair round32(Pair v) {  // exact, for results that are stored or added to
    const __m512i w = narrow_fast(v);
    if (__builtin_expect(suspect(w), 0)) return {round(v.a), round(v.b)};
    return widen(to_columns(w));
  }
  // round32, also storing the rounded group at p (when p is not null) from the same conversion.
  static Pair round32_store(Pair v, T* p, bool stream) {
    const __m512i w = narrow_fast(v);
    if (__builtin_expect(suspect(w), 0)) {
      const Pair exact{round(v.a), round(v.b)};
      if (p) store32_exact(p, exact, stream);
      return exact;
    }
    const __m512i columns = to_columns(w);
    if (p) put(p, columns, stream);
    return widen(columns);
  }
  static void put(T* p, __m512i w, bool stream) {  // 32 words in column order
    if (!stream) {
      _mm512_storeu_si512(p, w);
    } else if ((reinterpret_cast<uintptr_t>(p) & 63) == 0) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), w);
    } else {  // 32-byte aligned (stream_ok): two half-width streaming stores
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(w));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p + 16), _mm512_extracti64x4_epi64(w, 1));
    }
  }
  // Stores the group and returns true, unless a result is ±0: then it stores nothing and
  // returns false, for the caller to redo the group exactly (store32_exact, after recomputing
  // anything that round32_inner may have flushed).
  static bool store32(T* p, Pair v, bool stream) {
    const __m512i w = narrow_fast(v);
    if (__builtin_expect(suspect(w), 0)) return false;
    put(p, to_columns(w), stream);
    return true;
  }
  static void store32_exact(T* p, Pair v, bool stream) {
    put(p, to_columns(narrow_exact(v)), stream);
  }
  // store32 that also declines a NaN word: after round32_inner, a flushed subnormal times an
  // infinite gain reads as NaN where the exact product is infinite.
  static bool store32_strict(T* p, Pair v, bool stream) {
    const __m512i w = narrow_fast(v);
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7FFF));
    // (w & 0x7FFF) − 1, unsigned, exceeds 0x7F7F exactly for ±0 and NaN.
    if (__builtin_expect(_mm512_cmpgt_epu16_mask(_mm512_sub_epi16(mag, _mm512_set1_epi16(1)),
                                                 _mm512_set1_epi16(0x7F7F)) != 0,
                         0))
      return false;
    put(p, to_columns(w), stream);
    return true;
  }
};

// Reorders the first `groups` 32-column groups of a float row between column order and group
// order (to_groups) or back; the tail stays in column order. A no-op for float32 rows.
template <int DT>
void permute_groups(float* row, i64 groups, bool to_groups) {
  if constexpr (V16<DT>::kPermuted) {
    // Column c sits at position ((c >> 2) & 1)·16 + (c >> 3)·4 + (c & 3) of its group.
    const __m512i to_pos = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1,
                                            0);  // a: position j holds column σ(j)
    const __m512i to_pos_b = _mm512_set_epi32(31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12, 7, 6,
                                              5, 4);  // b: position 16 + j
    const __m512i to_col_lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1,
                                               0);  // columns 0–15 from positions
    const __m512i to_col_hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11,
                                               10, 9, 8);  // columns 16–31
    for (i64 g = 0; g < groups; ++g) {
      float* v = row + 32 * g;
      const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
      if (to_groups) {
        _mm512_storeu_ps(v, _mm512_permutex2var_ps(lo, to_pos, hi));
        _mm512_storeu_ps(v + 16, _mm512_permutex2var_ps(lo, to_pos_b, hi));
      } else {
        _mm512_storeu_ps(v, _mm512_permutex2var_ps(lo, to_col_lo, hi));
        _mm512_storeu_ps(v + 16, _mm512_permutex2var_ps(lo, to_col_hi, hi));
      }
    }
  } else {
    (void)row;
    (void)groups;
    (void)to_groups;
  }
}

inline __mmask16 lanes_left(i64 left) {  // the first min(left, 16) lanes, none when left <= 0
  return left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1u);
}

template <class T>
inline bool stream_ok(const T* row, bool stream, uintptr_t align) {
  return stream && (reinterpret_cast<uintptr_t>(row) % align) == 0;
}

// Prefetch the 64 elements of row `row` starting at column c (the next row, one block ahead),
// into L2: an L1 prefetch holds one of the core's few L1 miss buffers until the line arrives,
// which caps the bandwidth one core can draw.
template <class T>
inline void prefetch_block(const T* base, i64 row, i64 n, i64 c) {
  if (!base) return;
  const char* p = reinterpret_cast<const char*>(base + row * n + c);
  for (i64 o = 0; o < i64(64 * sizeof(T)); o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
}

template <class T>
inline void prefetch_group(const T* p) {  // the 32 elements at p, into L2
  const char* c = reinterpret_cast<const char*>(p);
  for (i64 o = 0; o < i64(32 * sizeof(T)); o += 64) _mm_prefetch(c + o, _MM_HINT_T1);
}

inline void accumulate(float* acc, __mmask16 m, __m512 v) {  // acc[lanes of m] += v
  _mm512_mask_storeu_ps(acc, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), v));
}

inline float hsum(__m512 a, __m512 b, __m512 c, __m512 d) {
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

}  // namespace

#endif  // AVX-512
