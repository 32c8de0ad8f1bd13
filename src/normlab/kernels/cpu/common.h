// Shared by the forward and backward kernels: scalar and row conversions between the storage
// dtypes and the accumulation type, scratch rows, row sums, memory streams, and the compile-time
// dispatch helpers of the fast paths.
#pragma once

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

template <class A>
constexpr i64 own_dtype();
template <>
constexpr i64 own_dtype<float>() {
  return kF32;
}
template <>
constexpr i64 own_dtype<double>() {
  return kF64;
}

inline i64 dtype_size(i64 dt) { return (dt == kF32) ? 4 : (dt == kF64) ? 8 : 2; }

// Row conversions between a storage dtype and the accumulation type A.
template <class A>
void load_row(const void* src, i64 dt, i64 n, A* dst) {
  switch (dt) {
    case kF32: {
      const float* s = static_cast<const float*>(src);
      NL_SIMD for (i64 i = 0; i < n; ++i) dst[i] = A(s[i]);
      break;
    }
    case kF64: {
      const double* s = static_cast<const double*>(src);
      NL_SIMD for (i64 i = 0; i < n; ++i) dst[i] = A(s[i]);
      break;
    }
    case kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      NL_SIMD for (i64 i = 0; i < n; ++i) dst[i] = A(bf16_to_float(s[i]));
      break;
    }
    default: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (i64 i = 0; i < n; ++i) dst[i] = A(half_to_float(s[i]));
      break;
    }
  }
}

template <class A>
void store_row(void* dst, i64 dt, i64 n, const A* src) {
  switch (dt) {
    case kF32: {
      float* d = static_cast<float*>(dst);
      NL_SIMD for (i64 i = 0; i < n; ++i) d[i] = float(src[i]);
      break;
    }
    case kF64: {
      double* d = static_cast<double*>(dst);
      NL_SIMD for (i64 i = 0; i < n; ++i) d[i] = double(src[i]);
      break;
    }
    case kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      NL_SIMD for (i64 i = 0; i < n; ++i) d[i] = float_to_bf16(float(src[i]));
      break;
    }
    default: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (i64 i = 0; i < n; ++i) d[i] = float_to_half(float(src[i]));
      break;
    }
  }
}

// v <- A(dtype(v)): the rounding a cast to dtype and back applies.
template <class A>
void round_row(A* v, i64 dt, i64 n) {
  switch (dt) {
    case kF64:
      if (sizeof(A) == 8) return;
      break;
    case kF32:
      NL_SIMD for (i64 i = 0; i < n; ++i) v[i] = A(float(v[i]));
      return;
    case kBF16:
      NL_SIMD for (i64 i = 0; i < n; ++i) v[i] = A(bf16_to_float(float_to_bf16(float(v[i]))));
      return;
    case kF16:
      for (i64 i = 0; i < n; ++i) v[i] = A(half_to_float(float_to_half(float(v[i]))));
      return;
    default:
      return;
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
  NL_SIMD_SUM(s) for (i64 i = 0; i < n; ++i) {
    A c = v[i] - mean;
    s += c * c;
  }
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
    d += head;
    s += head;
    bytes -= head;
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
  if (!stream) {
    store_row<A>(dst, dt, m, v);
    return;
  }
  const void* src = v;
  if (dt != own_dtype<A>()) {
    store_row<A>(tmp, dt, m, v);
    src = tmp;
  }
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
inline const A* at(const A* p, i64 c) {
  return p ? p + c : nullptr;
}

// Load a row (into scratch unless it already holds A values) and return Σv and Σv² in one pass.
template <class A>
const A* load_row_sums(const void* base, i64 dt, i64 row, i64 n, A* scratch, A* sum, A* sum_sq) {
  const A* v = view_row<A>(base, dt, row, n, scratch);
  A s = 0, q = 0;
  NL_SIMD_SUM2(s, q) for (i64 i = 0; i < n; ++i) {
    s += v[i];
    q += v[i] * v[i];
  }
  *sum = s;
  *sum_sq = q;
  return v;
}

// ------------------------------------------------------------------------------------------
// Fast paths: every row tensor of the call in one dtype (float32 or bfloat16), float statistics.
// Same arithmetic as above, with the dtype conversions fused into the loops and the op's shape
// (centring, affine factors, x̂ rounding, residual sum) fixed at compile time.
// ------------------------------------------------------------------------------------------
template <int DT>
struct Io;
template <>
struct Io<kF32> {
  typedef float T;
  static float ld(float v) { return v; }
  static float st(float v) { return v; }
  static float rnd(float v) { return v; }
};
template <>
struct Io<kBF16> {
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

}  // namespace
