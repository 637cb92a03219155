// One-pass statistics and fingerprint lanes of CPU tensors (see workbench/statistics.py).
//
// Reads each element once, keeps every accumulator in registers, and adds the result into
// the caller's accumulators in place:
//   acc  float64 [11]: count, sum, sum_sq, nan, inf, zero, underflow, overflow (added),
//                      max, -min, absmax (maximum)
//   lanes int64 [2]:   fingerprint lane sums (added; only their value mod 2^32 is used)
// The fingerprint words are computed in uint32 arithmetic, which wraps by definition, so
// they are bitwise those of the numpy reference and of the torch paths.
//
// Speed: 8 elements at a time with AVX2 where the build machine has it (the build is per
// machine, -march=native), a scalar loop elsewhere and for tails. A tensor is cut into
// fixed chunks of kChunk elements whatever the thread count; each chunk's partial result
// is kept and the chunks are merged in order, so no statistic depends on how many threads
// ran. Sums are float32 within blocks of kBlock elements (per vector lane) and float64
// across blocks: the error stays ~1e-9 of the sum of |x|.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define WORKBENCH_AVX2 1
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr uint32_t kIndexA = 0x9E3779B9u, kMixA = 0x85EBCA6Bu;
constexpr uint32_t kIndexB = 0x27D4EB2Fu, kMixB = 0xC2B2AE35u;
constexpr int64_t kBlock = 256;        // float32 sums within a block
constexpr int64_t kChunk = 1 << 16;    // the fixed partition over threads

inline uint32_t mix_a(uint32_t v) {
  v = (v ^ (v >> 16)) * kMixA;
  return v ^ (v >> 13);
}

inline uint32_t mix_b(uint32_t v) {
  v = (v ^ (v >> 15)) * kMixB;
  return v ^ (v >> 16);
}

struct Partial {
  double sum = 0, sum_sq = 0;
  int64_t nan = 0, inf = 0, zero = 0, under = 0, over = 0;
  double max = -std::numeric_limits<double>::infinity();
  double neg_min = -std::numeric_limits<double>::infinity();
  double absmax = -std::numeric_limits<double>::infinity();
  uint32_t lane_a = 0, lane_b = 0;

  void merge(const Partial& o) {
    sum += o.sum; sum_sq += o.sum_sq; nan += o.nan; inf += o.inf; zero += o.zero;
    under += o.under; over += o.over;
    max = std::max(max, o.max); neg_min = std::max(neg_min, o.neg_min); absmax = std::max(absmax, o.absmax);
    lane_a += o.lane_a; lane_b += o.lane_b;
  }
};

// Block accumulators in float32 / int32 (one block of at most kBlock elements at a time).
struct Block {
  float sum = 0, sum_sq = 0, mx = -INFINITY, nmn = -INFINITY, amx = -INFINITY;
  int32_t nan = 0, inf = 0, zero = 0, under = 0, over = 0;
  uint32_t la = 0, lb = 0;

  // One element: its value as float and the 32-bit word the lanes read; ``ia`` and ``ib`` are
  // its full index times the lanes' index multipliers.
  inline void add(float v, uint32_t word, uint32_t ia, uint32_t ib, float tiny, float largest) {
    la += mix_a(word ^ ia);
    lb += mix_b(word ^ ib);
    uint32_t fb;
    std::memcpy(&fb, &v, 4);
    const bool nonfinite = (fb & 0x7F800000u) == 0x7F800000u;
    const bool is_nan = (fb & 0x7FFFFFFFu) > 0x7F800000u;
    nan += is_nan;
    inf += nonfinite & !is_nan;
    zero += v == 0.f;
    if (nonfinite) return;
    const float mag = std::fabs(v);
    sum += v;
    sum_sq += v * v;
    under += (mag > 0.f) & (mag < tiny);
    over += mag > largest;
    mx = std::max(mx, v); nmn = std::max(nmn, -v); amx = std::max(amx, mag);
  }

  void fold_into(Partial& out) const {
    out.sum += sum; out.sum_sq += sum_sq; out.nan += nan; out.inf += inf; out.zero += zero;
    out.under += under; out.over += over;
    out.max = std::max(out.max, static_cast<double>(mx));
    out.neg_min = std::max(out.neg_min, static_cast<double>(nmn));
    out.absmax = std::max(out.absmax, static_cast<double>(amx));
    out.lane_a += la; out.lane_b += lb;
  }
};

// The value (as float) and lane word of element j of a 2- or 4-byte type.
template <typename T>
inline void load_scalar(const T* data, int64_t j, float& value, uint32_t& word) {
  if constexpr (std::is_same_v<T, float>) {
    value = data[j];
    std::memcpy(&word, data + j, 4);
  } else {
    value = static_cast<float>(data[j]);
    word = data[j].x;
  }
}

#ifdef WORKBENCH_AVX2
inline __m256i mix_a8(__m256i v) {
  v = _mm256_mullo_epi32(_mm256_xor_si256(v, _mm256_srli_epi32(v, 16)), _mm256_set1_epi32(static_cast<int>(kMixA)));
  return _mm256_xor_si256(v, _mm256_srli_epi32(v, 13));
}

inline __m256i mix_b8(__m256i v) {
  v = _mm256_mullo_epi32(_mm256_xor_si256(v, _mm256_srli_epi32(v, 15)), _mm256_set1_epi32(static_cast<int>(kMixB)));
  return _mm256_xor_si256(v, _mm256_srli_epi32(v, 16));
}

// Eight lanes of block accumulators, folded into ``out`` lane by lane.
struct Lanes8 {
  __m256 sum, sum_sq, mx, nmn, amx;
  __m256i nan, inf, zero, under, over, la, lb;

  void fold_into(Block& out) const {
    alignas(32) float f[5][8];
    alignas(32) int32_t c[5][8];
    alignas(32) uint32_t l[2][8];
    const __m256 floats[5] = {sum, sum_sq, mx, nmn, amx};
    const __m256i counts[5] = {nan, inf, zero, under, over};
    for (int i = 0; i < 5; ++i) {
      _mm256_store_ps(f[i], floats[i]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(c[i]), counts[i]);
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(l[0]), la);
    _mm256_store_si256(reinterpret_cast<__m256i*>(l[1]), lb);
    for (int k = 0; k < 8; ++k) {
      out.sum += f[0][k]; out.sum_sq += f[1][k];
      out.mx = std::max(out.mx, f[2][k]); out.nmn = std::max(out.nmn, f[3][k]); out.amx = std::max(out.amx, f[4][k]);
      out.nan += c[0][k]; out.inf += c[1][k]; out.zero += c[2][k]; out.under += c[3][k]; out.over += c[4][k];
      out.la += l[0][k]; out.lb += l[1][k];
    }
  }
};

// Eight elements at once: values and lane words of elements j .. j+7.
template <typename T>
inline void load8(const T* data, int64_t j, __m256& values, __m256i& words) {
  if constexpr (std::is_same_v<T, float>) {
    values = _mm256_loadu_ps(data + j);
    words = _mm256_castps_si256(values);
  } else {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + j));
    words = _mm256_cvtepu16_epi32(half);
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      values = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));  // bf16 is the top half of a float
    } else {
      values = _mm256_cvtph_ps(half);
    }
  }
}

// The fingerprint lanes of eight consecutive elements: their full indices times the lanes'
// multipliers advance by 8 * step * multiplier per iteration, so no multiply per element.
struct FingerprintLanes8 {
  __m256i ia, ib, da, db;

  FingerprintLanes8(uint32_t base, uint32_t step) {
    const __m256i index = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)),
                                           _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                              _mm256_set1_epi32(static_cast<int>(step))));
    ia = _mm256_mullo_epi32(index, _mm256_set1_epi32(static_cast<int>(kIndexA)));
    ib = _mm256_mullo_epi32(index, _mm256_set1_epi32(static_cast<int>(kIndexB)));
    da = _mm256_set1_epi32(static_cast<int>(8u * step * kIndexA));
    db = _mm256_set1_epi32(static_cast<int>(8u * step * kIndexB));
  }

  // Add the words ``w`` of the next eight elements into the lane sums and move on.
  inline void add(__m256i w, __m256i& la, __m256i& lb) {
    la = _mm256_add_epi32(la, mix_a8(_mm256_xor_si256(w, ia)));
    lb = _mm256_add_epi32(lb, mix_b8(_mm256_xor_si256(w, ib)));
    ia = _mm256_add_epi32(ia, da);
    ib = _mm256_add_epi32(ib, db);
  }
};

// The lane sums and finite statistics of elements [0, n) (n a multiple of 8) of a row segment
// whose first element has full index ``base`` and whose elements are ``step`` apart in the full
// index, assuming every element is finite; returns false (and leaves ``out`` as it was) when
// one is not, for ``masked_block`` to redo the block. Underflows are counted as |x| < tiny
// minus the zeros.
template <typename T>
bool finite_block(const T* data, int64_t n, uint32_t base, uint32_t step, float tiny, float largest, Block& out) {
  FingerprintLanes8 lanes(base, step);
  const __m256i exponent = _mm256_set1_epi32(0x7F800000);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 zero = _mm256_setzero_ps();
  const __m256 tiny8 = _mm256_set1_ps(tiny), largest8 = _mm256_set1_ps(largest);
  __m256i la = _mm256_setzero_si256(), lb = la, c_zero = la, c_small = la, c_over = la, nonfinite = la;
  __m256 sum = zero, sum_sq = zero, mx = _mm256_set1_ps(-INFINITY), mn = _mm256_set1_ps(INFINITY), amx = mx;
  for (int64_t j = 0; j < n; j += 8) {
    __m256 v;
    __m256i w;
    load8(data, j, v, w);
    lanes.add(w, la, lb);
    const __m256i bits = _mm256_castps_si256(v);
    nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent));
    const __m256 mag = _mm256_and_ps(v, abs_mask);
    sum = _mm256_add_ps(sum, v);
    sum_sq = _mm256_fmadd_ps(v, v, sum_sq);
    c_zero = _mm256_sub_epi32(c_zero, _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_EQ_OQ)));  // -1 where true
    c_small = _mm256_sub_epi32(c_small, _mm256_castps_si256(_mm256_cmp_ps(mag, tiny8, _CMP_LT_OQ)));
    c_over = _mm256_sub_epi32(c_over, _mm256_castps_si256(_mm256_cmp_ps(mag, largest8, _CMP_GT_OQ)));
    mx = _mm256_max_ps(mx, v);
    mn = _mm256_min_ps(mn, v);
    amx = _mm256_max_ps(amx, mag);
  }
  if (!_mm256_testz_si256(nonfinite, nonfinite)) return false;
  const __m256i none = _mm256_setzero_si256();
  Lanes8{sum, sum_sq, mx, _mm256_sub_ps(zero, mn), amx, none, none, c_zero, _mm256_sub_epi32(c_small, c_zero), c_over,
         la, lb}.fold_into(out);
  return true;
}

// The same for a block that holds NaN or Inf: every element masked by its finiteness.
template <typename T>
void masked_block(const T* data, int64_t n, uint32_t base, uint32_t step, float tiny, float largest, Block& out) {
  FingerprintLanes8 lanes(base, step);
  const __m256i exponent = _mm256_set1_epi32(0x7F800000);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256 zero = _mm256_setzero_ps(), neg_inf = _mm256_set1_ps(-INFINITY);
  const __m256 tiny8 = _mm256_set1_ps(tiny), largest8 = _mm256_set1_ps(largest);
  __m256i la = _mm256_setzero_si256(), lb = _mm256_setzero_si256();
  __m256i c_nan = la, c_inf = la, c_zero = la, c_under = la, c_over = la;
  __m256 sum = zero, sum_sq = zero, mx = neg_inf, nmn = neg_inf, amx = neg_inf;
  for (int64_t j = 0; j < n; j += 8) {
    __m256 v;
    __m256i w;
    load8(data, j, v, w);
    lanes.add(w, la, lb);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i magnitude_bits = _mm256_and_si256(bits, abs_mask);
    const __m256i nonfinite = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
    const __m256i is_nan = _mm256_cmpgt_epi32(magnitude_bits, exponent);
    c_nan = _mm256_sub_epi32(c_nan, is_nan);  // masks are -1 where true
    c_inf = _mm256_sub_epi32(c_inf, _mm256_andnot_si256(is_nan, nonfinite));
    c_zero = _mm256_sub_epi32(c_zero, _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_EQ_OQ)));
    const __m256 finite_mask = _mm256_castsi256_ps(_mm256_xor_si256(nonfinite, _mm256_set1_epi32(-1)));
    const __m256 f = _mm256_and_ps(v, finite_mask);                     // non-finite -> 0
    const __m256 mag = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(f), abs_mask));
    sum = _mm256_add_ps(sum, f);
    sum_sq = _mm256_fmadd_ps(f, f, sum_sq);
    const __m256 positive = _mm256_cmp_ps(mag, zero, _CMP_GT_OQ);
    c_under = _mm256_sub_epi32(c_under, _mm256_castps_si256(_mm256_and_ps(positive,
                                                                          _mm256_cmp_ps(mag, tiny8, _CMP_LT_OQ))));
    c_over = _mm256_sub_epi32(c_over, _mm256_castps_si256(_mm256_cmp_ps(mag, largest8, _CMP_GT_OQ)));
    const __m256 nonfinite_ps = _mm256_castsi256_ps(nonfinite);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(v, neg_inf, nonfinite_ps));
    nmn = _mm256_max_ps(nmn, _mm256_blendv_ps(_mm256_sub_ps(zero, v), neg_inf, nonfinite_ps));
    amx = _mm256_max_ps(amx, _mm256_blendv_ps(mag, neg_inf, nonfinite_ps));
  }
  Lanes8{sum, sum_sq, mx, nmn, amx, c_nan, c_inf, c_zero, c_under, c_over, la, lb}.fold_into(out);
}
#endif

// A row segment of 2- or 4-byte elements, block by block.
template <typename T>
void segment(const T* data, int64_t n, uint32_t base, uint32_t step, float tiny, float largest, Partial& out) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t m = std::min(kBlock, n - b0);
    const uint32_t b = base + static_cast<uint32_t>(b0) * step;
    Block block;
    int64_t j = 0;
#ifdef WORKBENCH_AVX2
    const int64_t vectorised = m & ~int64_t{7};
    if (vectorised && !finite_block(data + b0, vectorised, b, step, tiny, largest, block)) {
      masked_block(data + b0, vectorised, b, step, tiny, largest, block);
    }
    j = vectorised;
#endif
    for (; j < m; ++j) {
      float v;
      uint32_t w;
      load_scalar(data + b0, j, v, w);
      const uint32_t index = b + static_cast<uint32_t>(j) * step;
      block.add(v, w, index * kIndexA, index * kIndexB, tiny, largest);
    }
    block.fold_into(out);
  }
}

// float64 elements: lane A reads the low word, lane B the high word; plain scalar loop.
void segment(const double* data, int64_t n, uint32_t base, uint32_t step, double tiny, double largest,
             Partial& out) {
  for (int64_t j = 0; j < n; ++j) {
    uint64_t bits;
    std::memcpy(&bits, data + j, 8);
    const uint32_t index = base + static_cast<uint32_t>(j) * step;
    out.lane_a += mix_a(static_cast<uint32_t>(bits) ^ (index * kIndexA));
    out.lane_b += mix_b(static_cast<uint32_t>(bits >> 32) ^ (index * kIndexB));
    const double v = data[j];
    out.nan += std::isnan(v);
    out.inf += std::isinf(v);
    out.zero += v == 0.0;
    if (!std::isfinite(v)) continue;
    const double mag = std::fabs(v);
    out.sum += v; out.sum_sq += v * v;
    out.under += (mag > 0.0) & (mag < tiny);
    out.over += mag > largest;
    out.max = std::max(out.max, v); out.neg_min = std::max(out.neg_min, -v); out.absmax = std::max(out.absmax, mag);
  }
}

// Where a tensor's elements sit in the full tensor: per dimension, offset and stride.
struct Placement {
  std::vector<int64_t> sizes, offset, stride;

  // The full index of flat element i (row r, column j of the innermost dimension).
  uint32_t base(int64_t r, int64_t j) const {
    const int64_t ndim = static_cast<int64_t>(sizes.size());
    if (!ndim) return 0;
    uint32_t b = static_cast<uint32_t>((j + offset[ndim - 1]) * stride[ndim - 1]);
    int64_t rest = r;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t pos = rest % sizes[d];
      rest /= sizes[d];
      b += static_cast<uint32_t>((pos + offset[d]) * stride[d]);
    }
    return b;
  }
};

// Flat elements [begin, end) of ``data``, cut into row segments of the innermost dimension.
template <typename T>
void range(const T* data, const Placement& at, int64_t begin, int64_t end, double tiny, double largest,
           Partial& out) {
  const int64_t ndim = static_cast<int64_t>(at.sizes.size());
  const int64_t inner = ndim ? at.sizes[ndim - 1] : 1;
  const uint32_t step = ndim ? static_cast<uint32_t>(at.stride[ndim - 1]) : 0;
  int64_t i = begin;
  while (i < end) {
    const int64_t r = i / inner, j = i % inner;
    const int64_t n = std::min(end - i, inner - j);
    if constexpr (std::is_same_v<T, double>) {
      segment(data + i, n, at.base(r, j), step, tiny, largest, out);
    } else {
      const float tiny_f = static_cast<float>(tiny);
      const float largest_f = largest >= 3.4028234663852886e38 ? INFINITY : static_cast<float>(largest);
      segment(data + i, n, at.base(r, j), step, tiny_f, largest_f, out);
    }
    i += n;
  }
}

// Flat elements [begin, end) of tensor x, dispatched on its dtype.
void range_of(const torch::Tensor& x, const Placement& at, int64_t begin, int64_t end, double tiny,
              double largest, Partial& out) {
  switch (x.scalar_type()) {
    case torch::kFloat32: range(x.data_ptr<float>(), at, begin, end, tiny, largest, out); break;
    case torch::kBFloat16: range(x.data_ptr<c10::BFloat16>(), at, begin, end, tiny, largest, out); break;
    case torch::kFloat16: range(x.data_ptr<c10::Half>(), at, begin, end, tiny, largest, out); break;
    case torch::kFloat64: range(x.data_ptr<double>(), at, begin, end, tiny, largest, out); break;
    default: TORCH_CHECK(false, "unsupported dtype for statistics: ", x.scalar_type());
  }
}

// Every tensor's statistics, with one parallel loop over the chunks of all of them: a list of
// small tensors (a model's parameters, the segments of a gradient buffer) costs one call, and
// each tensor's chunks are merged in order, so nothing depends on the thread count.
std::vector<Partial> run(const std::vector<torch::Tensor>& xs, const std::vector<Placement>& ats, double tiny,
                         double largest) {
  std::vector<std::pair<int64_t, int64_t>> units;  // (tensor, chunk)
  for (int64_t t = 0; t < static_cast<int64_t>(xs.size()); ++t) {
    const int64_t chunks = (xs[t].numel() + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) units.emplace_back(t, c);
  }
  std::vector<Partial> parts(units.size());
  at::parallel_for(0, static_cast<int64_t>(units.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t u = first; u < last; ++u) {
      const auto [t, c] = units[u];
      range_of(xs[t], ats[t], c * kChunk, std::min(xs[t].numel(), (c + 1) * kChunk), tiny, largest, parts[u]);
    }
  });
  std::vector<Partial> totals(xs.size());
  for (size_t u = 0; u < units.size(); ++u) totals[units[u].first].merge(parts[u]);  // in chunk order
  return totals;
}

Placement placement_of(const torch::Tensor& x, const torch::Tensor& coords) {
  auto c = coords.to(torch::kInt64).contiguous();
  TORCH_CHECK(c.dim() == 2 && c.size(0) == x.dim() && c.size(1) == 2, "coords must be [ndim, 2]");
  auto ca = c.accessor<int64_t, 2>();
  Placement at;
  for (int64_t d = 0; d < x.dim(); ++d) {
    at.sizes.push_back(x.size(d));
    at.offset.push_back(ca[d][0]);
    at.stride.push_back(ca[d][1]);
  }
  return at;
}

void add_into(const Partial& p, int64_t numel, double* a, int64_t* l) {
  a[0] += static_cast<double>(numel); a[1] += p.sum; a[2] += p.sum_sq; a[3] += p.nan; a[4] += p.inf;
  a[5] += p.zero; a[6] += p.under; a[7] += p.over;
  a[8] = std::max(a[8], p.max); a[9] = std::max(a[9], p.neg_min); a[10] = std::max(a[10], p.absmax);
  l[0] += p.lane_a; l[1] += p.lane_b;
}

void check_tensor(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "native statistics need a contiguous CPU tensor");
}

void accumulate(torch::Tensor x, torch::Tensor coords, double tiny, double largest, torch::Tensor acc,
                torch::Tensor lanes) {
  check_tensor(x);
  TORCH_CHECK(acc.scalar_type() == torch::kFloat64 && acc.numel() == 11, "acc must be float64[11]");
  TORCH_CHECK(lanes.scalar_type() == torch::kInt64 && lanes.numel() == 2, "lanes must be int64[2]");
  const auto totals = run({x}, {placement_of(x, coords)}, tiny, largest);
  add_into(totals[0], x.numel(), acc.data_ptr<double>(), lanes.data_ptr<int64_t>());
}

// Tensor k adds into accs[k] (float64 [11]) and lanes[k] (int64 [2]); several k may share accumulators.
void accumulate_many(std::vector<torch::Tensor> xs, std::vector<torch::Tensor> coords, double tiny, double largest,
                     std::vector<torch::Tensor> accs, std::vector<torch::Tensor> lanes) {
  TORCH_CHECK(xs.size() == coords.size() && xs.size() == accs.size() && xs.size() == lanes.size(),
              "one coords, acc and lanes per tensor");
  std::vector<Placement> ats;
  for (size_t k = 0; k < xs.size(); ++k) {
    check_tensor(xs[k]);
    TORCH_CHECK(accs[k].scalar_type() == torch::kFloat64 && accs[k].numel() == 11, "acc must be float64[11]");
    TORCH_CHECK(lanes[k].scalar_type() == torch::kInt64 && lanes[k].numel() == 2, "lanes must be int64[2]");
    ats.push_back(placement_of(xs[k], coords[k]));
  }
  const auto totals = run(xs, ats, tiny, largest);
  for (size_t k = 0; k < xs.size(); ++k) {
    add_into(totals[k], xs[k].numel(), accs[k].data_ptr<double>(), lanes[k].data_ptr<int64_t>());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("accumulate", &accumulate, "Add one tensor's statistics and fingerprint lanes into accumulators");
  m.def("accumulate_many", &accumulate_many, "The same for a list of tensors, in one parallel pass");
}
