// The fused CPU norm kernels: the C entry points of libnormlab_cpu, built on first use by
// normlab/kernels/cpu/_build.py, which compiles this file (it includes the others: common.h,
// avx512.h, forward.h, backward.h) from where the package is installed.
//
// It includes no PyTorch header: the library exports two `extern "C"` entry points that take a
// plain struct of pointers and sizes (mirrored by the ctypes structs of normlab/kernels/cpu/
// __init__.py), so a build takes seconds, not minutes.
//
// One forward and one backward kernel serve every op. Each works row by row (one token's vector of
// D values): a row is loaded once from memory, converted to the accumulation type A (float, or
// double for float64 input) in a buffer that stays in L1/L2, and every further pass over it runs in
// cache. OpenMP spreads rows over threads.
//
// Forward, for a row h (h = x, or x + r, or x + g·o, rounded to h's dtype when a sum is formed):
//
//     LayerNorm: μ = Σh/D, σ² = Σ(h − μ)²/D, rstd = 1/sqrt(σ² + ε), x̂ = (h − μ)·rstd
//                (the AVX-512 path reads Σh and Σh² in one pass and uses σ² = Σh²/D − μ² when
//                μ² ≤ σ², which costs at most a bit more than the centred sum; other rows get the
//                centred sum, from cache)
//     RMSNorm:   m = Σh²/D,                 rstd = 1/sqrt(m + ε),  x̂ = h·rstd
//     q = round(x̂) in the "llama" casting, else x̂
//     y = ((q·gain + bias)·(1 + s) + t), each factor optional, stored in y's dtype
//
// Backward, with g = dy (float) and the saved μ, rstd:
//
//     d̂ = g·(1 + s)·gain, rounded like x̂ in the "llama" casting
//     RMSNorm:   dh = rstd·(d̂ − x̂·Σ(d̂·x̂)/D)
//     LayerNorm: dh = rstd·(d̂ − Σd̂/D − x̂·Σ(d̂·x̂)/D)
//     (the AVX-512 path evaluates dh = (d̂ − (h − μ)·(rstd·c1))·rstd − rstd·c0 with c0 = Σd̂/D
//     and c1 = Σ(d̂·x̂)/D, as two fused multiply-adds; no rstd² that could underflow; the factors
//     are 0 for LayerNorm over D = 1, whose dh is then exactly 0)
//     dgain = Σrows g·q, dbias = Σrows g, dscale = Σgroup g·x̂, dshift = Σgroup g,
//     dgate = Σgroup dh·o, do = dh·gate; dh adds the incoming gradient of the h output.
//
// Rounding: every stored result (y, h, dx, …) is rounded to its dtype exactly as PyTorch rounds
// it (round to nearest even, subnormals kept; a NaN stays NaN, its bit pattern not fixed, as
// between PyTorch's own vectorised and scalar conversions). Inside the AVX-512 backward, the
// "llama" rounding of x̂ and d̂ may flush a subnormal (|v| < 2^-126) to zero, which drops the terms
// that have it as a factor: at most |dy|·2^-126 per row from dgain, and rstd·2^-126 from dh.
//
// bfloat16 on AVX-512: a block of 64 columns runs as two groups of 32, widened to float with
// in-lane unpack instructions, so a group's values sit in an interleaved order (see Pair); gain,
// bias, the h and d̂ row buffers and the column sums are kept in that order, and one word permute
// restores column order when a group is stored. A store converts 32 values with one instruction,
// which flushes subnormals to zero; a group in which any result word is ±0 (the only words whose
// value such a conversion can get wrong) is converted again exactly.
//
// Column reductions (dgain, dbias and the modulation gradients of a group of rows) are
// deterministic: rows are cut into a fixed number of contiguous lanes that does not depend on the
// thread count; a lane accumulates its rows in order, writes groups that lie wholly inside it
// straight to the output, and leaves at most two partial rows (its first and last group) that a
// final pass adds up in lane order. The partial buffer is O(lanes · D), independent of the rows.

//
// Code paths. A float32 or bfloat16 call whose tensors share one dtype and whose op has one of the
// shapes of fast_shape (common.h) runs a fast path: avx_forward / avx_backward where the compiler
// targets AVX-512 (NL_AVX512, avx512.h), else the portable fast_forward / fast_backward (what an
// AVX2-only x86 CPU or an ARM CPU runs). Every other call (float16, float64, mixed dtypes, other
// shapes) runs the general forward<A> / backward<A>. normlab/kernels/cpu/_build.py builds three
// variants of this file, so that each path can be built and tested on one machine: "native"
// (-march=native, the default), "portable" (-march=native -mno-avx512f: the portable fast paths)
// and "general" (NL_NO_FAST_PATHS: the general kernels for every call).
// normlab_fast_path() says which of them a library holds.

#include "backward.h"
#include "common.h"
#include "forward.h"

namespace {
#ifdef NL_NO_FAST_PATHS
constexpr bool kFastPaths = false;
#else
constexpr bool kFastPaths = true;
#endif
}  // namespace

#define NL_EXPORT __attribute__((visibility("default")))
extern "C" {
NL_EXPORT int normlab_abi_version() { return 2; }
// The path of float32 and bfloat16 calls: 0 the general kernels, 1 the portable fast paths,
// 2 their AVX-512 versions.
NL_EXPORT int normlab_fast_path() {
#ifdef NL_AVX512
  return kFastPaths ? 2 : 0;
#else
  return kFastPaths ? 1 : 0;
#endif
}
NL_EXPORT void normlab_forward(const ForwardArgs* a, int64_t use_double) {
  if (use_double)
    forward<double>(*a);
  else if (!(kFastPaths && try_fast_forward(*a)))
    forward<float>(*a);
}
NL_EXPORT void normlab_backward(const BackwardArgs* a, int64_t use_double) {
  if (use_double)
    backward<double>(*a);
  else if (!(kFastPaths && try_fast_backward(*a)))
    backward<float>(*a);
}
}
