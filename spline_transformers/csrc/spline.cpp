#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>
#include <algorithm>
#include <type_traits>
#if defined(__AVX512F__) || defined(__SSE2__)
#include <immintrin.h>
#endif

// A linear spline on K evenly spaced knots, evaluated on x viewed as (outer, S, inner): spline s on slice s.
// Forward: one pass. Backward: one pass; value gradients go to per-thread histograms, then one reduction.

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

template <typename T>
static void bwd_x_run(const T* __restrict g, const T* __restrict x, const T* __restrict ss, T* __restrict gx,
                      int64_t n, int K, T x_min, T inv_h, bool linear) {
  const T top = T(K - 1);
  for (int64_t q = 0; q < n; ++q) {
    T t, tc; int i;
    locate(x[q], x_min, inv_h, K, t, tc, i);
    const T gq = g[q] * ss[i];
    gx[q] = (linear | ((t >= T(0)) & (t < top)) | __builtin_isnan(x[q])) ? gq : T(0);   // NaN: segment 0, as in the other backends
  }
}

template <typename T>
static void bwd_locate_run(const T* __restrict x, int* __restrict idx, T* __restrict fr, int64_t n, int K,
                           T x_min, T inv_h, bool linear) {
  for (int64_t q = 0; q < n; ++q) {
    T t, tc; int i; const T xv = x[q];
    locate(xv, x_min, inv_h, K, t, tc, i);
    const T f = (linear ? t : tc) - (T)i;
    idx[q] = i;
    fr[q] = __builtin_isnan(xv) ? xv : f;
  }
}


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

static inline __m256 hi8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }   // lanes 8-15

// The whole backward for a run of float32 elements in one pass, 16 at a time: locate once, write the input
// gradient (slope table in registers), and add each element's (g, g f) pair into the histograms of its lane.
// Lane l of an even vector adds into the sub-histogram at lane_off[l], of an odd vector at lane_off[16 + l]
// (32 distinct copies while they fit in L1: lane-private), so neighbouring elements that land in the same bin
// never wait on one another's store; the pairs and the bin offsets are computed 16 at a time in vector
// registers, leaving one load-add-store of a double pair per element.
template <int NP>
static void bwd_run_avx(const float* g, const float* x, const float* spad, float* gx, int64_t n, int K,
                        float x_min, float inv_h, bool linear, bool need_x, bool need_v, double* hs,
                        const int32_t* lane_off) {
  const RegTable<NP> Sl(spad);
  const __m512 vmin = _mm512_set1_ps(x_min), vinv = _mm512_set1_ps(inv_h), top = _mm512_set1_ps((float)(K - 1));
  const __m512i imax = _mm512_set1_epi32(K - 2);
  const __m512i lanes0 = _mm512_loadu_si512((const void*)lane_off), lanes1 = _mm512_loadu_si512((const void*)(lane_off + 16));
  bool odd = false;   // even and odd vectors use different sub-histograms: a bin's chain is 32 elements long
  const __m512i ilo = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), ihi = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  alignas(64) int32_t off[16]; alignas(64) double pr[32];
  for (int64_t q = 0; q < n; q += 16) {
    const __mmask16 m = tail_mask(n, q);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + q), gv = _mm512_maskz_loadu_ps(m, g + q);
    const Loc16 L = locate16(xv, vmin, vinv, top, imax);
    if (need_x) {
      __mmask16 keep = m;
      if (!linear) keep &= (_mm512_cmp_ps_mask(L.t, _mm512_setzero_ps(), _CMP_GE_OQ) & _mm512_cmp_ps_mask(L.t, top, _CMP_LT_OQ))
                           | _mm512_cmp_ps_mask(L.t, L.t, _CMP_UNORD_Q);
      _mm512_mask_storeu_ps(gx + q, m, _mm512_maskz_mul_ps(keep, gv, Sl(L.i)));
    }
    if (!need_v) continue;
    __m512 f = _mm512_sub_ps(linear ? L.t : L.tc, L.fi);
    f = _mm512_mask_mov_ps(f, _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q), xv);           // NaN in: NaN share
    _mm512_store_si512((__m512i*)off, _mm512_add_epi32(odd ? lanes1 : lanes0, _mm512_slli_epi32(L.i, 1)));
    odd = !odd;
    const __m512d g0 = _mm512_cvtps_pd(_mm512_castps512_ps256(gv)), g1 = _mm512_cvtps_pd(hi8(gv));
    const __m512d r0 = _mm512_mul_pd(g0, _mm512_cvtps_pd(_mm512_castps512_ps256(f)));
    const __m512d r1 = _mm512_mul_pd(g1, _mm512_cvtps_pd(hi8(f)));
    _mm512_store_pd(pr, _mm512_permutex2var_pd(g0, ilo, r0));        // (g, g f) of lanes 0-3
    _mm512_store_pd(pr + 8, _mm512_permutex2var_pd(g0, ihi, r0));    // lanes 4-7
    _mm512_store_pd(pr + 16, _mm512_permutex2var_pd(g1, ilo, r1));   // lanes 8-11
    _mm512_store_pd(pr + 24, _mm512_permutex2var_pd(g1, ihi, r1));   // lanes 12-15
    if (n - q >= 16) {
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l) { double* p = hs + off[l]; _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_load_pd(pr + 2 * l))); }
    } else {
      for (int l = 0; l < (int)(n - q); ++l) { double* p = hs + off[l]; _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_load_pd(pr + 2 * l))); }
    }
  }
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
      fwd_run<T>(x + j, vs, ds, y + j, n, K, x_min, inv_h, linear);
    });
  });
}

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
  const int nt = at::get_num_threads();
  // NSUB interleaved sub-histograms per thread break the add->add dependency chains on hot bins: 32 (one per
  // vector lane, for even and odd vectors) while they fit in the L1 cache (S K <= 64: 32 KiB a thread), 16 while
  // they fit in L2 (S K <= 512: 128 KiB), else 4
  constexpr int NSUB_LOOP = 4;                        // the scalar loop's interleave (it uses subs 0..3)
  const int NSUB = SK <= 64 ? 32 : SK <= 512 ? 16 : NSUB_LOOP;
  constexpr int64_t BLOCK = 2048;
  const size_t per_thread = (size_t)NSUB * 2 * SK;   // [sub][SK][total, right]
  int32_t lane_off[32];                               // sub-histogram of lane l (even vectors) and 16 + l (odd), in doubles
  for (int l = 0; l < 32; ++l) lane_off[l] = (int32_t)((l % NSUB) * 2 * SK);
  std::vector<double> hist(need_v ? (size_t)nt * per_thread : 0, 0.0);
  at::parallel_for(0, N, 16384, [&](int64_t begin, int64_t end) {
    double* h = need_v ? hist.data() + (size_t)at::get_thread_num() * per_thread : nullptr;
    int idx[BLOCK]; T fr[BLOCK];
    for_runs(begin, end, S, inner, [&](int64_t j0, int64_t n0, int64_t s) {
      for (int64_t b = 0; b < n0; b += BLOCK) {
        const int64_t j = j0 + b, n = std::min(BLOCK, n0 - b);
#if defined(__AVX512F__)
        if constexpr (std::is_same<T, float>::value) {
          if (K <= 128) {   // one fused pass: input gradient and lane-private histograms
            const float* sp = slp + s * KS;
            float* gxj = need_x ? gx + j : nullptr;
            double* hs = need_v ? h + 2 * s * K : nullptr;
            if (K <= 32) bwd_run_avx<1>(g + j, x + j, sp, gxj, n, K, x_min, inv_h, linear, need_x, need_v, hs, lane_off);
            else if (K <= 64) bwd_run_avx<2>(g + j, x + j, sp, gxj, n, K, x_min, inv_h, linear, need_x, need_v, hs, lane_off);
            else bwd_run_avx<4>(g + j, x + j, sp, gxj, n, K, x_min, inv_h, linear, need_x, need_v, hs, lane_off);
            continue;
          }
        }
#endif
        if (need_x) bwd_x_run<T>(g + j, x + j, slp + s * KS, gx + j, n, K, x_min, inv_h, linear);
        if (need_v) bwd_locate_run<T>(x + j, idx, fr, n, K, x_min, inv_h, linear);
        if (!need_v) continue;
        const T* gj = g + j;
        double* hs = h + 2 * s * K;   // this spline's bins in sub-histogram 0; sub u is at + u * 2 * SK
        int64_t q = 0;
        for (; q + NSUB_LOOP <= n; q += NSUB_LOOP) {
          for (int u = 0; u < NSUB_LOOP; ++u) {   // (total, right) pairs: one 128-bit load-fma-store per element
            double* p = hs + (size_t)u * 2 * SK + 2 * idx[q + u];
            const double gq = (double)gj[q + u], fq = (double)fr[q + u];
#if defined(__SSE2__)
            _mm_storeu_pd(p, _mm_add_pd(_mm_loadu_pd(p), _mm_mul_pd(_mm_set1_pd(gq), _mm_set_pd(fq, 1.0))));
#else
            p[0] += gq; p[1] += gq * fq;
#endif
          }
        }
        for (; q < n; ++q) { double* p = hs + 2 * idx[q]; const double gq = (double)gj[q]; p[0] += gq; p[1] += gq * (double)fr[q]; }
      }
    });
  });
  if (need_v) {
    for (int64_t k = 0; k < SK; ++k) {
      double tsum = 0.0, rsum = 0.0;
      for (int th = 0; th < nt; ++th)
        for (int sub = 0; sub < NSUB; ++sub) {
          const double* base = hist.data() + (size_t)th * per_thread + (size_t)sub * 2 * SK;
          tsum += base[2 * k]; rsum += base[2 * k + 1];
        }
      gv[k] += tsum - rsum;                       // (1 - f) share to the left knot
      if ((k % K) + 1 < K) gv[k + 1] += rsum;     // f share to the right knot
    }
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
