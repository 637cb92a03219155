// One-pass statistics and fingerprint lanes of CPU tensors (see workbench/statistics.py).
//
// Reads each element once and adds the result into the caller's accumulators in place:
//   acc  float64 [11]: count, sum, sum_sq, nan, inf, zero, underflow, overflow (added),
//                      max, -min, absmax (maximum)
//   lanes int64 [2]:   fingerprint lane sums (added; only their value mod 2^32 is used)
// The fingerprint words are computed in uint32 arithmetic, which wraps by definition, so
// they are bitwise those of the numpy reference and of the torch paths.
//
// Speed: 16 elements at a time with AVX-512 (F + DQ), 8 with AVX2 where the build machine
// has it (the build is per machine, -march=native), a scalar loop elsewhere and for tails.
// Every accumulator stays in a vector register for a whole chunk; the float32 sums move into
// float64 every kAddsPerLane vectors (so at most 8 float32 roundings per lane: an error below
// 8 * 2^-24 of the sum of |x|, ~1e-9 of it typically), and the lanes are folded once per chunk. Dimensions that are consecutive in the full tensor's index are
// collapsed, so a whole tensor (or a column-parallel shard) is one run of indices. A tensor is
// cut into fixed chunks of kChunk elements whatever the thread count, and the chunks' results
// merge in order, so no statistic depends on how many threads ran.
//
// ``accumulate_differences`` reads two tensors and takes the statistics of float32(a) -
// float32(b), element by element, without materialising it: exactly the float32 tensor the
// subtraction would give (IEEE subtraction is correctly rounded), so the same fingerprint.
// Only what the kernel needs (torch/extension.h would triple the build time).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define WORKBENCH_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define WORKBENCH_AVX2 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr uint32_t kIndexA = 0x9E3779B9u, kMixA = 0x85EBCA6Bu;
constexpr uint32_t kIndexB = 0x27D4EB2Fu, kMixB = 0xC2B2AE35u;
constexpr int64_t kAddsPerLane = 8;    // float32 sums over this many vectors, then float64
constexpr float kModerate = 0x1p60f;   // below this, eight squares add up in float32 without overflow
constexpr int64_t kChunk = 1 << 14;    // the fixed partition over threads (a 64 KiB fp32 piece)
constexpr int64_t kAhead = 32768;  // bytes read ahead: the hardware prefetcher falls behind a pass this slow

inline uint32_t mix_a(uint32_t v) {
  v = (v ^ (v >> 16)) * kMixA;
  return v ^ (v >> 13);
}

inline uint32_t mix_b(uint32_t v) {
  v = (v ^ (v >> 15)) * kMixB;
  return v ^ (v >> 16);
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Partial {
  double sum = 0, sum_sq = 0;
  int64_t nan = 0, inf = 0, zero = 0, under = 0, over = 0;
  double max = kNegInf, neg_min = kNegInf, absmax = kNegInf;
  uint32_t lane_a = 0, lane_b = 0;

  void merge(const Partial& o) {
    sum += o.sum; sum_sq += o.sum_sq; nan += o.nan; inf += o.inf; zero += o.zero;
    under += o.under; over += o.over;
    max = std::max(max, o.max); neg_min = std::max(neg_min, o.neg_min); absmax = std::max(absmax, o.absmax);
    lane_a += o.lane_a; lane_b += o.lane_b;
  }

  // One element: its value, the 32-bit word the lanes read, and its full index.
  template <typename F>
  inline void add(F v, uint32_t word_a, uint32_t word_b, uint32_t index, F tiny, F largest) {
    lane_a += mix_a(word_a ^ (index * kIndexA));
    lane_b += mix_b(word_b ^ (index * kIndexB));
    zero += v == F(0);
    if (std::isnan(v)) { ++nan; return; }
    if (std::isinf(v)) { ++inf; return; }
    const F mag = std::fabs(v);
    sum += static_cast<double>(v);
    sum_sq += static_cast<double>(v) * static_cast<double>(v);
    under += (mag > F(0)) & (mag < tiny);
    over += mag > largest;
    max = std::max(max, static_cast<double>(v));
    neg_min = std::max(neg_min, -static_cast<double>(v));
    absmax = std::max(absmax, static_cast<double>(mag));
  }
};

// -- element sources: a tensor's elements, or the float32 difference of two tensors' --------

inline uint32_t float_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

inline float float_of_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

template <typename T>
inline float to_float(T v) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    // A NaN keeps its payload, quieted, as the vector conversion and numpy do (c10's scalar
    // conversion gives 0x7FFFFFFF): the tail of a tensor fingerprints like its vector part.
    if ((v.x & 0x7C00u) == 0x7C00u && (v.x & 0x03FFu)) {
      return float_of_bits((static_cast<uint32_t>(v.x & 0x8000u) << 16) | 0x7FC00000u |
                           (static_cast<uint32_t>(v.x & 0x03FFu) << 13));
    }
  }
  return static_cast<float>(v);
}

// Elements of a 2- or 4-byte float tensor: the lanes read the element's own bits.
template <typename T>
struct Plain {
  const T* data;

  inline void prefetch(int64_t j) const { __builtin_prefetch(reinterpret_cast<const char*>(data + j) + kAhead); }

  inline void scalar(int64_t j, float& value, uint32_t& word) const {
    value = to_float(data[j]);
    if constexpr (std::is_same_v<T, float>) {
      word = float_bits(value);
    } else {
      word = data[j].x;
    }
  }
};

// float32(a[j]) - float32(b[j]): the lanes read the difference's bits.
template <typename T>
struct Difference {
  const T* a;
  const T* b;

  inline void prefetch(int64_t j) const {
    __builtin_prefetch(reinterpret_cast<const char*>(a + j) + kAhead);
    __builtin_prefetch(reinterpret_cast<const char*>(b + j) + kAhead);
  }

  inline void scalar(int64_t j, float& value, uint32_t& word) const {
    value = to_float(a[j]) - to_float(b[j]);
    word = float_bits(value);
  }
};

#ifdef WORKBENCH_AVX512
// -- 16 elements at a time -------------------------------------------------------------------

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

inline double sum16(__m512 v) {
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                                            _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1))));
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
#endif  // WORKBENCH_AVX512

#ifdef WORKBENCH_AVX2
// -- 8 elements at a time --------------------------------------------------------------------

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
#endif  // WORKBENCH_AVX2

// -- runs of elements ------------------------------------------------------------------------

// Elements [0, n) of a source whose element j has full index base + j * step (2- and 4-byte
// types, and differences): vector lanes into ``vec``, the tail into ``out``.
#if defined(WORKBENCH_AVX512) || defined(WORKBENCH_AVX2)
template <typename Source>
void run_of(const Source& s, int64_t n, uint32_t base, uint32_t step, float tiny, float largest, Vector& vec,
            Partial& out) {
  const int64_t vectorised = n - n % Vector::kWidth;
  if (vectorised) {
    vec.start(base, step);
    for (int64_t j = 0; j < vectorised; j += Vector::kWidth) {
      decltype(vec.sum) v;
      decltype(vec.la) w;
      s.prefetch(j);
      load(s, j, v, w);
      vec.add(v, w);
    }
  }
  for (int64_t j = vectorised; j < n; ++j) {
    float v;
    uint32_t w;
    s.scalar(j, v, w);
    out.add(v, w, w, base + static_cast<uint32_t>(j) * step, tiny, largest);
  }
}
#else
struct Vector {
  Vector(float, float) {}
  void fold_into(Partial&) {}
};

template <typename Source>
void run_of(const Source& s, int64_t n, uint32_t base, uint32_t step, float tiny, float largest, Vector&,
            Partial& out) {
  for (int64_t j = 0; j < n; ++j) {
    float v;
    uint32_t w;
    s.scalar(j, v, w);
    out.add(v, w, w, base + static_cast<uint32_t>(j) * step, tiny, largest);
  }
}
#endif

// float64 elements: lane A reads the low word, lane B the high word; plain scalar loop.
void run_of_doubles(const double* data, int64_t n, uint32_t base, uint32_t step, double tiny, double largest,
                    Partial& out) {
  for (int64_t j = 0; j < n; ++j) {
    uint64_t bits;
    std::memcpy(&bits, data + j, 8);
    out.add(data[j], static_cast<uint32_t>(bits), static_cast<uint32_t>(bits >> 32),
            base + static_cast<uint32_t>(j) * step, tiny, largest);
  }
}

// Where a tensor's elements sit in the full tensor: per dimension, size, offset and stride
// (offsets and strides modulo 2^32, as the full index is).
struct Placement {
  std::vector<int64_t> sizes;
  std::vector<uint32_t> offset, stride;

  // The full index of the element at row r (over every dimension but the last), column j.
  uint32_t base(int64_t r, int64_t j) const {
    const int64_t ndim = static_cast<int64_t>(sizes.size());
    if (!ndim) return 0;
    uint32_t b = (static_cast<uint32_t>(j) + offset[ndim - 1]) * stride[ndim - 1];
    int64_t rest = r;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t pos = rest % sizes[d];
      rest /= sizes[d];
      b += (static_cast<uint32_t>(pos) + offset[d]) * stride[d];
    }
    return b;
  }
};

// Flat elements [begin, end), cut into runs along the last dimension.
template <typename Source>
void range(const Source& s, const Placement& at, int64_t begin, int64_t end, double tiny, double largest,
           Partial& out) {
  const int64_t ndim = static_cast<int64_t>(at.sizes.size());
  const int64_t inner = ndim ? at.sizes[ndim - 1] : 1;
  const uint32_t step = ndim ? at.stride[ndim - 1] : 0;
  const float tiny_f = static_cast<float>(tiny);
  const float largest_f = largest >= 3.4028234663852886e38 ? INFINITY : static_cast<float>(largest);
  Vector vec(tiny_f, largest_f);
  for (int64_t i = begin; i < end;) {
    const int64_t r = i / inner, j = i % inner;
    const int64_t n = std::min(end - i, inner - j);
    run_of(s.shifted(i), n, at.base(r, j), step, tiny_f, largest_f, vec, out);
    i += n;
  }
  vec.fold_into(out);
}

template <typename T>
struct PlainAt {
  const T* data;
  Plain<T> shifted(int64_t i) const { return {data + i}; }
};

template <typename T>
struct DifferenceAt {
  const T* a;
  const T* b;
  Difference<T> shifted(int64_t i) const { return {a + i, b + i}; }
};

void range_of_doubles(const double* data, const Placement& at, int64_t begin, int64_t end, double tiny,
                      double largest, Partial& out) {
  const int64_t ndim = static_cast<int64_t>(at.sizes.size());
  const int64_t inner = ndim ? at.sizes[ndim - 1] : 1;
  const uint32_t step = ndim ? at.stride[ndim - 1] : 0;
  for (int64_t i = begin; i < end;) {
    const int64_t r = i / inner, j = i % inner;
    const int64_t n = std::min(end - i, inner - j);
    run_of_doubles(data + i, n, at.base(r, j), step, tiny, largest, out);
    i += n;
  }
}

// Flat elements [begin, end) of tensor x (minus ``y`` when it is defined), dispatched on dtype.
void range_of(const at::Tensor& x, const at::Tensor& y, const Placement& at, int64_t begin, int64_t end,
              double tiny, double largest, Partial& out) {
  const bool diff = y.defined();
  switch (x.scalar_type()) {
    case at::kFloat:
      if (diff) range(DifferenceAt<float>{x.data_ptr<float>(), y.data_ptr<float>()}, at, begin, end, tiny, largest,
                      out);
      else range(PlainAt<float>{x.data_ptr<float>()}, at, begin, end, tiny, largest, out);
      break;
    case at::kBFloat16:
      if (diff) range(DifferenceAt<c10::BFloat16>{x.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>()}, at,
                      begin, end, tiny, largest, out);
      else range(PlainAt<c10::BFloat16>{x.data_ptr<c10::BFloat16>()}, at, begin, end, tiny, largest, out);
      break;
    case at::kHalf:
      if (diff) range(DifferenceAt<c10::Half>{x.data_ptr<c10::Half>(), y.data_ptr<c10::Half>()}, at, begin, end,
                      tiny, largest, out);
      else range(PlainAt<c10::Half>{x.data_ptr<c10::Half>()}, at, begin, end, tiny, largest, out);
      break;
    case at::kDouble:
      TORCH_CHECK(!diff, "differences of float64 tensors are taken in torch");
      range_of_doubles(x.data_ptr<double>(), at, begin, end, tiny, largest, out);
      break;
    default: TORCH_CHECK(false, "unsupported dtype for statistics: ", x.scalar_type());
  }
}

// Every tensor's statistics, with one parallel loop over the chunks of all of them: a list of
// small tensors (a model's parameters, the segments of a gradient buffer) costs one call, and
// each tensor's chunks are merged in order, so nothing depends on the thread count.
std::vector<Partial> run(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys,
                         const std::vector<Placement>& ats, double tiny, double largest) {
  std::vector<std::pair<int64_t, int64_t>> units;  // (tensor, chunk)
  for (int64_t t = 0; t < static_cast<int64_t>(xs.size()); ++t) {
    const int64_t chunks = (xs[t].numel() + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) units.emplace_back(t, c);
  }
  std::vector<Partial> parts(units.size());
  const at::Tensor none;
  at::parallel_for(0, static_cast<int64_t>(units.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const auto [t, c] = units[u];
      range_of(xs[t], ys.empty() ? none : ys[t], ats[t], c * kChunk, std::min(xs[t].numel(), (c + 1) * kChunk),
               tiny, largest, parts[u]);
    }
  });
  std::vector<Partial> totals(xs.size());
  for (size_t u = 0; u < units.size(); ++u) totals[units[u].first].merge(parts[u]);  // in chunk order
  return totals;
}

// The placement of x from coords (int32 [ndim, 2]: offset, stride), with every dimension whose
// stride is the size times the stride of the next one merged into it: the same full indices,
// in longer runs (a whole tensor is one run).
Placement placement_of(const at::Tensor& x, const at::Tensor& coords) {
  TORCH_CHECK(coords.scalar_type() == at::kInt && coords.dim() == 2 && coords.size(0) == x.dim() &&
              coords.size(1) == 2, "coords must be int32 [ndim, 2]");
  const auto c = coords.contiguous();
  const int32_t* rows = c.data_ptr<int32_t>();
  Placement at;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t size = x.size(d);
    const uint32_t offset = static_cast<uint32_t>(rows[2 * d]), stride = static_cast<uint32_t>(rows[2 * d + 1]);
    if (!at.sizes.empty() && at.stride.back() == static_cast<uint32_t>(size) * stride) {
      // (p + o) * n * s + (q + o') * s  ==  (p * n + q + o * n + o') * s  (mod 2^32)
      at.sizes.back() *= size;
      at.offset.back() = at.offset.back() * static_cast<uint32_t>(size) + offset;
      at.stride.back() = stride;
    } else {
      at.sizes.push_back(size);
      at.offset.push_back(offset);
      at.stride.push_back(stride);
    }
  }
  return at;
}

void add_into(const Partial& p, int64_t numel, double* a, int64_t* l) {
  a[0] += static_cast<double>(numel); a[1] += p.sum; a[2] += p.sum_sq; a[3] += p.nan; a[4] += p.inf;
  a[5] += p.zero; a[6] += p.under; a[7] += p.over;
  a[8] = std::max(a[8], p.max); a[9] = std::max(a[9], p.neg_min); a[10] = std::max(a[10], p.absmax);
  l[0] += p.lane_a; l[1] += p.lane_b;
}

void check_tensor(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "native statistics need a contiguous CPU tensor");
}

void check_accumulators(const at::Tensor& acc, const at::Tensor& lanes) {
  TORCH_CHECK(acc.scalar_type() == at::kDouble && acc.numel() == 11 && acc.is_contiguous(),
              "acc must be float64[11]");
  TORCH_CHECK(lanes.scalar_type() == at::kLong && lanes.numel() == 2 && lanes.is_contiguous(),
              "lanes must be int64[2]");
}

void accumulate_all(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys,
                    const std::vector<at::Tensor>& coords, double tiny, double largest,
                    const std::vector<at::Tensor>& accs, const std::vector<at::Tensor>& lanes) {
  TORCH_CHECK(xs.size() == coords.size() && xs.size() == accs.size() && xs.size() == lanes.size(),
              "one coords, acc and lanes per tensor");
  TORCH_CHECK(ys.empty() || ys.size() == xs.size(), "one tensor to subtract per tensor");
  std::vector<Placement> ats;
  for (size_t k = 0; k < xs.size(); ++k) {
    check_tensor(xs[k]);
    if (!ys.empty()) {
      check_tensor(ys[k]);
      TORCH_CHECK(ys[k].sizes() == xs[k].sizes() && ys[k].scalar_type() == xs[k].scalar_type(),
                  "a difference needs two tensors of one shape and dtype");
    }
    check_accumulators(accs[k], lanes[k]);
    ats.push_back(placement_of(xs[k], coords[k]));
  }
  const auto totals = run(xs, ys, ats, tiny, largest);
  for (size_t k = 0; k < xs.size(); ++k) {
    add_into(totals[k], xs[k].numel(), accs[k].data_ptr<double>(), lanes[k].data_ptr<int64_t>());
  }
}

void accumulate(at::Tensor x, at::Tensor coords, double tiny, double largest, at::Tensor acc,
                at::Tensor lanes) {
  accumulate_all({x}, {}, {coords}, tiny, largest, {acc}, {lanes});
}

// Tensor k adds into accs[k] (float64 [11]) and lanes[k] (int64 [2]); several k may share accumulators.
void accumulate_many(std::vector<at::Tensor> xs, std::vector<at::Tensor> coords, double tiny, double largest,
                     std::vector<at::Tensor> accs, std::vector<at::Tensor> lanes) {
  accumulate_all(xs, {}, coords, tiny, largest, accs, lanes);
}

// The same for float32(xs[k]) - float32(ys[k]).
void accumulate_differences(std::vector<at::Tensor> xs, std::vector<at::Tensor> ys,
                            std::vector<at::Tensor> coords, double tiny, double largest,
                            std::vector<at::Tensor> accs, std::vector<at::Tensor> lanes) {
  accumulate_all(xs, ys, coords, tiny, largest, accs, lanes);
}

std::string instruction_set() {
#if defined(WORKBENCH_AVX512)
  return "avx512";
#elif defined(WORKBENCH_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("accumulate", &accumulate, "Add one tensor's statistics and fingerprint lanes into accumulators");
  m.def("accumulate_many", &accumulate_many, "The same for a list of tensors, in one parallel pass");
  m.def("accumulate_differences", &accumulate_differences,
        "The same for the float32 differences of two lists of tensors, element by element");
  m.def("instruction_set", &instruction_set, "The vector instructions this build uses: avx512, avx2 or scalar");
}
