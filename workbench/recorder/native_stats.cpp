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
// ``accumulate_copies`` copies each tensor into another as it reads it (a parameter's statistics
// and its start-of-step copy in one read).
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

// The elements of a tensor, each also copied into ``copy`` as it is read.
template <typename T>
struct Copying {
  const T* data;
  T* copy;

  inline void prefetch(int64_t j) const { __builtin_prefetch(reinterpret_cast<const char*>(data + j) + kAhead); }

  inline void scalar(int64_t j, float& value, uint32_t& word) const {
    copy[j] = data[j];
    Plain<T>{data}.scalar(j, value, word);
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

#if defined(WORKBENCH_AVX512)
#include "native_avx512.h"
#elif defined(WORKBENCH_AVX2)
#include "native_avx2.h"
#endif


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
  // fp32's largest finite value is float's own: no finite float exceeds it, while an Inf does (and the
  // vector paths count Inf in `over` first, then take it out with the non-finite values).
  const double float_max = std::numeric_limits<float>::max();
  const float largest_f = static_cast<float>(std::min(largest, float_max));
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
struct CopyingAt {
  const T* data;
  T* copy;
  Copying<T> shifted(int64_t i) const { return {data + i, copy + i}; }
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

// What a pass does with a second tensor ``y``: nothing, subtract it, or copy x into it.
enum class Mode { kPlain, kDifference, kCopy };

template <typename T>
void range_typed(const at::Tensor& x, const at::Tensor& y, Mode mode, const Placement& at, int64_t begin,
                 int64_t end, double tiny, double largest, Partial& out) {
  switch (mode) {
    case Mode::kPlain: range(PlainAt<T>{x.data_ptr<T>()}, at, begin, end, tiny, largest, out); break;
    case Mode::kDifference:
      range(DifferenceAt<T>{x.data_ptr<T>(), y.data_ptr<T>()}, at, begin, end, tiny, largest, out);
      break;
    case Mode::kCopy: range(CopyingAt<T>{x.data_ptr<T>(), y.data_ptr<T>()}, at, begin, end, tiny, largest, out); break;
  }
}

// Flat elements [begin, end) of tensor x (and y, by ``mode``), dispatched on dtype.
void range_of(const at::Tensor& x, const at::Tensor& y, Mode mode, const Placement& at, int64_t begin, int64_t end,
              double tiny, double largest, Partial& out) {
  switch (x.scalar_type()) {
    case at::kFloat: range_typed<float>(x, y, mode, at, begin, end, tiny, largest, out); break;
    case at::kBFloat16: range_typed<c10::BFloat16>(x, y, mode, at, begin, end, tiny, largest, out); break;
    case at::kHalf: range_typed<c10::Half>(x, y, mode, at, begin, end, tiny, largest, out); break;
    case at::kDouble:
      TORCH_CHECK(mode == Mode::kPlain, "float64 tensors are subtracted and copied in torch");
      range_of_doubles(x.data_ptr<double>(), at, begin, end, tiny, largest, out);
      break;
    default: TORCH_CHECK(false, "unsupported dtype for statistics: ", x.scalar_type());
  }
}

// Every tensor's statistics, with one parallel loop over the chunks of all of them: a list of
// small tensors (a model's parameters, the segments of a gradient buffer) costs one call, and
// each tensor's chunks are merged in order, so nothing depends on the thread count.
std::vector<Partial> run(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys, Mode mode,
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
      range_of(xs[t], ys.empty() ? none : ys[t], mode, ats[t], c * kChunk, std::min(xs[t].numel(), (c + 1) * kChunk),
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

void accumulate_all(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& ys, Mode mode,
                    const std::vector<at::Tensor>& coords, double tiny, double largest,
                    const std::vector<at::Tensor>& accs, const std::vector<at::Tensor>& lanes) {
  TORCH_CHECK(xs.size() == coords.size() && xs.size() == accs.size() && xs.size() == lanes.size(),
              "one coords, acc and lanes per tensor");
  TORCH_CHECK(ys.size() == (mode == Mode::kPlain ? 0 : xs.size()), "one second tensor per tensor");
  std::vector<Placement> ats;
  for (size_t k = 0; k < xs.size(); ++k) {
    check_tensor(xs[k]);
    if (!ys.empty()) {
      check_tensor(ys[k]);
      TORCH_CHECK(ys[k].sizes() == xs[k].sizes() && ys[k].scalar_type() == xs[k].scalar_type(),
                  "a difference or a copy needs two tensors of one shape and dtype");
    }
    check_accumulators(accs[k], lanes[k]);
    ats.push_back(placement_of(xs[k], coords[k]));
  }
  const auto totals = run(xs, ys, mode, ats, tiny, largest);
  for (size_t k = 0; k < xs.size(); ++k) {
    add_into(totals[k], xs[k].numel(), accs[k].data_ptr<double>(), lanes[k].data_ptr<int64_t>());
  }
}

void accumulate(at::Tensor x, at::Tensor coords, double tiny, double largest, at::Tensor acc,
                at::Tensor lanes) {
  accumulate_all({x}, {}, Mode::kPlain, {coords}, tiny, largest, {acc}, {lanes});
}

// Tensor k adds into accs[k] (float64 [11]) and lanes[k] (int64 [2]); several k may share accumulators.
void accumulate_many(std::vector<at::Tensor> xs, std::vector<at::Tensor> coords, double tiny, double largest,
                     std::vector<at::Tensor> accs, std::vector<at::Tensor> lanes) {
  accumulate_all(xs, {}, Mode::kPlain, coords, tiny, largest, accs, lanes);
}

// The same for float32(xs[k]) - float32(ys[k]).
void accumulate_differences(std::vector<at::Tensor> xs, std::vector<at::Tensor> ys,
                            std::vector<at::Tensor> coords, double tiny, double largest,
                            std::vector<at::Tensor> accs, std::vector<at::Tensor> lanes) {
  accumulate_all(xs, ys, Mode::kDifference, coords, tiny, largest, accs, lanes);
}

// The same as ``accumulate_many``, copying each xs[k] into copies[k] in the same pass.
void accumulate_copies(std::vector<at::Tensor> xs, std::vector<at::Tensor> copies, std::vector<at::Tensor> coords,
                       double tiny, double largest, std::vector<at::Tensor> accs, std::vector<at::Tensor> lanes) {
  accumulate_all(xs, copies, Mode::kCopy, coords, tiny, largest, accs, lanes);
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
  m.def("accumulate_copies", &accumulate_copies,
        "The same as accumulate_many, copying each tensor into a second list as it is read");
  m.def("instruction_set", &instruction_set, "The vector instructions this build uses: avx512, avx2 or scalar");
}
