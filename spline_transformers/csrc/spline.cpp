#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>
#include <algorithm>
#include <type_traits>
#if defined(__AVX512F__) || defined(__SSE2__)
#include <immintrin.h>
#endif

// A linear spline on K evenly spaced knots, evaluated on x viewed as (outer, S, inner): spline s on slice s.
// Forward: one pass. Backward: one pass; value gradients go to per-chunk histograms (fixed-size chunks of the
// flat input, so the sums do not depend on the thread count), reduced in chunk order at the end.

template <typename T>
static inline void locate(T x, T x_min, T inv_h, int K, T& t, T& tc, int& i) {
  t = (x - x_min) * inv_h;
  tc = t > T(0) ? t : T(0);              // NaN -> 0 (a NaN compares false)
  tc = tc < T(K - 1) ? tc : T(K - 1);
  i = (int)tc;
  i = i < K - 2 ? i : K - 2;
}

// Segment kernels over a run of elements that share one spline. Written so that GCC vectorises them
// (restrict pointers, selects instead of branches; __builtin_isnan is a select, `x != x` is not).
template <typename T>
static void fwd_run(const T* __restrict x, const T* __restrict vs, const T* __restrict ds, T* __restrict y,
                    int64_t n, int K, T x_min, T inv_h, bool linear) {
  if (!linear) {
    for (int64_t q = 0; q < n; ++q) {
      T t, tc; int i; const T xv = x[q];
      locate(xv, x_min, inv_h, K, t, tc, i);
      const T r = vs[i] + (tc - (T)i) * ds[i];
      y[q] = __builtin_isnan(xv) ? xv : r;
    }
  } else {
    for (int64_t q = 0; q < n; ++q) {
      T t, tc; int i; const T xv = x[q];
      locate(xv, x_min, inv_h, K, t, tc, i);
      const T dd = ds[i], lo = vs[i];
      const T r = dd == T(0) ? lo : lo + (t - (T)i) * dd;   // a flat end segment stays flat at +-inf
      y[q] = __builtin_isnan(xv) ? xv : r;
    }
  }
}

// The generic backward for a block of elements that share one spline: one locate pass (vectorised by the
// compiler) that writes the input gradient and each element's bin and fraction, then the scalar histogram adds.
template <typename T>
static void bwd_locate_block(const T* __restrict g, const T* __restrict x, const T* __restrict ss, T* __restrict gx,
                             int* __restrict idx, T* __restrict fr, int64_t n, int K, T x_min, T inv_h, bool linear,
                             bool need_x, bool need_v) {
  const T top = T(K - 1);
  for (int64_t q = 0; q < n; ++q) {
    T t, tc; int i; const T xv = x[q];
    locate(xv, x_min, inv_h, K, t, tc, i);
    if (need_x) {
      const T gq = g[q] * ss[i];
      gx[q] = (linear | ((t >= T(0)) & (t < top)) | __builtin_isnan(xv)) ? gq : T(0);   // NaN: segment 0, as in the other backends
    }
    if (need_v) {
      const T f = (linear ? t : tc) - (T)i;
      idx[q] = i;
      fr[q] = __builtin_isnan(xv) ? xv : f;
    }
  }
}

constexpr int NSUB = 8;   // interleaved sub-histograms: element q of a run adds into sub-histogram q % 8

// Add each element's (g, g f) pair, in float64, into bin idx of sub-histogram q % NSUB (sub u at hs + u * sub_stride).
// A bin's add->add chain through memory is then NSUB elements long, so runs of equal bins do not stall on
// store-to-load forwarding. The block starts at a multiple of NSUB within its run.
template <typename T>
static void hist_add_block(const T* __restrict g, const int* __restrict idx, const T* __restrict fr, double* hs,
                           int64_t n, int64_t sub_stride) {
  for (int64_t q = 0; q < n; ++q) {
    double* p = hs + (q % NSUB) * sub_stride + 2 * idx[q];
    const double gq = (double)g[q], fq = (double)fr[q];
#if defined(__SSE2__)
    _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_mul_pd(_mm_set1_pd(gq), _mm_set_pd(fq, 1.0))));
#else
    p[0] += gq; p[1] += gq * fq;
#endif
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// float32 on AVX2 (on AVX-512 machines only for K > 128), any K: for K <= 32 the knot tables live in registers, 8
// floats each, and a lookup is one vpermps per register plus a blend tree on the index bits. A memory gather
// (vgatherdps, what the compiler makes of the generic loops) is several times slower than that on some CPUs
// (AMD Zen 3); above 32 knots it is what is left.
template <int NT>   // NT registers of 8 floats: K <= 8 * NT, NT in 1, 2, 4, 8
struct Tab8 {
  __m256 r[NT];
  explicit Tab8(const float* t) { for (int j = 0; j < NT; ++j) r[j] = _mm256_loadu_ps(t + 8 * j); }
  // entries [8 lo, 8 (lo + n)): one vpermps per register (low 3 bits of i), then blends on bits 3, 4, 5 of i,
  // evaluated depth first so that few registers are live (the tables of a K = 64 forward fill all 16)
  template <int lo, int n>
  inline __m256 sub(__m256i i) const {
    if constexpr (n == 1) return _mm256_permutevar8x32_ps(r[lo], i);
    else {
      constexpr int bit = n == 2 ? 28 : n == 4 ? 27 : 26;   // bit 3, 4 or 5 of i, shifted to the sign bit
      const __m256 a = sub<lo, n / 2>(i), b = sub<lo + n / 2, n / 2>(i);
      return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(i, bit)));
    }
  }
  inline __m256 operator()(__m256i i) const { return sub<0, NT>(i); }
};

struct Gather8 {   // the same lookup from memory (vgatherdps), for K > 32: written out, it measured faster on
                  // AMD Zen 3 than the blend tree of eight registers or the compiler's vectorised plain loop
  const float* t;
  explicit Gather8(const float* t_) : t(t_) {}
  inline __m256 operator()(__m256i i) const { return _mm256_i32gather_ps(t, i, 4); }
};

// Both forward lookups at once for K > 32: the pair (v[i], v[i + 1]) is 8 contiguous bytes of the value table, so two
// 4-wide 64-bit gathers fetch the 8 lanes' pairs (half the loads of two 8-wide float gathers), and the rise
// d = v[i + 1] - v[i] is the same float subtraction that builds the rise table, so results are bitwise unchanged.
static inline void pairs8(const float* vs, __m256i i, __m256& lo, __m256& d) {
  const __m256i ip = _mm256_permute4x64_epi64(i, 0xD8);   // lanes [0 1 4 5 | 2 3 6 7]
  const __m256 a = _mm256_castpd_ps(_mm256_i32gather_pd((const double*)vs, _mm256_castsi256_si128(ip), 4));
  const __m256 b = _mm256_castpd_ps(_mm256_i32gather_pd((const double*)vs, _mm256_extracti128_si256(ip, 1), 4));
  lo = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));   // [v0 v1 v2 v3 | v4 v5 v6 v7]
  d = _mm256_sub_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)), lo);
}

struct Loc8 { __m256 t, tc, fi; __m256i i; };

static inline Loc8 locate8(__m256 x, __m256 x_min, __m256 inv_h, __m256 top, __m256i imax) {
  Loc8 L;
  L.t = _mm256_mul_ps(_mm256_sub_ps(x, x_min), inv_h);
  L.tc = _mm256_min_ps(_mm256_max_ps(L.t, _mm256_setzero_ps()), top);   // max_ps(NaN, 0) = 0
  L.i = _mm256_min_epi32(_mm256_cvttps_epi32(L.tc), imax);
  L.fi = _mm256_cvtepi32_ps(L.i);
  return L;
}

static inline __m256i tail_mask8(int64_t n, int64_t q) {   // lanes q + l < n
  const int64_t r = n - q;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(r < 8 ? r : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <typename Tab>   // Tab8<NT> or Gather8
static void fwd_run_avx2(const float* x, const float* vs, const float* ds, float* y, int64_t n, int K,
                         float x_min, float inv_h, bool linear) {
  const Tab V(vs), D(ds);
  const __m256 vmin = _mm256_set1_ps(x_min), vinv = _mm256_set1_ps(inv_h), top = _mm256_set1_ps((float)(K - 1));
  const __m256i imax = _mm256_set1_epi32(K - 2);
  for (int64_t q = 0; q < n; q += 8) {
    const bool full = n - q >= 8;
    const __m256i m = full ? _mm256_set1_epi32(-1) : tail_mask8(n, q);
    const __m256 xv = full ? _mm256_loadu_ps(x + q) : _mm256_maskload_ps(x + q, m);
    const Loc8 L = locate8(xv, vmin, vinv, top, imax);
    __m256 lo, d;
    if constexpr (std::is_same<Tab, Gather8>::value) pairs8(vs, L.i, lo, d);
    else { lo = V(L.i); d = D(L.i); }
    __m256 r;
    if (!linear) r = _mm256_fmadd_ps(_mm256_sub_ps(L.tc, L.fi), d, lo);
    else {
      r = _mm256_fmadd_ps(_mm256_sub_ps(L.t, L.fi), d, lo);
      r = _mm256_blendv_ps(r, lo, _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_EQ_OQ));   // flat end stays flat
    }
    r = _mm256_blendv_ps(r, xv, _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));                    // NaN in, NaN out
    if (full) _mm256_storeu_ps(y + q, r); else _mm256_maskstore_ps(y + q, m, r);
  }
}

// The whole backward for a run of float32 elements in one pass, 8 at a time: locate once, write the input
// gradient (slope table in registers; gathered for K > 32), form the 8 (g, g f) float64 pairs and bin offsets
// in vector registers, and add lane l's pair into sub-histogram l (lane l holds element q with q % 8 = l: the same sums, in the same
// order, as the generic path). What is left per element is one 16-byte load-add-store.
template <typename Tab, bool NEED_X, bool NEED_V>
static void bwd_run_avx2(const float* g, const float* x, const float* sp, float* gx, double* hs, int64_t n, int K,
                         float x_min, float inv_h, bool linear, int64_t sub_stride) {
  const Tab Sl(sp);
  const __m256 vmin = _mm256_set1_ps(x_min), vinv = _mm256_set1_ps(inv_h), top = _mm256_set1_ps((float)(K - 1));
  const __m256 zero = _mm256_setzero_ps();
  const __m256i imax = _mm256_set1_epi32(K - 2);
  const __m256i lanes = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)sub_stride));
  alignas(32) int32_t off[8]; alignas(32) double pr[16];
  for (int64_t q = 0; q < n; q += 8) {
    const bool full = n - q >= 8;
    const __m256i m = full ? _mm256_set1_epi32(-1) : tail_mask8(n, q);
    const __m256 xv = full ? _mm256_loadu_ps(x + q) : _mm256_maskload_ps(x + q, m);
    const __m256 gv = full ? _mm256_loadu_ps(g + q) : _mm256_maskload_ps(g + q, m);
    const Loc8 L = locate8(xv, vmin, vinv, top, imax);
    const __m256 nan = _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q);
    if (NEED_X) {
      __m256 r = _mm256_mul_ps(gv, Sl(L.i));
      if (!linear) r = _mm256_and_ps(r, _mm256_or_ps(_mm256_and_ps(_mm256_cmp_ps(L.t, zero, _CMP_GE_OQ),
                                                                   _mm256_cmp_ps(L.t, top, _CMP_LT_OQ)), nan));
      if (full) _mm256_storeu_ps(gx + q, r); else _mm256_maskstore_ps(gx + q, m, r);
    }
    if (!NEED_V) continue;
    const __m256 f = _mm256_blendv_ps(_mm256_sub_ps(linear ? L.t : L.tc, L.fi), xv, nan);   // NaN in: NaN share
    _mm256_store_si256((__m256i*)off, _mm256_add_epi32(lanes, _mm256_slli_epi32(L.i, 1)));
    const __m256d g0 = _mm256_cvtps_pd(_mm256_castps256_ps128(gv)), g1 = _mm256_cvtps_pd(_mm256_extractf128_ps(gv, 1));
    const __m256d r0 = _mm256_mul_pd(g0, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
    const __m256d r1 = _mm256_mul_pd(g1, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
    const __m256d a0 = _mm256_unpacklo_pd(g0, r0), b0 = _mm256_unpackhi_pd(g0, r0);   // pairs of lanes 0, 2 | 1, 3
    const __m256d a1 = _mm256_unpacklo_pd(g1, r1), b1 = _mm256_unpackhi_pd(g1, r1);   // lanes 4, 6 | 5, 7
    _mm256_store_pd(pr, _mm256_permute2f128_pd(a0, b0, 0x20));
    _mm256_store_pd(pr + 4, _mm256_permute2f128_pd(a0, b0, 0x31));
    _mm256_store_pd(pr + 8, _mm256_permute2f128_pd(a1, b1, 0x20));
    _mm256_store_pd(pr + 12, _mm256_permute2f128_pd(a1, b1, 0x31));
    if (full) {
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) { double* p = hs + off[l]; _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_load_pd(pr + 2 * l))); }
    } else {
      for (int l = 0; l < (int)(n - q); ++l) { double* p = hs + off[l]; _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_load_pd(pr + 2 * l))); }
    }
  }
}

template <typename Tab>
static void bwd_run_avx2_any(const float* g, const float* x, const float* sp, float* gx, double* hs, int64_t n, int K,
                             float x_min, float inv_h, bool linear, int64_t sub_stride, bool need_x, bool need_v) {
  if (need_x && need_v) bwd_run_avx2<Tab, true, true>(g, x, sp, gx, hs, n, K, x_min, inv_h, linear, sub_stride);
  else if (need_x) bwd_run_avx2<Tab, true, false>(g, x, sp, gx, hs, n, K, x_min, inv_h, linear, sub_stride);
  else if (need_v) bwd_run_avx2<Tab, false, true>(g, x, sp, gx, hs, n, K, x_min, inv_h, linear, sub_stride);
}
#endif

#if defined(__AVX512F__)
// float32 with K <= 128 on AVX-512: the knot tables live in registers and a lookup is one to four
// vpermt2ps (a 32-entry register "gather" in one instruction), far cheaper than a memory gather.
template <int NP>   // NP pairs of 16-float registers: K <= 32 * NP
struct RegTable {
  __m512 r[2 * NP];
  explicit RegTable(const float* t) { for (int j = 0; j < 2 * NP; ++j) r[j] = _mm512_loadu_ps(t + 16 * j); }
  inline __m512 operator()(__m512i i) const {
    const __m512 p0 = _mm512_permutex2var_ps(r[0], i, r[1]);
    if constexpr (NP == 1) return p0;
    else {
      const __mmask16 b5 = _mm512_test_epi32_mask(i, _mm512_set1_epi32(32));
      const __m512 q0 = _mm512_mask_blend_ps(b5, p0, _mm512_permutex2var_ps(r[2], i, r[3]));
      if constexpr (NP == 2) return q0;
      else {
        const __m512 q1 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(r[4], i, r[5]), _mm512_permutex2var_ps(r[6], i, r[7]));
        return _mm512_mask_blend_ps(_mm512_test_epi32_mask(i, _mm512_set1_epi32(64)), q0, q1);
      }
    }
  }
};

struct Loc16 { __m512 t, tc, fi; __m512i i; };

static inline Loc16 locate16(__m512 x, __m512 x_min, __m512 inv_h, __m512 top, __m512i imax) {
  Loc16 L;
  L.t = _mm512_mul_ps(_mm512_sub_ps(x, x_min), inv_h);
  L.tc = _mm512_min_ps(_mm512_max_ps(L.t, _mm512_setzero_ps()), top);   // max_ps(NaN, 0) = 0
  L.i = _mm512_min_epi32(_mm512_cvttps_epi32(L.tc), imax);
  L.fi = _mm512_cvtepi32_ps(L.i);
  return L;
}

static inline __mmask16 tail_mask(int64_t n, int64_t q) {
  const int64_t r = n - q;
  return r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r) - 1u);
}

template <int NP>
static void fwd_run_avx(const float* x, const float* vpad, const float* dpad, float* y, int64_t n, int K,
                        float x_min, float inv_h, bool linear) {
  const RegTable<NP> V(vpad), D(dpad);
  const __m512 vmin = _mm512_set1_ps(x_min), vinv = _mm512_set1_ps(inv_h), top = _mm512_set1_ps((float)(K - 1));
  const __m512i imax = _mm512_set1_epi32(K - 2);
  for (int64_t q = 0; q < n; q += 16) {
    const __mmask16 m = tail_mask(n, q);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + q);
    const Loc16 L = locate16(xv, vmin, vinv, top, imax);
    const __m512 lo = V(L.i), d = D(L.i);
    __m512 r;
    if (!linear) r = _mm512_fmadd_ps(_mm512_sub_ps(L.tc, L.fi), d, lo);
    else {
      r = _mm512_fmadd_ps(_mm512_sub_ps(L.t, L.fi), d, lo);
      r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_EQ_OQ), lo);  // flat end stays flat
    }
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q), xv);                  // NaN in, NaN out
    _mm512_mask_storeu_ps(y + q, m, r);
  }
}

// The AVX-512 backward for a run of float32 elements (K <= 128), 16 at a time: the same work and the same sums as
// the AVX2 loop above (lanes l and l + 8 both hold elements of sub-histogram l, added in element order), but the
// slope lookup is one to four vpermt2ps for every K instead of a gather above 32 knots, and the input gradient is
// written 16 wide. The float64 pairs are built in 8-lane halves with 256-bit operations, which measured faster on
// AMD Zen 4 than the same with 512-bit permutes.
template <int NP, bool NEED_X, bool NEED_V>
static void bwd_run_avx(const float* g, const float* x, const float* sp, float* gx, double* hs, int64_t n, int K,
                        float x_min, float inv_h, bool linear, int64_t sub_stride) {
  const RegTable<NP> Sl(sp);
  const __m512 vmin = _mm512_set1_ps(x_min), vinv = _mm512_set1_ps(inv_h), top = _mm512_set1_ps((float)(K - 1));
  const __m512 zero = _mm512_setzero_ps();
  const __m512i imax = _mm512_set1_epi32(K - 2);
  const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm512_set1_epi32((int)sub_stride));
  alignas(64) int32_t off[16]; alignas(64) double pr[32];
  for (int64_t q = 0; q < n; q += 16) {
    const __mmask16 m = tail_mask(n, q);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + q), gv = _mm512_maskz_loadu_ps(m, g + q);
    const Loc16 L = locate16(xv, vmin, vinv, top, imax);
    const __mmask16 nan = _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q);
    if (NEED_X) {
      __m512 r = _mm512_mul_ps(gv, Sl(L.i));
      if (!linear) r = _mm512_maskz_mov_ps((_mm512_cmp_ps_mask(L.t, zero, _CMP_GE_OQ) &
                                            _mm512_cmp_ps_mask(L.t, top, _CMP_LT_OQ)) | nan, r);
      _mm512_mask_storeu_ps(gx + q, m, r);
    }
    if (!NEED_V) continue;
    const __m512 f = _mm512_mask_mov_ps(_mm512_sub_ps(linear ? L.t : L.tc, L.fi), nan, xv);   // NaN in: NaN share
    _mm512_store_si512((__m512i*)off, _mm512_add_epi32(lanes, _mm512_slli_epi32(L.i, 1)));
    for (int h = 0; h < 2; ++h) {   // (g, g f) float64 pairs of lanes 8 h ... 8 h + 7, in lane order
      const __m256 gh = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(gv), 1)) : _mm512_castps512_ps256(gv);   // (AVX-512F only)
      const __m256 fh = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)) : _mm512_castps512_ps256(f);
      const __m256d g0 = _mm256_cvtps_pd(_mm256_castps256_ps128(gh)), g1 = _mm256_cvtps_pd(_mm256_extractf128_ps(gh, 1));
      const __m256d r0 = _mm256_mul_pd(g0, _mm256_cvtps_pd(_mm256_castps256_ps128(fh)));
      const __m256d r1 = _mm256_mul_pd(g1, _mm256_cvtps_pd(_mm256_extractf128_ps(fh, 1)));
      const __m256d a0 = _mm256_unpacklo_pd(g0, r0), b0 = _mm256_unpackhi_pd(g0, r0);
      const __m256d a1 = _mm256_unpacklo_pd(g1, r1), b1 = _mm256_unpackhi_pd(g1, r1);
      double* o = pr + 16 * h;
      _mm256_store_pd(o, _mm256_permute2f128_pd(a0, b0, 0x20)); _mm256_store_pd(o + 4, _mm256_permute2f128_pd(a0, b0, 0x31));
      _mm256_store_pd(o + 8, _mm256_permute2f128_pd(a1, b1, 0x20)); _mm256_store_pd(o + 12, _mm256_permute2f128_pd(a1, b1, 0x31));
    }
    if (m == (__mmask16)0xFFFF) {
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l) { double* p = hs + off[l]; _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_load_pd(pr + 2 * l))); }
    } else {
      for (int l = 0; l < (int)(n - q); ++l) { double* p = hs + off[l]; _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_load_pd(pr + 2 * l))); }
    }
  }
}

template <int NP>
static void bwd_run_avx_any(const float* g, const float* x, const float* sp, float* gx, double* hs, int64_t n, int K,
                            float x_min, float inv_h, bool linear, int64_t sub_stride, bool need_x, bool need_v) {
  if (need_x && need_v) bwd_run_avx<NP, true, true>(g, x, sp, gx, hs, n, K, x_min, inv_h, linear, sub_stride);
  else if (need_x) bwd_run_avx<NP, true, false>(g, x, sp, gx, hs, n, K, x_min, inv_h, linear, sub_stride);
  else if (need_v) bwd_run_avx<NP, false, true>(g, x, sp, gx, hs, n, K, x_min, inv_h, linear, sub_stride);
}

#endif

// Iterate over [begin, end) of x viewed as (outer, S, inner), calling fn(start, count, s) per run of one spline.
template <typename Fn>
static inline void for_runs(int64_t begin, int64_t end, int64_t S, int64_t inner, Fn fn) {
  int64_t j = begin;
  while (j < end) {
    const int64_t row = j / inner;
    const int64_t stop = std::min(end, (row + 1) * inner);
    fn(j, stop - j, row % S);
    j = stop;
  }
}

template <typename T>
static void forward_impl(const T* x, const T* v, T* y, int64_t N, int K, int64_t S, int64_t inner,
                         T x_min, T inv_h, bool linear) {
  if (S == 1) inner = N > 0 ? N : 1;   // one spline: a single run
  const int KS = K <= 128 ? 128 : K;  // table stride, padded for the register lookups
  std::vector<T> vt(S * KS, T(0)), dt(S * KS, T(0));   // values, and rise of each segment: y = v[i] + f * d[i]
  for (int64_t s = 0; s < S; ++s)
    for (int k = 0; k < K; ++k) {
      vt[s * KS + k] = v[s * K + k];
      if (k < K - 1) dt[s * KS + k] = v[s * K + k + 1] - v[s * K + k];
    }
  at::parallel_for(0, N, 16384, [&](int64_t begin, int64_t end) {
    for_runs(begin, end, S, inner, [&](int64_t j, int64_t n, int64_t s) {
      const T* vs = vt.data() + s * KS;
      const T* ds = dt.data() + s * KS;
#if defined(__AVX512F__)
      if constexpr (std::is_same<T, float>::value) {
        if (K <= 32) { fwd_run_avx<1>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear); return; }
        if (K <= 64) { fwd_run_avx<2>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear); return; }
        if (K <= 128) { fwd_run_avx<4>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear); return; }
      }
#endif
#if defined(__AVX2__) && defined(__FMA__)
      if constexpr (std::is_same<T, float>::value) {
        if (K <= 16) fwd_run_avx2<Tab8<2>>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear);
        else if (K <= 32) fwd_run_avx2<Tab8<4>>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear);
        else fwd_run_avx2<Gather8>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear);
        return;
      }
#endif
      fwd_run<T>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear);
    });
  });
}

// The backward's unit of work: a fixed-size chunk of the flat input, whatever the thread count.
static int64_t chunk_size(int64_t SK) { return std::max<int64_t>(32768, (16 * SK + 63) / 64 * 64); }

template <typename T>
static void backward_impl(const T* g, const T* x, const T* v, T* gx, double* gv, int64_t N, int K, int64_t S,
                          int64_t inner, T x_min, T inv_h, bool linear, bool need_x, bool need_v) {
  if (S == 1) inner = N > 0 ? N : 1;
  const int KS = K <= 128 ? 128 : K;                  // table stride, padded for the register lookups
  std::vector<T> sl(S * KS, T(0));                     // slope of each segment, d/h
  for (int64_t s = 0; s < S; ++s)
    for (int k = 0; k < K - 1; ++k) sl[s * KS + k] = (v[s * K + k + 1] - v[s * K + k]) * inv_h;
  const T* slp = sl.data();
  const int64_t SK = S * K;
  // Deterministic: the input is cut into chunks of C elements (C depends on S K only). Each chunk's sums go, in
  // element order, into NSUB sub-histograms (element q of a run into sub q % NSUB), are added up in sub order
  // into the chunk's own row of `part`, and the rows are added in chunk order at the end. Which thread runs a
  // chunk changes nothing; no atomics.
  const int64_t C = chunk_size(SK), nchunks = N > 0 ? (N + C - 1) / C : 0;
  const int64_t sub_stride = 2 * SK;                  // hist is [sub][S K][total, right]
  std::vector<double> part(need_v ? (size_t)nchunks * 2 * SK : 0);
  constexpr int64_t BLOCK = 1024;
  at::parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<double> hist(need_v ? (size_t)NSUB * sub_stride : 0, 0.0);
    std::vector<int> idx(BLOCK); std::vector<T> fr(BLOCK);
    for (int64_t c = c0; c < c1; ++c) {
      for_runs(c * C, std::min(N, (c + 1) * C), S, inner, [&](int64_t j0, int64_t n0, int64_t s) {
        double* hs = need_v ? hist.data() + 2 * s * K : nullptr;   // this spline's bins in sub-histogram 0
#if defined(__AVX512F__)
        if constexpr (std::is_same<T, float>::value) {
          if (SK <= (1 << 26) && K <= 128) {   // (offsets in int32)   // one fused pass, slopes in registers
            const float* sp = slp + s * KS;
            float* gxj = need_x ? gx + j0 : nullptr;
            if (K <= 32) bwd_run_avx_any<1>(g + j0, x + j0, sp, gxj, hs, n0, K, x_min, inv_h, linear, sub_stride, need_x, need_v);
            else if (K <= 64) bwd_run_avx_any<2>(g + j0, x + j0, sp, gxj, hs, n0, K, x_min, inv_h, linear, sub_stride, need_x, need_v);
            else bwd_run_avx_any<4>(g + j0, x + j0, sp, gxj, hs, n0, K, x_min, inv_h, linear, sub_stride, need_x, need_v);
            return;
          }
        }
#endif
#if defined(__AVX2__) && defined(__FMA__)
        if constexpr (std::is_same<T, float>::value) {
          if (SK <= (1 << 26)) {   // (offsets in int32)   // one fused pass: input gradient and lane-private histograms
            const float* sp = slp + s * KS;
            float* gxj = need_x ? gx + j0 : nullptr;
            if (K <= 16) bwd_run_avx2_any<Tab8<2>>(g + j0, x + j0, sp, gxj, hs, n0, K, x_min, inv_h, linear, sub_stride, need_x, need_v);
            else if (K <= 32) bwd_run_avx2_any<Tab8<4>>(g + j0, x + j0, sp, gxj, hs, n0, K, x_min, inv_h, linear, sub_stride, need_x, need_v);
            else bwd_run_avx2_any<Gather8>(g + j0, x + j0, sp, gxj, hs, n0, K, x_min, inv_h, linear, sub_stride, need_x, need_v);
            return;
          }
        }
#endif
        for (int64_t b = 0; b < n0; b += BLOCK) {   // BLOCK is a multiple of NSUB: q % NSUB is the same in the block
          const int64_t j = j0 + b, n = std::min(BLOCK, n0 - b);
          bwd_locate_block<T>(g + j, x + j, slp + s * KS, need_x ? gx + j : nullptr, idx.data(), fr.data(), n, K,
                              x_min, inv_h, linear, need_x, need_v);
          if (need_v) hist_add_block<T>(g + j, idx.data(), fr.data(), hs, n, sub_stride);
        }
      });
      if (need_v) {   // the chunk's row: its sub-histograms added in sub order; then clear them for the next chunk
        double* row = part.data() + (size_t)c * 2 * SK;
        for (int64_t k = 0; k < 2 * SK; ++k) row[k] = hist[k];
        for (int u = 1; u < NSUB; ++u)
          for (int64_t k = 0; k < 2 * SK; ++k) row[k] += hist[(size_t)u * sub_stride + k];
        std::fill(hist.begin(), hist.end(), 0.0);
      }
    }
  });
  if (!need_v) return;
  std::vector<double> sums(2 * SK, 0.0);   // (total, right) of each bin: the chunks' rows added in chunk order
  at::parallel_for(0, 2 * SK, 512, [&](int64_t k0, int64_t k1) {
    for (int64_t c = 0; c < nchunks; ++c) {
      const double* row = part.data() + (size_t)c * 2 * SK;
      for (int64_t k = k0; k < k1; ++k) sums[k] += row[k];
    }
  });
  for (int64_t k = 0; k < SK; ++k) {
    gv[k] += sums[2 * k] - sums[2 * k + 1];              // (1 - f) share to the left knot
    if ((k % K) + 1 < K) gv[k + 1] += sums[2 * k + 1];   // f share to the right knot
  }
}

static void check_inputs(const torch::Tensor& x, const torch::Tensor& values, int64_t S, int64_t inner) {
  TORCH_CHECK(x.device().is_cpu() && values.device().is_cpu(), "spline cpp kernel: CPU tensors only");
  TORCH_CHECK(values.dim() == 2 && values.size(0) == S && values.size(1) >= 2, "spline cpp kernel: values must be (S, K>=2)");
  TORCH_CHECK(x.scalar_type() == values.scalar_type(), "spline cpp kernel: x and values must share a dtype");
  TORCH_CHECK(inner >= 1 && x.numel() % (S * inner) == 0, "spline cpp kernel: x does not fit the (outer, S, inner) layout");
}

torch::Tensor spline_forward(torch::Tensor x, torch::Tensor values, double x_min, double x_max, bool linear,
                             int64_t S, int64_t inner) {
  check_inputs(x, values, S, inner);
  x = x.contiguous(); values = values.contiguous();
  auto y = torch::empty_like(x);
  const int K = (int)values.size(1);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "spline_forward", [&] {
    forward_impl<scalar_t>(x.data_ptr<scalar_t>(), values.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel(),
                           K, S, inner, (scalar_t)x_min, (scalar_t)((K - 1) / (x_max - x_min)), linear);
  });
  return y;
}

std::vector<torch::Tensor> spline_backward(torch::Tensor g, torch::Tensor x, torch::Tensor values, double x_min,
                                           double x_max, bool linear, int64_t S, int64_t inner, bool need_x,
                                           bool need_v) {
  check_inputs(x, values, S, inner);
  TORCH_CHECK(g.sizes() == x.sizes() && g.scalar_type() == x.scalar_type(), "spline cpp kernel: grad must match x");
  g = g.contiguous(); x = x.contiguous(); values = values.contiguous();
  const int K = (int)values.size(1);
  auto gx = need_x ? torch::empty_like(x) : torch::Tensor();
  auto gv64 = torch::zeros({S, K}, values.options().dtype(torch::kFloat64));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "spline_backward", [&] {
    backward_impl<scalar_t>(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), values.data_ptr<scalar_t>(),
                            need_x ? gx.data_ptr<scalar_t>() : nullptr, gv64.data_ptr<double>(), x.numel(), K, S,
                            inner, (scalar_t)x_min, (scalar_t)((K - 1) / (x_max - x_min)), linear, need_x, need_v);
  });
  return {need_x ? gx : torch::zeros({0}, x.options()), need_v ? gv64.to(values.scalar_type()) : torch::zeros({0}, values.options())};
}
