// The AVX-512 path of native_stats.cpp (included by it, inside its namespace): sixteen
// elements at a time, every accumulator a vector register for a whole chunk.
#pragma once

template <typename T>
inline __m512 load16_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {  // bf16 is the top half of a float
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

template <typename T>
inline void load16(const Plain<T>& s, int64_t j, __m512& values, __m512i& words) {
  if constexpr (std::is_same_v<T, float>) {
    values = _mm512_loadu_ps(s.data + j);
    words = _mm512_castps_si512(values);
  } else {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.data + j));
    words = _mm512_cvtepu16_epi32(half);
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      values = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
    } else {
      values = _mm512_cvtph_ps(half);
    }
  }
}

template <typename T>
inline void load16(const Copying<T>& s, int64_t j, __m512& values, __m512i& words) {
  if constexpr (sizeof(T) == 4) {
    _mm512_storeu_si512(s.copy + j, _mm512_loadu_si512(s.data + j));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.copy + j),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.data + j)));
  }
  load16(Plain<T>{s.data}, j, values, words);
}

template <typename T>
inline void load16(const Difference<T>& s, int64_t j, __m512& values, __m512i& words) {
  values = _mm512_sub_ps(load16_float(s.a + j), load16_float(s.b + j));
  words = _mm512_castps_si512(values);
}

inline __m512i mix_a16(__m512i v) {
  v = _mm512_mullo_epi32(_mm512_xor_si512(v, _mm512_srli_epi32(v, 16)), _mm512_set1_epi32(static_cast<int>(kMixA)));
  return _mm512_xor_si512(v, _mm512_srli_epi32(v, 13));
}

inline __m512i mix_b16(__m512i v) {
  v = _mm512_mullo_epi32(_mm512_xor_si512(v, _mm512_srli_epi32(v, 15)), _mm512_set1_epi32(static_cast<int>(kMixB)));
  return _mm512_xor_si512(v, _mm512_srli_epi32(v, 16));
}

// The accumulators of one chunk, sixteen vector lanes each.
struct Vector {
  static constexpr int64_t kWidth = 16;
  __m512 sum = _mm512_setzero_ps(), sum_sq = _mm512_setzero_ps();
  __m512d sum_lo = _mm512_setzero_pd(), sum_hi = sum_lo, sq_lo = sum_lo, sq_hi = sum_lo;
  __m512 mx = _mm512_set1_ps(-INFINITY), mn = _mm512_set1_ps(INFINITY);
  __m512i nonfinite = _mm512_setzero_si512(), nan = nonfinite, zero = nonfinite, small = nonfinite,
          over = nonfinite, la = nonfinite, lb = nonfinite;
  __m512i ia = nonfinite, ib = nonfinite, da = nonfinite, db = nonfinite;
  __m512 tiny, largest;
  int64_t since_promote = 0;

  Vector(float tiny_, float largest_) : tiny(_mm512_set1_ps(tiny_)), largest(_mm512_set1_ps(largest_)) {}

  // Start a run of elements whose full indices are base, base + step, ...
  inline void start(uint32_t base, uint32_t step) {
    const __m512i index = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(base)),
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(static_cast<int>(step))));
    ia = _mm512_mullo_epi32(index, _mm512_set1_epi32(static_cast<int>(kIndexA)));
    ib = _mm512_mullo_epi32(index, _mm512_set1_epi32(static_cast<int>(kIndexB)));
    da = _mm512_set1_epi32(static_cast<int>(16u * step * kIndexA));
    db = _mm512_set1_epi32(static_cast<int>(16u * step * kIndexB));
  }

  inline void add(__m512 v, __m512i w) {
    const __m512i one = _mm512_set1_epi32(1);
    la = _mm512_add_epi32(la, mix_a16(_mm512_xor_si512(w, ia)));
    lb = _mm512_add_epi32(lb, mix_b16(_mm512_xor_si512(w, ib)));
    ia = _mm512_add_epi32(ia, da);
    ib = _mm512_add_epi32(ib, db);
    const __m512 mag = _mm512_abs_ps(v);
    zero = _mm512_mask_add_epi32(zero, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ), zero, one);
    small = _mm512_mask_add_epi32(small, _mm512_cmp_ps_mask(mag, tiny, _CMP_LT_OQ), small, one);  // zeros too
    over = _mm512_mask_add_epi32(over, _mm512_cmp_ps_mask(mag, largest, _CMP_GT_OQ), over, one);  // Inf too
    const __mmask16 moderate = _mm512_cmp_ps_mask(mag, _mm512_set1_ps(kModerate), _CMP_LT_OQ);  // not NaN or Inf
    if (__builtin_expect(_kortestc_mask16_u8(moderate, moderate), 1)) {
      sum = _mm512_add_ps(sum, v);
      sum_sq = _mm512_fmadd_ps(v, v, sum_sq);
      mx = _mm512_max_ps(mx, v);
      mn = _mm512_min_ps(mn, v);
    } else {  // NaN, Inf, or a square float32 cannot hold: float64 for these sixteen
      const __mmask16 bad = _mm512_fpclass_ps_mask(v, 0x99);  // QNaN | +Inf | -Inf | SNaN
      const __mmask16 finite = _knot_mask16(bad);
      const __mmask16 is_nan = _mm512_fpclass_ps_mask(v, 0x81);
      nonfinite = _mm512_mask_add_epi32(nonfinite, bad, nonfinite, one);
      nan = _mm512_mask_add_epi32(nan, is_nan, nan, one);
      over = _mm512_mask_sub_epi32(over, _kandn_mask16(is_nan, bad), over, one);  // Inf was counted above
      const __m512 f = _mm512_maskz_mov_ps(finite, v);
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1));
      sum_lo = _mm512_add_pd(sum_lo, lo);
      sum_hi = _mm512_add_pd(sum_hi, hi);
      sq_lo = _mm512_fmadd_pd(lo, lo, sq_lo);
      sq_hi = _mm512_fmadd_pd(hi, hi, sq_hi);
      mx = _mm512_mask_max_ps(mx, finite, mx, v);
      mn = _mm512_mask_min_ps(mn, finite, mn, v);
    }
    if (++since_promote == kAddsPerLane) promote();
  }

  inline void promote() {
    sum_lo = _mm512_add_pd(sum_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(sum)));
    sum_hi = _mm512_add_pd(sum_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sum, 1)));
    sq_lo = _mm512_add_pd(sq_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(sum_sq)));
    sq_hi = _mm512_add_pd(sq_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sum_sq, 1)));
    sum = sum_sq = _mm512_setzero_ps();
    since_promote = 0;
  }

  void fold_into(Partial& out) {
    promote();
    out.sum += _mm512_reduce_add_pd(_mm512_add_pd(sum_lo, sum_hi));
    out.sum_sq += _mm512_reduce_add_pd(_mm512_add_pd(sq_lo, sq_hi));
    const int64_t nonfinite_n = _mm512_reduce_add_epi32(nonfinite), nan_n = _mm512_reduce_add_epi32(nan);
    const int64_t zero_n = _mm512_reduce_add_epi32(zero);
    out.nan += nan_n;
    out.inf += nonfinite_n - nan_n;
    out.zero += zero_n;
    out.under += _mm512_reduce_add_epi32(small) - zero_n;
    out.over += _mm512_reduce_add_epi32(over);
    const double hi = _mm512_reduce_max_ps(mx), lo = _mm512_reduce_min_ps(mn);
    out.max = std::max(out.max, hi);
    out.neg_min = std::max(out.neg_min, -lo);
    out.absmax = std::max(out.absmax, std::max(hi, -lo));  // over finite elements, max |x| = max(max, -min)
    out.lane_a += static_cast<uint32_t>(_mm512_reduce_add_epi32(la));
    out.lane_b += static_cast<uint32_t>(_mm512_reduce_add_epi32(lb));
  }
};

template <typename Source>
inline void load(const Source& s, int64_t j, __m512& values, __m512i& words) { load16(s, j, values, words); }
