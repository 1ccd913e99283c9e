#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <type_traits>

// Spline-kernel attention weights, fused: w = phi(s) on allowed entries (0 elsewhere), row sums of w and |w|.
// s: (N, Tq, Tk) contiguous; values: (K,) same dtype; keymask: (N, Tk) uint8 (1 = may attend) or empty;
// causal: key j allowed for query i iff j <= i + (Tk - Tq). Causal rows skip the masked tail entirely.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SPLINE_ATTN_AVX512 1
// float32, clamped ends, K <= 64 knots: knot tables live in four registers and are read with permutes, not gathers
// (AVX-512 gathers are slow on CPUs with the Gather Data Sampling mitigation: 4-5x on this kernel).
struct Table64 { __m512 a0, a1, a2, a3; };
static inline Table64 load_table(const float* src, int64_t n) {
  alignas(64) float t[64] = {0};
  for (int64_t k = 0; k < n && k < 64; ++k) t[k] = src[k];
  return {_mm512_load_ps(t), _mm512_load_ps(t + 16), _mm512_load_ps(t + 32), _mm512_load_ps(t + 48)};
}
static inline __m512 lookup(const Table64& t, __m512i k) {
  const __mmask16 hi = _mm512_cmpge_epi32_mask(k, _mm512_set1_epi32(32));
  return _mm512_mask_blend_ps(hi, _mm512_permutex2var_ps(t.a0, k, t.a1), _mm512_permutex2var_ps(t.a2, k, t.a3));
}
static inline __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u); }
static inline __mmask16 allowed(__mmask16 m, const uint8_t* kr) {
  return kr ? _mm_mask_cmpneq_epi8_mask(m, _mm_maskz_loadu_epi8(m, kr), _mm_setzero_si128()) : m;
}
// One row of the forward (clamped ends): w = v[k] + f d[k], NaN kept, 0 where the key mask says no; row sums of w and |w|.
static inline void fwd_row_avx512(const float* sr, float* wr, const uint8_t* kr, int64_t jmax, const Table64& V, const Table64& D,
                                  float x_min, float inv_h, float top, int32_t last, float& den, float& aden) {
  const __m512 vxmin = _mm512_set1_ps(x_min), vinv = _mm512_set1_ps(inv_h), vtop = _mm512_set1_ps(top), zero = _mm512_setzero_ps();
  const __m512i vlast = _mm512_set1_epi32(last);
  __m512 acc = zero, aacc = zero;
  for (int64_t j = 0; j < jmax; j += 16) {
    const __mmask16 m = lanes(jmax - j), ok = allowed(m, kr ? kr + j : nullptr);
    const __m512 x = _mm512_maskz_loadu_ps(m, sr + j);
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, vxmin), vinv);
    const __m512 tc = _mm512_min_ps(_mm512_max_ps(t, zero), vtop);   // NaN -> 0 (restored below)
    const __m512i k = _mm512_min_epi32(_mm512_cvttps_epi32(tc), vlast);
    __m512 y = _mm512_fmadd_ps(_mm512_sub_ps(tc, _mm512_cvtepi32_ps(k)), lookup(D, k), lookup(V, k));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
    y = _mm512_maskz_mov_ps(ok, y);
    _mm512_mask_storeu_ps(wr + j, m, y);
    acc = _mm512_add_ps(acc, y); aacc = _mm512_add_ps(aacc, _mm512_abs_ps(y));
  }
  den = _mm512_reduce_add_ps(acc); aden = _mm512_reduce_add_ps(aacc);
}
// One row of the backward to the scores (clamped ends): (gw + gden) * slope[k] inside the knot range, 0 outside, NaN kept.
static inline void bwd_row_avx512(const float* sr, const float* gr, float gd, float* gsr, const uint8_t* kr, int64_t jmax,
                                  const Table64& S, float x_min, float inv_h, float top, int32_t last) {
  const __m512 vxmin = _mm512_set1_ps(x_min), vinv = _mm512_set1_ps(inv_h), vtop = _mm512_set1_ps(top), zero = _mm512_setzero_ps();
  const __m512 vgd = _mm512_set1_ps(gd);
  const __m512i vlast = _mm512_set1_epi32(last);
  for (int64_t j = 0; j < jmax; j += 16) {
    const __mmask16 m = lanes(jmax - j), ok = allowed(m, kr ? kr + j : nullptr);
    const __m512 x = _mm512_maskz_loadu_ps(m, sr + j);
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, vxmin), vinv);
    const __m512 tc = _mm512_min_ps(_mm512_max_ps(t, zero), vtop);
    const __m512i k = _mm512_min_epi32(_mm512_cvttps_epi32(tc), vlast);
    const __mmask16 inside = _mm512_cmp_ps_mask(t, zero, _CMP_GE_OQ) & _mm512_cmp_ps_mask(t, vtop, _CMP_LE_OQ);
    __m512 g = _mm512_maskz_mul_ps(inside, _mm512_add_ps(_mm512_maskz_loadu_ps(m, gr + j), vgd), lookup(S, k));
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
    g = _mm512_maskz_mov_ps(ok, g);
    _mm512_mask_storeu_ps(gsr + j, m, g);
  }
}
// One row of the backward to the knot values (clamped ends): lane l of each 16-wide block adds g = gw + gden into its own
// histograms h + l*2K (bin k: g, bin K+k: g f), so neighbouring scores that hit the same knot do not wait on each other.
static inline void hist_row_avx512(const float* sr, const float* gr, float gd, const uint8_t* kr, int64_t jmax,
                                   float x_min, float inv_h, float top, int32_t last, double* h, int64_t K) {
  const __m512 vxmin = _mm512_set1_ps(x_min), vinv = _mm512_set1_ps(inv_h), vtop = _mm512_set1_ps(top), zero = _mm512_setzero_ps();
  const __m512 vgd = _mm512_set1_ps(gd);
  const __m512i vlast = _mm512_set1_epi32(last);
  alignas(64) int32_t kb[16]; alignas(64) float gb[16], fb[16];
  for (int64_t j = 0; j < jmax; j += 16) {
    const __mmask16 m = lanes(jmax - j), ok = allowed(m, kr ? kr + j : nullptr);
    const __m512 x = _mm512_maskz_loadu_ps(m, sr + j);
    const unsigned use = (unsigned)(ok & ~_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q));
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, vxmin), vinv);
    const __m512 tc = _mm512_min_ps(_mm512_max_ps(t, zero), vtop);
    const __m512i k = _mm512_min_epi32(_mm512_cvttps_epi32(tc), vlast);
    _mm512_store_si512((__m512i*)kb, k);
    _mm512_store_ps(fb, _mm512_sub_ps(tc, _mm512_cvtepi32_ps(k)));
    _mm512_store_ps(gb, _mm512_add_ps(_mm512_maskz_loadu_ps(m, gr + j), vgd));
    for (int l = 0; l < 16; ++l) {
      if (!((use >> l) & 1u)) continue;
      const double g = (double)gb[l];
      double* ht = h + (size_t)l * 2 * K;
      ht[kb[l]] += g; ht[K + kb[l]] += g * (double)fb[l];
    }
  }
}
#endif

template <typename T>
static inline T spline_at(T x, const T* v, const T* d, int64_t K, T x_min, T inv_h, bool linear) {
  if (std::isnan(x)) return x;
  const T t = (x - x_min) * inv_h;
  if (!linear) {
    const T tc = t < T(0) ? T(0) : (t > T(K - 1) ? T(K - 1) : t);
    int64_t i = (int64_t)tc; if (i > K - 2) i = K - 2;
    return v[i] + (tc - T(i)) * d[i];
  }
  int64_t i;
  if (t <= T(0)) i = 0; else if (t >= T(K - 2)) i = K - 2; else i = (int64_t)t;
  if (d[i] == T(0)) return v[i];
  return v[i] + (t - T(i)) * d[i];
}

template <typename T>
static void fwd_impl(const T* s, const T* vals, const uint8_t* km, T* w, T* den, T* aden,
                     int64_t N, int64_t Tq, int64_t Tk, int64_t K, T x_min, T inv_h, bool linear, bool causal) {
  std::vector<T> dv(K - 1);
  for (int64_t k = 0; k + 1 < K; ++k) dv[k] = vals[k + 1] - vals[k];
  const T* d = dv.data();
  const int64_t off = Tk - Tq;
  const T top = T(K - 1);
  const int32_t last = (int32_t)(K - 2);
#ifdef SPLINE_ATTN_AVX512
  const bool fast = std::is_same<T, float>::value && !linear && K <= 64;
  Table64 Vt{}, Dt{};
  if (fast) { Vt = load_table((const float*)vals, K); Dt = load_table((const float*)d, K - 1); }
#endif
  at::parallel_for(0, N * Tq, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / Tq, i = r % Tq;
      const int64_t jmax = causal ? std::min(Tk, std::max<int64_t>(i + 1 + off, 0)) : Tk;
      const T* sr = s + r * Tk; T* wr = w + r * Tk;
      const uint8_t* kr = km ? km + n * Tk : nullptr;
      T acc = 0, aacc = 0;
#ifdef SPLINE_ATTN_AVX512
      if (fast) {
        float a = 0, aa = 0;
        fwd_row_avx512((const float*)sr, (float*)wr, kr, jmax, Vt, Dt, (float)x_min, (float)inv_h, (float)top, last, a, aa);
        acc = (T)a; aacc = (T)aa;
      } else
#endif
      if (!linear) {
        #pragma omp simd reduction(+:acc,aacc)
        for (int64_t j = 0; j < jmax; ++j) {
          const T x = sr[j];
          const T t = (x - x_min) * inv_h;
          T tc = t > T(0) ? t : T(0);                 // NaN -> 0 (the select below restores NaN)
          tc = tc < top ? tc : top;
          int32_t k = (int32_t)tc; k = k < last ? k : last;
          T y = vals[k] + (tc - T(k)) * d[k];
          y = (x == x) ? y : x;
          if (kr) y = kr[j] ? y : T(0);
          wr[j] = y; acc += y; aacc += std::abs(y);
        }
      } else {
        for (int64_t j = 0; j < jmax; ++j) {
          T y = spline_at<T>(sr[j], vals, d, K, x_min, inv_h, true);
          if (kr && !kr[j]) y = T(0);
          wr[j] = y; acc += y; aacc += std::abs(y);
        }
      }
      for (int64_t j = jmax; j < Tk; ++j) wr[j] = T(0);
      den[r] = acc; aden[r] = aacc;
    }
  });
}

std::vector<torch::Tensor> attn_weights_forward(torch::Tensor s, torch::Tensor values, torch::Tensor keymask,
                                                double x_min, double x_max, bool linear, bool causal) {
  TORCH_CHECK(s.dim() == 3 && s.is_contiguous() && s.device().is_cpu(), "scores must be a contiguous CPU (N, Tq, Tk) tensor");
  TORCH_CHECK(values.dim() == 1 && values.size(0) >= 2 && values.scalar_type() == s.scalar_type(), "values must be (K>=2,) in the scores' dtype");
  const int64_t N = s.size(0), Tq = s.size(1), Tk = s.size(2), K = values.size(0);
  const bool has_km = keymask.numel() > 0;
  if (has_km) TORCH_CHECK(keymask.scalar_type() == torch::kUInt8 && keymask.is_contiguous() && keymask.size(0) == N && keymask.size(1) == Tk, "keymask must be contiguous uint8 (N, Tk)");
  auto w = torch::empty_like(s);
  auto den = torch::empty({N, Tq, 1}, s.options());
  auto aden = torch::empty({N, Tq, 1}, s.options());
  auto vals = values.contiguous();
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "attn_weights_forward", [&] {
    const scalar_t inv_h = (scalar_t)((K - 1) / (x_max - x_min));
    fwd_impl<scalar_t>(s.data_ptr<scalar_t>(), vals.data_ptr<scalar_t>(), has_km ? keymask.data_ptr<uint8_t>() : nullptr,
                       w.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), aden.data_ptr<scalar_t>(),
                       N, Tq, Tk, K, (scalar_t)x_min, inv_h, linear, causal);
  });
  return {w, den, aden};
}

template <typename T>
static void bwd_impl(const T* gw, const T* gden, const T* s, const T* vals, const uint8_t* km, T* gs, double* gv,
                     int64_t N, int64_t Tq, int64_t Tk, int64_t K, T x_min, T inv_h, bool linear, bool causal,
                     bool need_s, bool need_v) {
  std::vector<T> dv(K - 1);
  for (int64_t k = 0; k + 1 < K; ++k) dv[k] = (vals[k + 1] - vals[k]) * inv_h;   // slopes
  const T* slope = dv.data();
  const int64_t off = Tk - Tq;
  const T top = T(K - 1);
  const int32_t last = (int32_t)(K - 2);
#ifdef SPLINE_ATTN_AVX512
  const bool fast = std::is_same<T, float>::value && !linear && K <= 64;
  Table64 St{};
  if (fast) St = load_table((const float*)slope, K - 1);
#endif
  const int nt = at::get_num_threads();
  constexpr int NSUB = 16;  // independent sub-histograms: consecutive scores often hit the same knot
  std::vector<double> hist(need_v ? (size_t)nt * NSUB * 2 * K : 0, 0.0);
  at::parallel_for(0, N * Tq, 16, [&](int64_t b, int64_t e) {
    double* hbase = need_v ? hist.data() + (size_t)at::get_thread_num() * NSUB * 2 * K : nullptr;
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / Tq, i = r % Tq;
      const int64_t jmax = causal ? std::min(Tk, std::max<int64_t>(i + 1 + off, 0)) : Tk;
      const T* sr = s + r * Tk; const T* gr = gw + r * Tk;
      const uint8_t* kr = km ? km + n * Tk : nullptr;
      const T gd = gden ? gden[r] : T(0);
      if (need_s) {
        T* gsr = gs + r * Tk;
#ifdef SPLINE_ATTN_AVX512
        if (fast) bwd_row_avx512((const float*)sr, (const float*)gr, (float)gd, (float*)gsr, kr, jmax, St, (float)x_min, (float)inv_h, (float)top, last);
        const int64_t jslow = fast ? 0 : jmax;
#else
        const int64_t jslow = jmax;
#endif
        #pragma omp simd
        for (int64_t j = 0; j < jslow; ++j) {
          const T x = sr[j];
          const T t = (x - x_min) * inv_h;
          T tc = t > T(0) ? t : T(0);
          tc = tc < top ? tc : top;
          int32_t k = (int32_t)tc; k = k < last ? k : last;
          const bool inside = linear || ((t >= T(0)) && (t <= top));
          T g = inside ? (gr[j] + gd) * slope[k] : T(0);
          if (linear) { int32_t kl = t <= T(0) ? 0 : (t >= T(last) ? last : (int32_t)t); g = (gr[j] + gd) * slope[kl]; }
          g = (x == x) ? g : x;
          if (kr) g = kr[j] ? g : T(0);
          gsr[j] = g;
        }
        for (int64_t j = jmax; j < Tk; ++j) gsr[j] = T(0);
      }
      if (need_v) {
#ifdef SPLINE_ATTN_AVX512
        if (fast) hist_row_avx512((const float*)sr, (const float*)gr, (float)gd, kr, jmax, (float)x_min, (float)inv_h, (float)top, last, hbase, K);
        const int64_t jslow_v = fast ? 0 : jmax;
#else
        const int64_t jslow_v = jmax;
#endif
        for (int64_t j = 0; j < jslow_v; ++j) {
          const T x = sr[j];
          if (x != x || (kr && !kr[j])) continue;
          const T t = (x - x_min) * inv_h;
          int32_t k; T f;
          if (!linear) {
            T tc = t > T(0) ? t : T(0); tc = tc < top ? tc : top;
            k = (int32_t)tc; k = k < last ? k : last; f = tc - T(k);
          } else {
            k = t <= T(0) ? 0 : (t >= T(last) ? last : (int32_t)t); f = t - T(k);
          }
          const double g = (double)(gr[j] + gd);
          double* ht = hbase + (j % NSUB) * 2 * K;
          ht[k] += g; ht[K + k] += g * (double)f;
        }
      }
    }
  });
  if (need_v) {
    for (int64_t k = 0; k < K; ++k) {
      double tsum = 0.0, rsum = 0.0;
      for (int h = 0; h < nt * NSUB; ++h) { tsum += hist[(size_t)h * 2 * K + k]; rsum += hist[(size_t)h * 2 * K + K + k]; }
      gv[k] += tsum - rsum;
      if (k + 1 < K) gv[k + 1] += rsum;
    }
  }
}

std::vector<torch::Tensor> attn_weights_backward(torch::Tensor gw, torch::Tensor gden, torch::Tensor s, torch::Tensor values,
                                                 torch::Tensor keymask, double x_min, double x_max, bool linear, bool causal,
                                                 bool need_s, bool need_v) {
  const int64_t N = s.size(0), Tq = s.size(1), Tk = s.size(2), K = values.size(0);
  gw = gw.contiguous();
  const bool has_gd = gden.numel() > 0;
  if (has_gd) gden = gden.contiguous();
  const bool has_km = keymask.numel() > 0;
  auto gs = need_s ? torch::empty_like(s) : torch::Tensor();
  auto gv = torch::zeros({K}, s.options().dtype(torch::kFloat64));
  auto vals = values.contiguous();
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "attn_weights_backward", [&] {
    const scalar_t inv_h = (scalar_t)((K - 1) / (x_max - x_min));
    bwd_impl<scalar_t>(gw.data_ptr<scalar_t>(), has_gd ? gden.data_ptr<scalar_t>() : nullptr, s.data_ptr<scalar_t>(),
                       vals.data_ptr<scalar_t>(), has_km ? keymask.data_ptr<uint8_t>() : nullptr,
                       need_s ? gs.data_ptr<scalar_t>() : nullptr, gv.data_ptr<double>(),
                       N, Tq, Tk, K, (scalar_t)x_min, inv_h, linear, causal, need_s, need_v);
  });
  return {need_s ? gs : torch::Tensor(), gv.to(values.scalar_type())};
}
