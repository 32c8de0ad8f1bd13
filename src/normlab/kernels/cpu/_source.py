"""C++ source of the fused CPU norm kernels (built on first use by :mod:`._build`).

The source is kept in a Python string so that it ships inside the package with no packaging
configuration. It includes no PyTorch header: the library exports two ``extern "C"`` entry points
that take a plain struct of pointers and sizes, so a build takes a few seconds, not minutes.

One forward and one backward kernel serve every op. Each works row by row (one token's vector of
D values): a row is loaded once from memory, converted to the accumulation type A (float, or
double for float64 input) in a buffer that stays in L1/L2, and every further pass over it runs in
cache. OpenMP spreads rows over threads.

Forward, for a row h (h = x, or x + r, or x + g·o, rounded to h's dtype when a sum is formed)::

    LayerNorm: μ = Σh/D, σ² = Σ(h − μ)²/D, rstd = 1/sqrt(σ² + ε), x̂ = (h − μ)·rstd
               (the AVX-512 path reads Σh and Σh² in one pass and uses σ² = Σh²/D − μ² when
               μ² ≤ σ², which costs at most a bit more than the centred sum; other rows get the
               centred sum, from cache)
    RMSNorm:   m = Σh²/D,                 rstd = 1/sqrt(m + ε),  x̂ = h·rstd
    q = round(x̂) in the "llama" casting, else x̂
    y = ((q·gain + bias)·(1 + s) + t), each factor optional, stored in y's dtype

Backward, with g = dy (float) and the saved μ, rstd::

    d̂ = g·(1 + s)·gain, rounded like x̂ in the "llama" casting
    RMSNorm:   dh = rstd·(d̂ − x̂·Σ(d̂·x̂)/D)
    LayerNorm: dh = rstd·(d̂ − Σd̂/D − x̂·Σ(d̂·x̂)/D)
    (the AVX-512 path evaluates dh = (d̂ − (h − μ)·(rstd·c1))·rstd − rstd·c0 with c0 = Σd̂/D
    and c1 = Σ(d̂·x̂)/D, as two fused multiply-adds; no rstd² that could underflow)
    dgain = Σrows g·q, dbias = Σrows g, dscale = Σgroup g·x̂, dshift = Σgroup g,
    dgate = Σgroup dh·o, do = dh·gate; dh adds the incoming gradient of the h output.

Rounding: every stored result (y, h, dx, …) is rounded to its dtype exactly as PyTorch rounds
it (round to nearest even, subnormals kept; a NaN stays NaN, its bit pattern not fixed, as
between PyTorch's own vectorised and scalar conversions). Inside the AVX-512 backward, the
"llama" rounding of x̂ and d̂ may flush a subnormal (|v| < 2^-126) to zero, which drops the terms
that have it as a factor: at most |dy|·2^-126 per row from dgain, and rstd·2^-126 from dh.

bfloat16 on AVX-512: a block of 64 columns runs as two groups of 32, widened to float with
in-lane unpack instructions, so a group's values sit in an interleaved order (see Pair); gain,
bias, the h and d̂ row buffers and the column sums are kept in that order, and one word permute
restores column order when a group is stored. A store converts 32 values with one instruction,
which flushes subnormals to zero; a group in which any result word is ±0 (the only words whose
value such a conversion can get wrong) is converted again exactly.

Column reductions (dgain, dbias and the modulation gradients of a group of rows) are
deterministic: rows are cut into a fixed number of contiguous lanes that does not depend on the
thread count; a lane accumulates its rows in order, writes groups that lie wholly inside it
straight to the output, and leaves at most two partial rows (its first and last group) that a
final pass adds up in lane order. The partial buffer is O(lanes · D), independent of the rows.
"""

SOURCE = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#define NL_PRAGMA(text) _Pragma(#text)
#if defined(_OPENMP) || defined(NL_OMP_SIMD)
#define NL_SIMD NL_PRAGMA(omp simd)
#define NL_SIMD_SUM(v) NL_PRAGMA(omp simd reduction(+ : v))
#define NL_SIMD_SUM2(v, w) NL_PRAGMA(omp simd reduction(+ : v, w))
#else
#define NL_SIMD
#define NL_SIMD_SUM(v)
#define NL_SIMD_SUM2(v, w)
#endif

namespace {

typedef int64_t i64;
enum DType : i64 { kF32 = 0, kF64 = 1, kBF16 = 2, kF16 = 3, kNoType = -1 };

// ------------------------------------------------------------------------------------------
// Scalar conversions, bit exact with PyTorch: round to nearest even, NaN stays NaN.
// ------------------------------------------------------------------------------------------
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t(0x7FC0) : uint16_t(rounded);
}

#if defined(__FLT16_MANT_DIG__)
inline float half_to_float(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return float(v);
}
inline uint16_t float_to_half(float f) {
  _Float16 v = _Float16(f);
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}
#else
inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    float magnitude = float(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return uint16_t(sign | 0x7E00u);   // NaN
  if (u >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to infinity
  if (u < 0x38800000u) {                                  // half subnormal or zero
    float magnitude;
    std::memcpy(&magnitude, &u, 4);
    magnitude += 0.5f;  // the sum's low mantissa bits are the value in units of 2^-24
    uint32_t m;
    std::memcpy(&m, &magnitude, 4);
    return uint16_t(sign | (m - 0x3F000000u));
  }
  uint32_t odd = (u >> 13) & 1u;
  u += 0xC8000FFFu + odd;  // re-bias the exponent by -112 and round to nearest even
  return uint16_t(sign | (u >> 13));
}
#endif

template <class A> constexpr i64 own_dtype();
template <> constexpr i64 own_dtype<float>() { return kF32; }
template <> constexpr i64 own_dtype<double>() { return kF64; }

inline i64 dtype_size(i64 dt) { return (dt == kF32) ? 4 : (dt == kF64) ? 8 : 2; }

// Row conversions between a storage dtype and the accumulation type A.
template <class A>
void load_row(const void* src, i64 dt, i64 n, A* dst) {
  switch (dt) {
    case kF32: { const float* s = static_cast<const float*>(src);
      NL_SIMD for (i64 i = 0; i < n; ++i) dst[i] = A(s[i]); break; }
    case kF64: { const double* s = static_cast<const double*>(src);
      NL_SIMD for (i64 i = 0; i < n; ++i) dst[i] = A(s[i]); break; }
    case kBF16: { const uint16_t* s = static_cast<const uint16_t*>(src);
      NL_SIMD for (i64 i = 0; i < n; ++i) dst[i] = A(bf16_to_float(s[i])); break; }
    default: { const uint16_t* s = static_cast<const uint16_t*>(src);
      for (i64 i = 0; i < n; ++i) dst[i] = A(half_to_float(s[i]));
      break; }
  }
}

template <class A>
void store_row(void* dst, i64 dt, i64 n, const A* src) {
  switch (dt) {
    case kF32: { float* d = static_cast<float*>(dst);
      NL_SIMD for (i64 i = 0; i < n; ++i) d[i] = float(src[i]); break; }
    case kF64: { double* d = static_cast<double*>(dst);
      NL_SIMD for (i64 i = 0; i < n; ++i) d[i] = double(src[i]); break; }
    case kBF16: { uint16_t* d = static_cast<uint16_t*>(dst);
      NL_SIMD for (i64 i = 0; i < n; ++i) d[i] = float_to_bf16(float(src[i])); break; }
    default: { uint16_t* d = static_cast<uint16_t*>(dst);
      for (i64 i = 0; i < n; ++i) d[i] = float_to_half(float(src[i]));
      break; }
  }
}

// v <- A(dtype(v)): the rounding a cast to dtype and back applies.
template <class A>
void round_row(A* v, i64 dt, i64 n) {
  switch (dt) {
    case kF64: if (sizeof(A) == 8) return; break;
    case kF32: NL_SIMD for (i64 i = 0; i < n; ++i) v[i] = A(float(v[i])); return;
    case kBF16:
      NL_SIMD for (i64 i = 0; i < n; ++i) v[i] = A(bf16_to_float(float_to_bf16(float(v[i]))));
      return;
    case kF16:
      for (i64 i = 0; i < n; ++i) v[i] = A(half_to_float(float_to_half(float(v[i]))));
      return;
    default: return;
  }
}

inline bool rounds(i64 dt, i64 acc) {  // does a cast to dt and back change A values?
  return dt != kNoType && dt != acc && !(acc == kF32 && dt == kF64);
}

template <class A>
struct Buffer {  // an aligned scratch row
  A* p = nullptr;
  explicit Buffer(i64 n) {
    p = static_cast<A*>(::operator new(sizeof(A) * size_t(n > 0 ? n : 1), std::align_val_t(64)));
  }
  ~Buffer() { ::operator delete(p, std::align_val_t(64)); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// A row of a storage tensor as an A pointer: the tensor itself when it already holds A values,
// else a converted copy in `scratch`.
template <class A>
const A* view_row(const void* base, i64 dt, i64 row, i64 n, A* scratch) {
  if (dt == own_dtype<A>()) return static_cast<const A*>(base) + row * n;
  load_row<A>(static_cast<const char*>(base) + row * n * dtype_size(dt), dt, n, scratch);
  return scratch;
}

inline void* row_ptr(void* base, i64 dt, i64 row, i64 n) {
  return static_cast<char*>(base) + row * n * dtype_size(dt);
}

template <class A>
A row_sum(const A* v, i64 n) {
  A s = 0;
  NL_SIMD_SUM(s) for (i64 i = 0; i < n; ++i) s += v[i];
  return s;
}

template <class A>
A row_sum_sq(const A* v, i64 n) {
  A s = 0;
  NL_SIMD_SUM(s) for (i64 i = 0; i < n; ++i) s += v[i] * v[i];
  return s;
}

template <class A>
A row_centred_sum_sq(const A* v, A mean, i64 n) {
  A s = 0;
  NL_SIMD_SUM(s) for (i64 i = 0; i < n; ++i) { A c = v[i] - mean; s += c * c; }
  return s;
}

// ------------------------------------------------------------------------------------------
// Memory streams: prefetch of the next row, non-temporal stores for outputs larger than cache
// ------------------------------------------------------------------------------------------
constexpr i64 kChunk = 256;  // elements per chunk of the output stage

// Copy bytes to dst; with `stream`, whole 64-byte lines bypass the cache (non-temporal stores).
inline void put_bytes(void* dst, const void* src, i64 bytes, bool stream) {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  if (stream) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    i64 head = i64((64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
    if (head > bytes) head = bytes;
    std::memcpy(d, s, size_t(head));
    d += head; s += head; bytes -= head;
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif defined(__AVX__)
      for (int q = 0; q < 2; ++q)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32 * q),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32 * q)));
#else
      for (int q = 0; q < 4; ++q)
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * q),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * q)));
#endif
    }
    std::memcpy(d, s, size_t(bytes));
    return;
  }
#else
  (void)stream;
#endif
  std::memcpy(dst, src, size_t(bytes));
}

inline void stream_fence() {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  _mm_sfence();
#endif
}

// Store m A values as elements [c, c + m) of a row of dtype dt (tmp: kChunk * 8 bytes).
template <class A>
void put_chunk(void* row, i64 dt, i64 c, const A* v, i64 m, bool stream, void* tmp) {
  char* dst = static_cast<char*>(row) + c * dtype_size(dt);
  if (!stream) { store_row<A>(dst, dt, m, v); return; }
  const void* src = v;
  if (dt != own_dtype<A>()) { store_row<A>(tmp, dt, m, v); src = tmp; }
  put_bytes(dst, src, m * dtype_size(dt), true);
}

// Prefetch elements [c, c + m) of row `row` of a [rows, n] tensor of dtype dt.
inline void prefetch_chunk(const void* base, i64 dt, i64 row, i64 n, i64 c, i64 m) {
  if (!base) return;
  const i64 size = dtype_size(dt);
  const char* p = static_cast<const char*>(base) + (row * n + c) * size;
  for (i64 o = 0; o < m * size; o += 64) __builtin_prefetch(p + o, 0, 3);
}

template <class A>
inline const A* at(const A* p, i64 c) { return p ? p + c : nullptr; }

// Load a row (into scratch unless it already holds A values) and return Σv and Σv² in one pass.
template <class A>
const A* load_row_sums(const void* base, i64 dt, i64 row, i64 n, A* scratch, A* sum, A* sum_sq) {
  const A* v = view_row<A>(base, dt, row, n, scratch);
  A s = 0, q = 0;
  NL_SIMD_SUM2(s, q) for (i64 i = 0; i < n; ++i) { s += v[i]; q += v[i] * v[i]; }
  *sum = s;
  *sum_sq = q;
  return v;
}

// ------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------
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
  AffineFn<A> first = round_hat
      ? pick_affine<A>(a.centre != 0, false, false, false, false)
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
        NL_SIMD_SUM2(s, q) for (i64 i = 0; i < n; ++i) { s += h[i]; q += h[i] * h[i]; }
        sum = s;
        sum_sq = q;
      }
      A mean = 0, rstd = 0;
      if (a.y) {
        if (a.centre) {
          mean = sum / A(n);
          A c2 = 0;
          NL_SIMD_SUM(c2) for (i64 i = 0; i < n; ++i) { A d = h[i] - mean; c2 += d * d; }
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

// ------------------------------------------------------------------------------------------
// Deterministic column reductions over groups of consecutive rows (see the module docstring)
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
  A* slots = nullptr;   // [lanes, 2, dim]: a lane's partial first and last group

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
          if (sums[0].active()) { NL_SIMD for (i64 i = 0; i < n; ++i) w[i] += g[i] * q[i]; }
          if (sums[1].active()) { NL_SIMD for (i64 i = 0; i < n; ++i) w[n + i] += g[i]; }
          if (sums[2].active()) {
            NL_SIMD for (i64 i = 0; i < n; ++i) w[2 * n + i] += g[i] * xhat[i];
          }
          if (sums[3].active()) { NL_SIMD for (i64 i = 0; i < n; ++i) w[3 * n + i] += g[i]; }
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

// ------------------------------------------------------------------------------------------
// Fast paths: every row tensor of the call in one dtype (float32 or bfloat16), float statistics.
// Same arithmetic as above, with the dtype conversions fused into the loops and the op's shape
// (centring, affine factors, x̂ rounding, residual sum) fixed at compile time.
// ------------------------------------------------------------------------------------------
template <int DT> struct Io;
template <> struct Io<kF32> {
  typedef float T;
  static float ld(float v) { return v; }
  static float st(float v) { return v; }
  static float rnd(float v) { return v; }
};
template <> struct Io<kBF16> {
  typedef uint16_t T;
  static float ld(uint16_t v) { return bf16_to_float(v); }
  static uint16_t st(float v) { return float_to_bf16(v); }
  static float rnd(float v) { return bf16_to_float(float_to_bf16(v)); }
};

enum Affine { kPlain = 0, kGain = 1, kGainBias = 2, kScale = 3, kScaleShift = 4 };
enum SumKind { kNoSum = 0, kAdd = 1, kGated = 2 };

// The op shapes that exist (RMSNorm, LayerNorm, their residual-add forms, AdaRMS, AdaLN and the
// gated AdaRMS step); every other combination takes the general path.
template <int DT, bool CENTRE, int AFF, bool ROUND, int SUM, bool TOKEN>
constexpr bool fast_shape() {
  if (ROUND && (CENTRE || DT != kBF16 || AFF >= kScale)) return false;
  if (TOKEN && AFF < kScale) return false;
  if (SUM == kGated && (CENTRE || AFF < kScale)) return false;
  if (SUM == kAdd && AFF >= kScale) return false;
  if (!CENTRE && AFF == kGainBias) return false;
  return true;
}

template <class F>
bool on_bool(bool v, F&& f) {
  return v ? f(std::true_type{}) : f(std::false_type{});
}
template <int V0, int... Vs, class F>
bool on_int(int v, F&& f) {
  if (v == V0) return f(std::integral_constant<int, V0>{});
  if constexpr (sizeof...(Vs) > 0) return on_int<Vs...>(v, std::forward<F>(f));
  return false;
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
          if constexpr (SUM == kGated) v = io::ld(xr[i]) + io::ld(gr[i]) * io::ld(rr[i]);
          else v = io::ld(xr[i]) + io::ld(rr[i]);
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
          NL_SIMD_SUM(c2) for (i64 i = 0; i < n; ++i) { float d = hp[i] - mean; c2 += d * d; }
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

// ------------------------------------------------------------------------------------------
// AVX-512 versions of the fast paths (16 float lanes; bfloat16 rounding by vcvtneps2bf16 where
// the CPU has it, with the rare NaN and subnormal lanes redone in software so that every result
// stays bit-identical to PyTorch's rounding). The loops mirror fast_forward / fast_backward.
// ------------------------------------------------------------------------------------------
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define NL_AVX512 1

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

template <int DT> struct V16;
template <> struct V16<kF32> {
  typedef float T;
  static constexpr uintptr_t kAlign = 64;
  static constexpr bool kPermuted = false;
  static __m512 load(const T* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(T* p, __m512 v, __mmask16 m, bool stream) {
    if (stream && m == 0xFFFF) _mm512_stream_ps(p, v);
    else _mm512_mask_storeu_ps(p, m, v);
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
template <> struct V16<kBF16> {
  typedef uint16_t T;
  static constexpr uintptr_t kAlign = 32;
  static constexpr bool kPermuted = true;
  static __m512 load(const T* p, __mmask16 m) {
    return bf16x16_to_float(_mm256_maskz_loadu_epi16(m, p));
  }
  static void store(T* p, __m512 v, __mmask16 m, bool stream) {
    const __m256i b = float_to_bf16x16(v);
    if (stream && m == 0xFFFF) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), b);
    else _mm256_mask_storeu_epi16(p, m, b);
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
    const __m512i order = _mm512_set_epi16(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10,
                                           9, 8, 23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3,
                                           2, 1, 0);
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
    return _mm512_inserti64x4(_mm512_castsi256_si512(float_to_bf16x16(v.a)),
                              float_to_bf16x16(v.b), 1);
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
                                                 _mm512_set1_epi16(0x7F7F)) != 0, 0))
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
    const __m512i to_pos = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2,
                                            1, 0);   // a: position j holds column σ(j)
    const __m512i to_pos_b = _mm512_set_epi32(31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12, 7,
                                              6, 5, 4);  // b: position 16 + j
    const __m512i to_col_lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3,
                                               2, 1, 0);  // columns 0–15 from positions
    const __m512i to_col_hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24,
                                               11, 10, 9, 8);  // columns 16–31
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
    (void)row; (void)groups; (void)to_groups;
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
          s0 = _mm512_add_ps(s0, v0.a); s1 = _mm512_add_ps(s1, v0.b);
          s2 = _mm512_add_ps(s2, v1.a); s3 = _mm512_add_ps(s3, v1.b);
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
        (void)hs;  // unused without a residual sum
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
          if constexpr (AFF == kGainBias)
            u = _mm512_add_ps(u, _mm512_maskz_loadu_ps(m, bias + c));
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
  const i64 n64;       // columns in whole 64-column blocks
  const float* gain;   // in group order on the blocks
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
        dot[k] = _mm512_add_ps(dot[k], _mm512_add_ps(_mm512_mul_ps(d.a, xh.a),
                                                     _mm512_mul_ps(d.b, xh.b)));
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
  // underflows float32 for rows of magnitude beyond ~1e19.
  // `ahead` is the row to prefetch meanwhile: the same row of the next group of rows.
  void row_grad(i64 r, const float* db, float c0, float c1, i64 ahead) const {
    const T* const dh = a.dh_in ? static_cast<const T*>(a.dh_in) + r * n : nullptr;
    T* const dxr = static_cast<T*>(a.dx) + r * n;
    T* const dor = GATED ? static_cast<T*>(a.dres) + r * n : nullptr;
    const bool dx_stream = stream_ok(dxr, stream, io::kAlign);
    const bool do_stream = GATED && stream_ok(dor, stream, io::kAlign);
    on_bool(dh != nullptr, [&](auto with_dh) {
      on_bool(dx_stream && (!GATED || do_stream), [&](auto st) {
        row_grad_loop<decltype(with_dh)::value, decltype(st)::value>(r, db, c0, c1, ahead, dh,
                                                                     dxr, dor);
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
    const __m512 va = _mm512_set1_ps(rstd), va0 = _mm512_set1_ps(-rstd * c0);
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
#endif  // AVX-512

bool try_fast_forward(const ForwardArgs& a) {
  const i64 dt = a.x_dtype;
  if ((dt != kF32 && dt != kBF16) || !a.y || a.y_dtype != dt) return false;
  if (a.res && (a.res_dtype != dt || a.h_dtype != dt)) return false;
  if (a.gate && a.gate_dtype != dt) return false;
  if ((a.scale && a.scale_dtype != dt) || (a.shift && a.shift_dtype != dt)) return false;
  int aff;
  if (!a.gain && !a.bias && !a.scale && !a.shift) aff = kPlain;
  else if (a.gain && !a.bias && !a.scale && !a.shift) aff = kGain;
  else if (a.gain && a.bias && !a.scale && !a.shift) aff = kGainBias;
  else if (!a.gain && !a.bias && a.scale && !a.shift) aff = kScale;
  else if (!a.gain && !a.bias && a.scale && a.shift) aff = kScaleShift;
  else return false;
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
  if (gated && (a.gate_dtype != dt || !a.other || a.other_dtype != dt || !a.dres ||
                a.dres_dtype != dt))
    return false;
  if (!gated && a.dres) return false;
  int aff;
  if (a.gain && !a.scale) aff = a.dbias ? kGainBias : kGain;
  else if (!a.gain && a.scale) aff = a.dshift ? kScaleShift : kScale;
  else if (!a.gain && !a.scale && !a.dbias && !a.dshift) aff = kPlain;
  else return false;
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

#define NL_EXPORT __attribute__((visibility("default")))
extern "C" {
NL_EXPORT int normlab_abi_version() { return 1; }
NL_EXPORT void normlab_forward(const ForwardArgs* a, int64_t use_double) {
  if (use_double) forward<double>(*a);
  else if (!try_fast_forward(*a)) forward<float>(*a);
}
NL_EXPORT void normlab_backward(const BackwardArgs* a, int64_t use_double) {
  if (use_double) backward<double>(*a);
  else if (!try_fast_backward(*a)) backward<float>(*a);
}
}
"""
