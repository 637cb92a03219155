// The AVX2 path of native_stats.cpp (included by it, inside its namespace): eight elements
// at a time, every accumulator a vector register for a whole chunk.
#pragma once

template <typename T>
inline __m256 load8_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <typename T>
inline void load8(const Plain<T>& s, int64_t j, __m256& values, __m256i& words) {
  if constexpr (std::is_same_v<T, float>) {
    values = _mm256_loadu_ps(s.data + j);
    words = _mm256_castps_si256(values);
  } else {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.data + j));
    words = _mm256_cvtepu16_epi32(half);
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      values = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
    } else {
      values = _mm256_cvtph_ps(half);
    }
  }
}

template <typename T>
inline void load8(const Copying<T>& s, int64_t j, __m256& values, __m256i& words) {
  if constexpr (sizeof(T) == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.copy + j),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.data + j)));
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(s.copy + j), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.data + j)));
  }
  load8(Plain<T>{s.data}, j, values, words);
}

template <typename T>
inline void load8(const Difference<T>& s, int64_t j, __m256& values, __m256i& words) {
  values = _mm256_sub_ps(load8_float(s.a + j), load8_float(s.b + j));
  words = _mm256_castps_si256(values);
}

inline __m256i mix_a8(__m256i v) {
  v = _mm256_mullo_epi32(_mm256_xor_si256(v, _mm256_srli_epi32(v, 16)), _mm256_set1_epi32(static_cast<int>(kMixA)));
  return _mm256_xor_si256(v, _mm256_srli_epi32(v, 13));
}

inline __m256i mix_b8(__m256i v) {
  v = _mm256_mullo_epi32(_mm256_xor_si256(v, _mm256_srli_epi32(v, 15)), _mm256_set1_epi32(static_cast<int>(kMixB)));
  return _mm256_xor_si256(v, _mm256_srli_epi32(v, 16));
}

inline double sum4d(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

inline int64_t sum8i(__m256i v) {
  alignas(32) int32_t c[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(c), v);
  int64_t total = 0;
  for (int k = 0; k < 8; ++k) total += c[k];
  return total;
}

inline uint32_t sum8u(__m256i v) {
  alignas(32) uint32_t c[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(c), v);
  uint32_t total = 0;
  for (int k = 0; k < 8; ++k) total += c[k];
  return total;
}

// The accumulators of one chunk, eight vector lanes each. Counts are -1 per hit (compare masks).
struct Vector {
  static constexpr int64_t kWidth = 8;
  __m256 sum = _mm256_setzero_ps(), sum_sq = _mm256_setzero_ps();
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = sum_lo, sq_lo = sum_lo, sq_hi = sum_lo;
  __m256 mx = _mm256_set1_ps(-INFINITY), mn = _mm256_set1_ps(INFINITY);
  __m256i nonfinite = _mm256_setzero_si256(), nan = nonfinite, zero = nonfinite, small = nonfinite,
          over = nonfinite, la = nonfinite, lb = nonfinite;
  __m256i ia = nonfinite, ib = nonfinite, da = nonfinite, db = nonfinite;
  __m256 tiny, largest;
  int64_t since_promote = 0;

  Vector(float tiny_, float largest_) : tiny(_mm256_set1_ps(tiny_)), largest(_mm256_set1_ps(largest_)) {}

  inline void start(uint32_t base, uint32_t step) {
    const __m256i index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)),
                                           _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                              _mm256_set1_epi32(static_cast<int>(step))));
    ia = _mm256_mullo_epi32(index, _mm256_set1_epi32(static_cast<int>(kIndexA)));
    ib = _mm256_mullo_epi32(index, _mm256_set1_epi32(static_cast<int>(kIndexB)));
    da = _mm256_set1_epi32(static_cast<int>(8u * step * kIndexA));
    db = _mm256_set1_epi32(static_cast<int>(8u * step * kIndexB));
  }

  inline void add(__m256 v, __m256i w) {
    la = _mm256_add_epi32(la, mix_a8(_mm256_xor_si256(w, ia)));
    lb = _mm256_add_epi32(lb, mix_b8(_mm256_xor_si256(w, ib)));
    ia = _mm256_add_epi32(ia, da);
    ib = _mm256_add_epi32(ib, db);
    const __m256 mag = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
    zero = _mm256_add_epi32(zero, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ)));
    small = _mm256_add_epi32(small, _mm256_castps_si256(_mm256_cmp_ps(mag, tiny, _CMP_LT_OQ)));  // zeros too
    over = _mm256_add_epi32(over, _mm256_castps_si256(_mm256_cmp_ps(mag, largest, _CMP_GT_OQ)));  // Inf too
    const __m256 moderate = _mm256_cmp_ps(mag, _mm256_set1_ps(kModerate), _CMP_LT_OQ);  // not NaN or Inf
    if (__builtin_expect(_mm256_movemask_ps(moderate) == 0xFF, 1)) {
      sum = _mm256_add_ps(sum, v);
      sum_sq = _mm256_fmadd_ps(v, v, sum_sq);
      mx = _mm256_max_ps(mx, v);
      mn = _mm256_min_ps(mn, v);
    } else {  // NaN, Inf, or a square float32 cannot hold: float64 for these eight
      const __m256i exponent = _mm256_set1_epi32(0x7F800000);
      const __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exponent), exponent);
      const __m256 bad_ps = _mm256_castsi256_ps(bad);
      const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_castps_si256(mag), exponent);
      nonfinite = _mm256_add_epi32(nonfinite, bad);
      nan = _mm256_add_epi32(nan, is_nan);
      over = _mm256_sub_epi32(over, _mm256_andnot_si256(is_nan, bad));  // Inf was counted above (as -1)
      const __m256 f = _mm256_andnot_ps(bad_ps, v);  // non-finite -> 0
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
      sum_lo = _mm256_add_pd(sum_lo, lo);
      sum_hi = _mm256_add_pd(sum_hi, hi);
      sq_lo = _mm256_fmadd_pd(lo, lo, sq_lo);
      sq_hi = _mm256_fmadd_pd(hi, hi, sq_hi);
      mx = _mm256_max_ps(mx, _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), bad_ps));
      mn = _mm256_min_ps(mn, _mm256_blendv_ps(v, _mm256_set1_ps(INFINITY), bad_ps));
    }
    if (++since_promote == kAddsPerLane) promote();
  }

  inline void promote() {
    sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sum)));
    sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sum, 1)));
    sq_lo = _mm256_add_pd(sq_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sum_sq)));
    sq_hi = _mm256_add_pd(sq_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sum_sq, 1)));
    sum = sum_sq = _mm256_setzero_ps();
    since_promote = 0;
  }

  void fold_into(Partial& out) {
    promote();
    out.sum += sum4d(_mm256_add_pd(sum_lo, sum_hi));
    out.sum_sq += sum4d(_mm256_add_pd(sq_lo, sq_hi));
    const int64_t nonfinite_n = -sum8i(nonfinite), nan_n = -sum8i(nan), zero_n = -sum8i(zero);
    out.nan += nan_n;
    out.inf += nonfinite_n - nan_n;
    out.zero += zero_n;
    out.under += -sum8i(small) - zero_n;
    out.over += -sum8i(over);
    alignas(32) float hi8[8], lo8[8];
    _mm256_store_ps(hi8, mx);
    _mm256_store_ps(lo8, mn);
    double hi = kNegInf, lo = -kNegInf;
    for (int k = 0; k < 8; ++k) {
      hi = std::max(hi, static_cast<double>(hi8[k]));
      lo = std::min(lo, static_cast<double>(lo8[k]));
    }
    out.max = std::max(out.max, hi);
    out.neg_min = std::max(out.neg_min, -lo);
    out.absmax = std::max(out.absmax, std::max(hi, -lo));  // over finite elements, max |x| = max(max, -min)
    out.lane_a += sum8u(la);
    out.lane_b += sum8u(lb);
  }
};

template <typename Source>
inline void load(const Source& s, int64_t j, __m256& values, __m256i& words) { load8(s, j, values, words); }
