// One-pass statistics and fingerprint lanes of a CPU tensor (see workbench/statistics.py).
//
// Reads each element once, keeps every accumulator in registers, and adds the result into
// the caller's accumulators in place:
//   acc  float64 [11]: count, sum, sum_sq, nan, inf, zero, underflow, overflow (added),
//                      max, -min, absmax (maximum)
//   lanes int64 [2]:   fingerprint lane sums (added; only their value mod 2^32 is used)
// The fingerprint words are computed in uint32 arithmetic, which wraps by definition, so
// they are bitwise those of the numpy reference and of the torch paths.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr uint32_t kIndexA = 0x9E3779B9u, kMixA = 0x85EBCA6Bu;
constexpr uint32_t kIndexB = 0x27D4EB2Fu, kMixB = 0xC2B2AE35u;

inline uint32_t word_a(uint32_t bits, uint32_t index) {
  uint32_t v = bits ^ (index * kIndexA);
  v = (v ^ (v >> 16)) * kMixA;
  return v ^ (v >> 13);
}

inline uint32_t word_b(uint32_t bits, uint32_t index) {
  uint32_t v = bits ^ (index * kIndexB);
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

constexpr int kBlock = 256;

// One block of at most kBlock elements, given as float values and the 32-bit words the
// lanes read (the float's own bits, or the original 16-bit pattern). Sums are float within
// the block (so the loop vectorises) and float64 across blocks: the error stays ~1e-9 of
// the sum of |x|. Non-finite tests look at the float's bits (conversion keeps NaN and Inf).
void block(const float* values, const uint32_t* words, int n, uint32_t base, uint32_t step, float tiny,
           float largest, Partial& out) {
  float sum = 0, sum_sq = 0, mx = -INFINITY, nmn = -INFINITY, amx = -INFINITY;
  int32_t n_nan = 0, n_inf = 0, n_zero = 0, n_under = 0, n_over = 0;
  uint32_t la = 0, lb = 0;
#pragma omp simd reduction(+ : sum, sum_sq, n_nan, n_inf, n_zero, n_under, n_over, la, lb) \
    reduction(max : mx, nmn, amx)
  for (int j = 0; j < n; ++j) {
    const uint32_t w = words[j];
    const uint32_t index = base + static_cast<uint32_t>(j) * step;
    la += word_a(w, index);
    lb += word_b(w, index);
    const float v = values[j];
    uint32_t fb;
    std::memcpy(&fb, values + j, 4);
    const bool nonfinite = (fb & 0x7F800000u) == 0x7F800000u;
    const bool is_nan = (fb & 0x7FFFFFFFu) > 0x7F800000u;
    const float f = nonfinite ? 0.f : v;
    const float mag = std::fabs(f);
    n_nan += is_nan;
    n_inf += nonfinite & !is_nan;
    n_zero += v == 0.f;
    sum += f;
    sum_sq += f * f;
    n_under += (mag > 0.f) & (mag < tiny);
    n_over += mag > largest;
    mx = std::max(mx, nonfinite ? -INFINITY : v);
    nmn = std::max(nmn, nonfinite ? -INFINITY : -v);
    amx = std::max(amx, nonfinite ? -INFINITY : mag);
  }
  out.sum += sum; out.sum_sq += sum_sq; out.nan += n_nan; out.inf += n_inf; out.zero += n_zero;
  out.under += n_under; out.over += n_over;
  out.max = std::max(out.max, static_cast<double>(mx));
  out.neg_min = std::max(out.neg_min, static_cast<double>(nmn));
  out.absmax = std::max(out.absmax, static_cast<double>(amx));
  out.lane_a += la; out.lane_b += lb;
}

// float64 elements: lane A reads the low word, lane B the high word; plain scalar loop.
void block64(const double* data, int n, uint32_t base, uint32_t step, double tiny, double largest, Partial& out) {
  for (int j = 0; j < n; ++j) {
    uint64_t bits;
    std::memcpy(&bits, data + j, 8);
    const uint32_t index = base + static_cast<uint32_t>(j) * step;
    out.lane_a += word_a(static_cast<uint32_t>(bits), index);
    out.lane_b += word_b(static_cast<uint32_t>(bits >> 32), index);
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

template <typename T>
void span(const T* data, int64_t n, uint32_t base, uint32_t step, double tiny, double largest, Partial& out) {
  const float tiny_f = static_cast<float>(tiny);
  const float largest_f = largest >= 3.4028234663852886e38 ? INFINITY : static_cast<float>(largest);
  float values[kBlock];
  uint32_t words[kBlock];
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - b0));
    const uint32_t b = base + static_cast<uint32_t>(b0) * step;
    if constexpr (std::is_same_v<T, float>) {
      block(data + b0, reinterpret_cast<const uint32_t*>(data + b0), m, b, step, tiny_f, largest_f, out);
    } else if constexpr (std::is_same_v<T, double>) {
      block64(data + b0, m, b, step, tiny, largest, out);
    } else {  // 16-bit types: widen one block, keep the original bit patterns for the lanes
      for (int j = 0; j < m; ++j) {
        values[j] = static_cast<float>(data[b0 + j]);
        words[j] = data[b0 + j].x;
      }
      block(values, words, m, b, step, tiny_f, largest_f, out);
    }
  }
}

template <typename T>
Partial run(const torch::Tensor& x, const std::vector<int64_t>& offset, const std::vector<int64_t>& stride,
            double tiny, double largest) {
  const T* data = x.data_ptr<T>();
  const int64_t ndim = x.dim();
  const int64_t inner = ndim ? x.size(ndim - 1) : 1;
  const uint32_t inner_step = ndim ? static_cast<uint32_t>(stride[ndim - 1]) : 0;
  const int64_t inner_offset = ndim ? offset[ndim - 1] : 0;
  std::vector<Partial> parts(at::get_num_threads());
  // Split the flat element range (not rows: a 1-D tensor is one long row) over threads.
  at::parallel_for(0, x.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    Partial local;
    int64_t i = begin;
    while (i < end) {
      const int64_t r = i / inner, j = i % inner;
      const int64_t n = std::min(end - i, inner - j);
      // Full index of element (r, j): sum over outer dims of (pos + offset) * stride, plus the inner term.
      uint32_t base = static_cast<uint32_t>((j + inner_offset) * static_cast<int64_t>(inner_step));
      int64_t rest = r;
      for (int64_t d = ndim - 2; d >= 0; --d) {
        const int64_t pos = rest % x.size(d);
        rest /= x.size(d);
        base += static_cast<uint32_t>((pos + offset[d]) * stride[d]);
      }
      span<T>(data + i, n, base, inner_step, tiny, largest, local);
      i += n;
    }
    parts[at::get_thread_num()].merge(local);
  });
  Partial total;
  for (const auto& p : parts) total.merge(p);
  return total;
}

void accumulate(torch::Tensor x, torch::Tensor coords, double tiny, double largest, torch::Tensor acc,
                torch::Tensor lanes) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "native statistics need a contiguous CPU tensor");
  TORCH_CHECK(acc.scalar_type() == torch::kFloat64 && acc.numel() == 11, "acc must be float64[11]");
  TORCH_CHECK(lanes.scalar_type() == torch::kInt64 && lanes.numel() == 2, "lanes must be int64[2]");
  auto c = coords.to(torch::kInt64).contiguous();
  auto ca = c.accessor<int64_t, 2>();
  std::vector<int64_t> offset(x.dim()), stride(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) {
    offset[d] = ca[d][0];
    stride[d] = ca[d][1];
  }
  Partial p;
  switch (x.scalar_type()) {
    case torch::kFloat32: p = run<float>(x, offset, stride, tiny, largest); break;
    case torch::kBFloat16: p = run<c10::BFloat16>(x, offset, stride, tiny, largest); break;
    case torch::kFloat16: p = run<c10::Half>(x, offset, stride, tiny, largest); break;
    case torch::kFloat64: p = run<double>(x, offset, stride, tiny, largest); break;
    default: TORCH_CHECK(false, "unsupported dtype for statistics: ", x.scalar_type());
  }
  double* a = acc.data_ptr<double>();
  a[0] += static_cast<double>(x.numel()); a[1] += p.sum; a[2] += p.sum_sq; a[3] += p.nan; a[4] += p.inf;
  a[5] += p.zero; a[6] += p.under; a[7] += p.over;
  a[8] = std::max(a[8], p.max); a[9] = std::max(a[9], p.neg_min); a[10] = std::max(a[10], p.absmax);
  int64_t* l = lanes.data_ptr<int64_t>();
  l[0] += p.lane_a; l[1] += p.lane_b;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("accumulate", &accumulate, "Add one tensor's statistics and fingerprint lanes into accumulators");
}
