// CPU backend of core/ops.h. One rule for every op here: BF16 elements are
// widened to F32, the arithmetic is F32, and a BF16 result is rounded once
// (round to nearest even) when it is stored. That is what the CUDA kernels do
// too, so a CPU run and a GPU run round identically.
#include "core/cpu/ops_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

namespace st::cpu {

void widen_bf16(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i].bits);
}

void narrow_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = f32_to_bf16_bits(src[i]);
}

namespace {

inline float to_f32(float v) { return v; }
inline float to_f32(BFloat16 v) { return bf16_bits_to_f32(v.bits); }

template <class T>
inline T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return BFloat16::from_bits(f32_to_bf16_bits(v));
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

template <class T>
double sum_of_squares_typed(const T* p, int64_t n) {
  // Independent partial sums: a single accumulator serialises on the add
  // latency, and the compiler may not reassociate floating-point sums itself.
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      double v = to_f32(p[i + j]);
      acc[j] += v * v;
    }
  }
  double total = 0.0;
  for (; i < n; ++i) {
    double v = to_f32(p[i]);
    total += v * v;
  }
  for (double partial : acc) total += partial;
  return total;
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
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
        for (int64_t i = 0; i < n; ++i) po[i] = from_f32<O>(to_f32(pa[i]) + to_f32(pb[i]));
      });
    });
  });
}

void scale(const Tensor& x, float s) {
  const int64_t n = x.numel();
  visit_float(x.dtype(), [&](auto x_type) {
    using T = typename decltype(x_type)::type;
    T* p = x.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = from_f32<T>(to_f32(p[i]) * s);
  });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  const int64_t n = y.numel();
  visit_float(x.dtype(), [&](auto x_type) {
    visit_float(y.dtype(), [&](auto y_type) {
      using X = typename decltype(x_type)::type;
      using Y = typename decltype(y_type)::type;
      const X* px = x.data<X>();
      Y* py = y.data<Y>();
      for (int64_t i = 0; i < n; ++i) py[i] = from_f32<Y>(to_f32(py[i]) + alpha * to_f32(px[i]));
    });
  });
}

void cast(const Tensor& src, const Tensor& dst) {
  const int64_t n = dst.numel();
  const DType from = src.dtype();
  const DType to = dst.dtype();
  if (from == to) {
    if (n > 0) std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
  } else if (from == DType::F32 && to == DType::BF16) {
    narrow_to_bf16(src.data<float>(), dst.data<BFloat16>(), n);
  } else if (from == DType::BF16 && to == DType::F32) {
    widen_bf16(src.data<BFloat16>(), dst.data<float>(), n);
  } else if (from == DType::I32 && to == DType::F32) {
    const int32_t* ps = src.data<int32_t>();
    float* pd = dst.data<float>();
    for (int64_t i = 0; i < n; ++i) pd[i] = static_cast<float>(ps[i]);
  } else if (from == DType::I32 && to == DType::BF16) {
    const int32_t* ps = src.data<int32_t>();
    BFloat16* pd = dst.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) pd[i].bits = i32_to_bf16_bits(ps[i]);
  } else {
    ST_FAIL("cast: no CPU conversion from {} to {}", from, to);
  }
}

double sum_of_squares(const Tensor& x) {
  return visit_float(x.dtype(), [&](auto x_type) {
    using T = typename decltype(x_type)::type;
    return sum_of_squares_typed(x.data<T>(), x.numel());
  });
}

void fill(const Tensor& x, double value) {
  const auto n = static_cast<size_t>(x.numel());
  switch (x.dtype()) {
    case DType::F32: std::fill_n(x.data<float>(), n, static_cast<float>(value)); break;
    // Through float, as Tensor::full rounds, so fill and full agree bit for bit.
    case DType::BF16: std::fill_n(x.data<BFloat16>(), n, BFloat16(static_cast<float>(value))); break;
    case DType::I32: std::fill_n(x.data<int32_t>(), n, static_cast<int32_t>(value)); break;
  }
}

}  // namespace st::cpu
