// Why a two-pass row kernel slows down as rows grow, without any normlab code in the way.
//
// A norm cannot write a row before it has read all of it (the statistic comes first), so the
// fused CPU forward reads a row (pass 1: Σx²), then reads it again from L1 and writes y with
// non-temporal stores while the next row is prefetched (pass 2). This program times that
// structure in its plainest form next to copies of the same size, for several row lengths D,
// all with float32 and N·D = 32 Mi elements (128 MiB per tensor):
//
//   copy_nt      y = x with non-temporal stores (what the kernels' output stores do)
//   copy_plain   y = x with ordinary stores (reads each y line before writing it)
//   two_pass     pass 1 Σx², pass 2 y = x·rsqrt(m + ε)·w, next row prefetched during pass 2
//   two_pass_c   the same access pattern with no arithmetic: pass 2 stores a constant
//   staged       a copy through a D-float buffer: a row of x into the buffer, then the buffer
//                out with non-temporal stores (next row prefetched), i.e. the kernel's memory
//                pattern with a copy's work
//
// Each repetition runs every variant once, in a rotating order; the figures are medians.
//
//   g++ -O3 -march=native -fopenmp benchmarks/cpu/two_pass_rows.cpp -o /tmp/two_pass_rows
//   OMP_NUM_THREADS=2 /tmp/two_pass_rows 768 1024 2048 4096 8192
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

typedef long long i64;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static float* alloc(i64 n) { return static_cast<float*>(std::aligned_alloc(4096, n * 4)); }

static void prefetch_64(const float* p) {  // 64 floats = 4 lines, into L2
  for (int o = 0; o < 64; o += 16) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
}

static void copy_nt(const float* x, float* y, i64 total) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < total; i += 64)
    for (int k = 0; k < 64; k += 16) _mm512_stream_ps(y + i + k, _mm512_loadu_ps(x + i + k));
  _mm_sfence();
}

static void copy_plain(const float* x, float* y, i64 total) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < total; i += 64)
    for (int k = 0; k < 64; k += 16) _mm512_storeu_ps(y + i + k, _mm512_loadu_ps(x + i + k));
}

template <bool MATH>
static void two_pass(const float* x, const float* w, float* y, i64 rows, i64 n) {
#pragma omp parallel for schedule(static)
  for (i64 r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    __m512 q[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (i64 i = 0; i < n; i += 64)
      for (int k = 0; k < 4; ++k) {
        const __m512 v = _mm512_loadu_ps(xr + i + 16 * k);
        q[k] = _mm512_add_ps(q[k], _mm512_mul_ps(v, v));
      }
    const float m = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[2], q[3])));
    const __m512 rstd = _mm512_set1_ps(1.0f / std::sqrt(m / float(n) + 1e-6f));
    const bool next = r + 1 < rows;
    for (i64 i = 0; i < n; i += 64) {
      if (next) prefetch_64(xr + n + i);
      for (int k = 0; k < 64; k += 16) {
        __m512 u = rstd;
        if (MATH)
          u = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + i + k), u),
                            _mm512_loadu_ps(w + i + k));
        _mm512_stream_ps(yr + i + k, u);
      }
    }
  }
  _mm_sfence();
}

static void staged(const float* x, float* y, i64 rows, i64 n) {
#pragma omp parallel
  {
    float* buf = alloc(n);
#pragma omp for schedule(static)
    for (i64 r = 0; r < rows; ++r) {
      const float* xr = x + r * n;
      for (i64 i = 0; i < n; i += 16) _mm512_store_ps(buf + i, _mm512_loadu_ps(xr + i));
      for (i64 i = 0; i < n; i += 64) {
        if (r + 1 < rows) prefetch_64(xr + n + i);
        for (int k = 0; k < 64; k += 16)
          _mm512_stream_ps(y + r * n + i + k, _mm512_load_ps(buf + i + k));
      }
    }
    std::free(buf);
  }
  _mm_sfence();
}

int main(int argc, char** argv) {
  const i64 total = i64(32) << 20;
  const int reps = 15;
  float *x = alloc(total), *y = alloc(total), *w = alloc(65536);
  for (i64 i = 0; i < total; ++i) x[i] = float((i * 7919) % 1009) * 1e-3f - 0.5f, y[i] = 0.0f;
  for (i64 i = 0; i < 65536; ++i) w[i] = 1.0f + float(i % 97) * 1e-3f;
  std::vector<i64> dims;
  for (int a = 1; a < argc; ++a) dims.push_back(std::atoll(argv[a]));
  if (dims.empty()) dims = {768, 1024, 2048, 4096, 8192};
  const char* names[] = {"copy_nt", "copy_plain", "two_pass", "two_pass_c", "staged"};
  const int variants = 5;
  const double bytes = double(total) * 8.0;  // read x + write y
  std::printf("threads %d, %lld float32 elements; GB/s (read + write) and fraction of copy_nt\n",
              omp_get_max_threads(), total);
  for (i64 n : dims) {
    if (n % 64 || n > 65536) {
      std::printf("D=%lld skipped: D must be a multiple of 64, at most 65536\n", n);
      continue;
    }
    const i64 rows = total / n;
    std::vector<std::vector<double>> t(variants);
    for (int rep = 0; rep < reps; ++rep)
      for (int j = 0; j < variants; ++j) {
        const int v = (j + rep) % variants;
        const double t0 = now();
        switch (v) {
          case 0: copy_nt(x, y, total); break;
          case 1: copy_plain(x, y, total); break;
          case 2: two_pass<true>(x, w, y, rows, n); break;
          case 3: two_pass<false>(x, w, y, rows, n); break;
          case 4: staged(x, y, rows, n); break;
        }
        t[v].push_back(now() - t0);
      }
    std::vector<double> gbps(variants);
    for (int v = 0; v < variants; ++v) {
      std::sort(t[v].begin(), t[v].end());
      gbps[v] = bytes / t[v][reps / 2] / 1e9;
    }
    std::printf("D=%-6lld", n);
    for (int v = 0; v < variants; ++v)
      std::printf("  %s %5.1f (%.2f)", names[v], gbps[v], gbps[v] / gbps[0]);
    std::printf("\n");
  }
  std::free(x);
  std::free(y);
  std::free(w);
  return 0;
}
