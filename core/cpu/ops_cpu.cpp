// CPU backend of core/ops.h. One rule for every op here: BF16 elements are
// widened to F32, the arithmetic is F32, and a BF16 result is rounded once
// (round to nearest even) when it is stored. That is what the CUDA kernels do
// too, so a CPU run and a GPU run round identically.
//
// Element-wise ops run in parallel over fixed blocks of kBlockElems elements
// with `omp simd` inner loops; sum_of_squares adds per-block partial sums in
// block order, so every result is the same for any thread count.
#include "core/cpu/ops_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/cpu/vec.h"

namespace st::cpu {

void widen_bf16(const BFloat16* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = vec::widen(src[i].bits);
}

void narrow_to_bf16(const float* src, BFloat16* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i].bits = vec::narrow(src[i]);
}

namespace {

// Elements per parallel block: enough work to pay for handing out a block.
// A constant, so block bounds (and sum_of_squares' order) depend on n only.
constexpr int64_t kBlockElems = 16384;

inline float to_f32(float v) { return v; }
inline float to_f32(BFloat16 v) { return vec::widen(v.bits); }

template <class T>
inline T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return BFloat16::from_bits(vec::narrow(v));
  }
}

// Calls fn(std::type_identity<T>{}) with T = float or BFloat16 for `dtype`.
// The dispatcher has already rejected other dtypes; this is the backstop.
template <class Fn>
decltype(auto) visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn(std::type_identity<float>{});
    case DType::BF16: return fn(std::type_identity<BFloat16>{});
    case DType::I32: break;
  }
  ST_FAIL("CPU op expected an F32 or BF16 tensor, got {}", dtype);
}

// fn(begin, end) over [0, n) in parallel blocks of kBlockElems.
template <class Fn>
void for_blocks(int64_t n, Fn&& fn) {
  parallel_for(n, kBlockElems, std::forward<Fn>(fn));
}

// Element i of an I32 tensor as BF16, rounded once. Going through F32 rounds
// twice for |v| > 2^24, which goes wrong exactly when the F32 value lands on
// a BF16 midpoint that v itself is not on (the tie then breaks to even instead
// of towards v). Moving such an F32 value one F32 ulp back towards v keeps it
// on v's side of the midpoint, and one F32 ulp is far from any other midpoint.
uint16_t i32_to_bf16_bits(int32_t v) {
  float f = static_cast<float>(v);
  if ((std::bit_cast<uint32_t>(f) & 0xffffu) == 0x8000u) {
    int64_t diff = static_cast<int64_t>(v) - static_cast<int64_t>(f);
    if (diff != 0)
      f = std::nextafter(f,
                         diff > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
  }
  return f32_to_bf16_bits(f);
}

// Sum of p[i]^2 for i < n in double, in an order fixed by n: kLanes
// interleaved partial sums (independent adds vectorise; the compiler may not
// reassociate one running sum itself), then the remainder, then the lanes.
template <class T>
double sum_of_squares_block(const T* p, int64_t n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const double v = to_f32(p[i + j]);
      acc[j] += v * v;
    }
  }
  double total = 0.0;
  for (; i < n; ++i) {
    const double v = to_f32(p[i]);
    total += v * v;
  }
  for (double partial : acc) total += partial;
  return total;
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  visit_float(a.dtype(), [&](auto a_type) {
    visit_float(b.dtype(), [&](auto b_type) {
      visit_float(out.dtype(), [&](auto out_type) {
        using A = typename decltype(a_type)::type;
        using B = typename decltype(b_type)::type;
        using O = typename decltype(out_type)::type;
        // out may be a or b exactly: element i is read before it is written.
        const A* pa = a.data<A>();
        const B* pb = b.data<B>();
        O* po = out.data<O>();
        for_blocks(out.numel(), [&](int64_t begin, int64_t end) {
#pragma omp simd
          for (int64_t i = begin; i < end; ++i) po[i] = from_f32<O>(to_f32(pa[i]) + to_f32(pb[i]));
        });
      });
    });
  });
}

void scale(const Tensor& x, float s) {
  visit_float(x.dtype(), [&](auto x_type) {
    using T = typename decltype(x_type)::type;
    T* p = x.data<T>();
    for_blocks(x.numel(), [&](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) p[i] = from_f32<T>(to_f32(p[i]) * s);
    });
  });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  visit_float(x.dtype(), [&](auto x_type) {
    visit_float(y.dtype(), [&](auto y_type) {
      using X = typename decltype(x_type)::type;
      using Y = typename decltype(y_type)::type;
      const X* px = x.data<X>();
      Y* py = y.data<Y>();
      for_blocks(y.numel(), [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) py[i] = from_f32<Y>(to_f32(py[i]) + alpha * to_f32(px[i]));
      });
    });
  });
}

void cast(const Tensor& src, const Tensor& dst) {
  const int64_t n = dst.numel();
  const DType from = src.dtype();
  const DType to = dst.dtype();
  if (from == to) {
    // memmove: src and dst may overlap (the dispatcher allows it), so one call, not blocks.
    if (n > 0) std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
  } else if (from == DType::F32 && to == DType::BF16) {
    const float* ps = src.data<float>();
    BFloat16* pd = dst.data<BFloat16>();
    for_blocks(n, [&](int64_t begin, int64_t end) { narrow_to_bf16(ps + begin, pd + begin, end - begin); });
  } else if (from == DType::BF16 && to == DType::F32) {
    const BFloat16* ps = src.data<BFloat16>();
    float* pd = dst.data<float>();
    for_blocks(n, [&](int64_t begin, int64_t end) { widen_bf16(ps + begin, pd + begin, end - begin); });
  } else if (from == DType::I32 && to == DType::F32) {
    const int32_t* ps = src.data<int32_t>();
    float* pd = dst.data<float>();
    for_blocks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) pd[i] = static_cast<float>(ps[i]);
    });
  } else if (from == DType::I32 && to == DType::BF16) {
    const int32_t* ps = src.data<int32_t>();
    BFloat16* pd = dst.data<BFloat16>();
    for_blocks(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) pd[i].bits = i32_to_bf16_bits(ps[i]);
    });
  } else {
    ST_FAIL("cast: no CPU conversion from {} to {}", from, to);
  }
}

double sum_of_squares(const Tensor& x) {
  return visit_float(x.dtype(), [&](auto x_type) {
    using T = typename decltype(x_type)::type;
    const T* p = x.data<T>();
    const int64_t n = x.numel();
    const int64_t blocks = (n + kBlockElems - 1) / kBlockElems;
    thread_local std::vector<double> block_sums;
    block_sums.assign(static_cast<size_t>(blocks), 0.0);
    double* sums = block_sums.data();
    for_blocks(n, [&](int64_t begin, int64_t end) {
      sums[begin / kBlockElems] = sum_of_squares_block(p + begin, end - begin);
    });
    double total = 0.0;
    for (int64_t blk = 0; blk < blocks; ++blk) total += sums[blk];
    return total;
  });
}

void fill(const Tensor& x, double value) {
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::F32: {
      float* p = x.data<float>();
      const auto v = static_cast<float>(value);
      for_blocks(n, [&](int64_t begin, int64_t end) { std::fill(p + begin, p + end, v); });
      break;
    }
    case DType::BF16: {
      // Through float, as Tensor::full rounds, so fill and full agree bit for bit.
      BFloat16* p = x.data<BFloat16>();
      const BFloat16 v(static_cast<float>(value));
      for_blocks(n, [&](int64_t begin, int64_t end) { std::fill(p + begin, p + end, v); });
      break;
    }
    case DType::I32: {
      int32_t* p = x.data<int32_t>();
      const auto v = static_cast<int32_t>(value);
      for_blocks(n, [&](int64_t begin, int64_t end) { std::fill(p + begin, p + end, v); });
      break;
    }
  }
}

}  // namespace st::cpu
