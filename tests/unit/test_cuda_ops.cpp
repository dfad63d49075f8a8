// The CUDA basic ops and optimizer kernels against the CPU: every op runs on
// fresh random inputs (fixed seeds) on both devices and the GPU result,
// copied back, is compared with the CPU's.
//
// Tolerances:
// - element-wise ops (add, scale, axpy, cast, fill): bit-identical. Both
//   backends do the same F32 operations with one rounding each and round BF16
//   the same way. The one allowance: an arithmetic result that is NaN only
//   has to be NaN, because GPUs return the canonical NaN where x86 keeps the
//   input's payload (a cast is no arithmetic, so its NaNs match bit for bit).
// - gemm, F32 result: |gpu - cpu| <= 1e-5 * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|),
//   well above the two accumulation orders' rounding (k * 2^-24 * that scale
//   at worst, about sqrt(k) times less in practice) and far below any real
//   error.
// - gemm, BF16 result: the same plus one BF16 ulp of the result: both sides
//   round once, but F32 values a hair apart can round to neighbouring BF16s.
// - sum_of_squares: relative 1e-12 (double sums in a different order).
// - adamw_step, masked_scale (optim/cuda/segment_ops_cuda.h): bit-identical to
//   optim/segment_ops.cpp's arithmetic, replicated below; elements outside
//   every range keep their bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/cuda_runtime.h"
#include "core/ops.h"
#include "optim/cuda/segment_ops_cuda.h"
#include "tests/harness/test_util.h"

namespace {

using st::BFloat16;
using st::Device;
using st::DType;
using st::Shape;
using st::Tensor;
using st::ops::Transpose;
using st::optim::detail::AdamWScalars;

const Device kGpu = Device::cuda(0);

// Uniform values in [-1, 1) with a fixed seed: never all zero, both signs.
std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  const std::vector<float> v = random_floats(st::shape_numel(shape), seed, lo, hi);
  return Tensor::from_floats(v, shape, dtype);
}

float bits_to_f32(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// F32 values that exercise rounding and special cases: BF16 ties that round
// down and up to even, values just off a tie, NaNs with payloads and signs,
// infinities, signed zero, subnormals and the largest finite F32 (which
// rounds to BF16 infinity).
std::vector<float> special_floats() {
  return {bits_to_f32(0x3f808000u),
          bits_to_f32(0x3f818000u),
          bits_to_f32(0xbf808000u),
          bits_to_f32(0x3f808001u),
          bits_to_f32(0x3f807fffu),
          bits_to_f32(0x7fc00001u),
          bits_to_f32(0xffa00001u),
          bits_to_f32(0x7f800001u),
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity(),
          -0.0f,
          0.0f,
          bits_to_f32(0x00000001u),
          bits_to_f32(0x80018000u),
          std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max(),
          bits_to_f32(0x7f7f8000u),
          1.0f};
}

// Random values of `shape` in `dtype`, with special_floats() spread over them.
Tensor tensor_with_specials(const Shape& shape, DType dtype, uint32_t seed) {
  std::vector<float> v = random_floats(st::shape_numel(shape), seed, -4.0f, 4.0f);
  const std::vector<float> specials = special_floats();
  const size_t step = std::max<size_t>(1, v.size() / specials.size());
  for (size_t i = 0; i < specials.size() && i * step < v.size(); ++i) v[i * step] = specials[i];
  return Tensor::from_floats(v, shape, dtype);
}

uint32_t element_bits(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::BF16) return t.span<BFloat16>()[static_cast<size_t>(i)].bits;
  uint32_t u = 0;
  std::memcpy(&u, static_cast<const char*>(t.raw_data()) + i * 4, 4);
  return u;
}

bool element_is_nan(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::I32) return false;
  const float v = t.dtype() == DType::F32 ? t.span<float>()[static_cast<size_t>(i)]
                                          : static_cast<float>(t.span<BFloat16>()[static_cast<size_t>(i)]);
  return std::isnan(v);
}

// Elements whose bits differ, except that two NaNs count as equal (see the top).
int64_t count_wrong_any_nan(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel() || got.dtype() != want.dtype()) return std::max(got.numel(), want.numel()) + 1;
  int64_t wrong = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (element_is_nan(got, i) && element_is_nan(want, i)) continue;
    wrong += element_bits(got, i) != element_bits(want, i);
  }
  return wrong;
}

const char* dtype_str(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
  }
  return "?";
}

// Spacing of BF16 values at |x|.
double bf16_ulp(double x) {
  if (x == 0.0 || !std::isfinite(x)) return std::ldexp(1.0, -133);
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, std::max(exponent - 1, -126) - 7);
}

// --- gemm -------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  Transpose ta, tb;
  DType a_type, b_type, c_type;
  float alpha, beta;
  bool nan_in_c;  // c starts as NaN (only with beta == 0)
};

std::string describe(const GemmCase& g) {
  return st::format("m={} n={} k={} ta={} tb={} a={} b={} c={} alpha={} beta={}{}", g.m, g.n, g.k,
                    g.ta == Transpose::Yes ? "T" : "N", g.tb == Transpose::Yes ? "T" : "N", dtype_str(g.a_type),
                    dtype_str(g.b_type), dtype_str(g.c_type), g.alpha, g.beta, g.nan_in_c ? " (NaN in c)" : "");
}

// Runs one case on both devices and checks every element of c.
void check_gemm(const GemmCase& g, uint32_t seed) {
  SCOPED_TRACE(describe(g));
  const Shape a_shape = g.ta == Transpose::No ? Shape{g.m, g.k} : Shape{g.k, g.m};
  const Shape b_shape = g.tb == Transpose::No ? Shape{g.k, g.n} : Shape{g.n, g.k};
  const Tensor a = random_tensor(a_shape, g.a_type, seed);
  const Tensor b = random_tensor(b_shape, g.b_type, seed + 1);
  const Tensor c0 =
      g.nan_in_c ? Tensor::full({g.m, g.n}, std::nan(""), g.c_type) : random_tensor({g.m, g.n}, g.c_type, seed + 2);

  const Tensor c_cpu = c0.clone();
  st::ops::gemm(a, g.ta, b, g.tb, c_cpu, g.alpha, g.beta);
  const Tensor c_gpu = c0.to(kGpu);
  st::ops::gemm(a.to(kGpu), g.ta, b.to(kGpu), g.tb, c_gpu, g.alpha, g.beta);
  const std::vector<float> got = c_gpu.to(Device::cpu()).to_floats();
  const std::vector<float> want = c_cpu.to_floats();

  // Error scale per element: |alpha| sum_k |op(a)_ik op(b)_kj| + |beta c_ij|.
  const std::vector<float> av = a.to_floats();
  const std::vector<float> bv = b.to_floats();
  const std::vector<float> cv = c0.to_floats();
  auto a_at = [&](int64_t i, int64_t p) {
    return av[static_cast<size_t>(g.ta == Transpose::No ? i * g.k + p : p * g.m + i)];
  };
  auto b_at = [&](int64_t p, int64_t j) {
    return bv[static_cast<size_t>(g.tb == Transpose::No ? p * g.n + j : j * g.k + p)];
  };
  int64_t wrong = 0;
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double scale = 0.0;
      for (int64_t p = 0; p < g.k; ++p) scale += std::fabs(static_cast<double>(a_at(i, p)) * b_at(p, j));
      scale *= std::fabs(g.alpha);
      if (g.beta != 0.0f) scale += std::fabs(static_cast<double>(g.beta) * cv[static_cast<size_t>(i * g.n + j)]);
      const auto idx = static_cast<size_t>(i * g.n + j);
      double tol = 1e-5 * scale;
      if (g.c_type == DType::BF16) tol += bf16_ulp(std::max(std::fabs(want[idx]), std::fabs(got[idx])));
      const bool ok = std::isfinite(got[idx]) && std::fabs(static_cast<double>(got[idx]) - want[idx]) <= tol;
      if (!ok && ++wrong <= 5)
        ADD_FAILURE() << "c[" << i << ", " << j << "]: gpu " << got[idx] << " cpu " << want[idx] << " tol " << tol;
    }
  }
  EXPECT_EQ(wrong, 0) << "wrong elements of " << g.m * g.n;
}

TEST(CudaGemm, MatchesCpuOverShapesTransposesAndDtypes) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk shapes[] = {{1, 1, 1}, {7, 13, 5}, {64, 96, 80}, {257, 129, 65}};
  struct Types {
    DType a, b, c;
  };
  const Types types[] = {
      {DType::F32, DType::F32, DType::F32},   {DType::BF16, DType::BF16, DType::BF16},
      {DType::BF16, DType::BF16, DType::F32}, {DType::F32, DType::F32, DType::BF16},
      {DType::F32, DType::BF16, DType::F32},  {DType::BF16, DType::F32, DType::BF16},
  };
  uint32_t seed = 100;
  for (const Mnk& s : shapes)
    for (Transpose ta : {Transpose::No, Transpose::Yes})
      for (Transpose tb : {Transpose::No, Transpose::Yes})
        for (const Types& t : types) check_gemm({s.m, s.n, s.k, ta, tb, t.a, t.b, t.c, 1.0f, 0.0f, false}, seed += 3);
}

TEST(CudaGemm, AlphaAndBeta) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 500;
  for (DType t : {DType::F32, DType::BF16}) {
    for (Transpose ta : {Transpose::No, Transpose::Yes}) {
      for (Transpose tb : {Transpose::No, Transpose::Yes}) {
        check_gemm({7, 13, 5, ta, tb, t, t, t, 0.5f, -1.25f, false}, seed += 3);
        check_gemm({64, 96, 80, ta, tb, t, t, t, -2.0f, 1.0f, false}, seed += 3);
        check_gemm({257, 129, 65, ta, tb, t, t, DType::F32, 0.75f, 0.5f, false}, seed += 3);
      }
    }
  }
  // Mixed operands with a BF16 c and beta != 0: the F32 temporary starts from c.
  check_gemm({33, 17, 9, Transpose::No, Transpose::Yes, DType::F32, DType::BF16, DType::BF16, 1.5f, 0.25f, false},
             seed += 3);
}

TEST(CudaGemm, BetaZeroIgnoresNanInC) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 900;
  for (DType a_type : {DType::F32, DType::BF16})
    for (DType c_type : {DType::F32, DType::BF16})
      for (Transpose ta : {Transpose::No, Transpose::Yes})
        check_gemm({65, 31, 17, ta, Transpose::Yes, a_type, a_type, c_type, 1.0f, 0.0f, true}, seed += 3);
  check_gemm({9, 11, 7, Transpose::No, Transpose::No, DType::BF16, DType::F32, DType::BF16, 2.0f, 0.0f, true},
             seed += 3);
}

TEST(CudaGemm, LeadingDimensionsAreFlattened) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  // a [3, 5, 8] is [15, 8]; c [3, 5, 6].
  const Tensor a = random_tensor({3, 5, 8}, DType::BF16, 11);
  const Tensor b = random_tensor({6, 8}, DType::BF16, 12);
  const Tensor c_cpu = Tensor::zeros({3, 5, 6}, DType::F32);
  st::ops::gemm(a, Transpose::No, b, Transpose::Yes, c_cpu);
  const Tensor c_gpu = Tensor::zeros({3, 5, 6}, DType::F32, kGpu);
  st::ops::gemm(a.to(kGpu), Transpose::No, b.to(kGpu), Transpose::Yes, c_gpu);
  const std::vector<float> got = c_gpu.to_floats();
  const std::vector<float> want = c_cpu.to_floats();
  ASSERT_EQ(got.size(), want.size());
  // Eight products of BF16 values in [-1, 1): the sum's scale is at most 8.
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 8e-5) << "element " << i;
}

TEST(CudaGemm, EmptyInnerDimensionLeavesBetaC) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_str(t));
    const Tensor a = Tensor::empty({5, 0}, t, kGpu);
    const Tensor b = Tensor::empty({0, 3}, t, kGpu);
    const Tensor c0 = random_tensor({5, 3}, t, 21);

    const Tensor c_scaled = c0.to(kGpu);
    st::ops::gemm(a, Transpose::No, b, Transpose::No, c_scaled, 1.0f, -0.5f);
    const Tensor want = c0.clone();
    st::ops::scale(want, -0.5f);
    EXPECT_EQ(st::test::count_wrong(c_scaled.to(Device::cpu()), want), 0);

    const Tensor c_nan = Tensor::full({5, 3}, std::nan(""), t, kGpu);
    st::ops::gemm(a, Transpose::No, b, Transpose::No, c_nan, 1.0f, 0.0f);
    EXPECT_EQ(st::test::count_wrong(c_nan.to(Device::cpu()), Tensor::zeros({5, 3}, t)), 0);
  }
}

TEST(CudaGemm, SteadyStateMakesNoDeviceAllocation) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  // Mixed operands and a BF16 c use both temporaries (a widened b, an F32 c).
  const Tensor a = random_tensor({96, 64}, DType::F32, 31).to(kGpu);
  const Tensor b = random_tensor({64, 80}, DType::BF16, 32).to(kGpu);
  const Tensor c = Tensor::zeros({96, 80}, DType::BF16, kGpu);
  st::ops::gemm(a, Transpose::No, b, Transpose::No, c, 1.0f, 0.5f);
  st::cuda::synchronize(0);
  const int64_t allocs = st::cuda::cache_stats(0).source_allocs;
  for (int i = 0; i < 3; ++i) st::ops::gemm(a, Transpose::No, b, Transpose::No, c, 1.0f, 0.5f);
  st::cuda::synchronize(0);
  EXPECT_EQ(st::cuda::cache_stats(0).source_allocs, allocs);

  // The same for sum_of_squares, whose partial sums live in a temporary.
  (void)st::ops::sum_of_squares(c);
  const int64_t allocs_after_sum = st::cuda::cache_stats(0).source_allocs;
  (void)st::ops::sum_of_squares(c);
  EXPECT_EQ(st::cuda::cache_stats(0).source_allocs, allocs_after_sum);
}

// --- element-wise ops ----------------------------------------------------------------

const int64_t kSizes[] = {1, 3, 7, 1000, 4099, (1 << 20) + 3};
const DType kFloatTypes[] = {DType::F32, DType::BF16};

TEST(CudaElementwise, AddMatchesCpuBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 1000;
  for (int64_t n : kSizes) {
    for (DType ta : kFloatTypes) {
      for (DType tb : kFloatTypes) {
        for (DType to : kFloatTypes) {
          SCOPED_TRACE(st::format("n={} a={} b={} out={}", n, dtype_str(ta), dtype_str(tb), dtype_str(to)));
          const Tensor a = tensor_with_specials({n}, ta, seed++);
          const Tensor b = random_tensor({n}, tb, seed++, -4.0f, 4.0f);
          const Tensor want = Tensor::empty({n}, to);
          st::ops::add(a, b, want);
          const Tensor got = Tensor::empty({n}, to, kGpu);
          st::ops::add(a.to(kGpu), b.to(kGpu), got);
          EXPECT_EQ(count_wrong_any_nan(got.to(Device::cpu()), want), 0);
        }
      }
    }
  }
}

TEST(CudaElementwise, AddInPlaceAndUnalignedViews) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(dtype_str(t));
    const int64_t n = 4099;
    const Tensor a = random_tensor({n}, t, 41);
    const Tensor b = random_tensor({n}, t, 42);
    // out aliases a.
    const Tensor want = a.clone();
    st::ops::add(want, b, want);
    const Tensor got = a.to(kGpu);
    st::ops::add(got, b.to(kGpu), got);
    EXPECT_EQ(st::test::count_wrong(got.to(Device::cpu()), want), 0);

    // Views one element in: no 4-element access is aligned, the scalar path runs.
    const Tensor a_view = a.flat_slice(1, n - 1);
    const Tensor b_view = b.flat_slice(1, n - 1);
    const Tensor want_view = Tensor::empty({n - 1}, t);
    st::ops::add(a_view, b_view, want_view);
    const Tensor a_gpu = a.to(kGpu);
    const Tensor b_gpu = b.to(kGpu);
    const Tensor out_gpu = Tensor::empty({n}, t, kGpu);
    st::ops::add(a_gpu.flat_slice(1, n - 1), b_gpu.flat_slice(1, n - 1), out_gpu.flat_slice(1, n - 1));
    EXPECT_EQ(st::test::count_wrong(out_gpu.flat_slice(1, n - 1).to(Device::cpu()), want_view), 0);
  }
}

TEST(CudaElementwise, ScaleMatchesCpuBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 2000;
  for (int64_t n : kSizes) {
    for (DType t : kFloatTypes) {
      for (float s : {-0.37f, 3.0f, 1e-3f}) {
        SCOPED_TRACE(st::format("n={} x={} s={}", n, dtype_str(t), s));
        const Tensor x = tensor_with_specials({n}, t, seed++);
        const Tensor got = x.to(kGpu);
        st::ops::scale(x, s);
        st::ops::scale(got, s);
        EXPECT_EQ(count_wrong_any_nan(got.to(Device::cpu()), x), 0);
      }
    }
  }
  // An unaligned view.
  const Tensor x = random_tensor({1001}, DType::BF16, 2999);
  const Tensor got = x.to(kGpu);
  st::ops::scale(x.flat_slice(3, 997), 1.7f);
  st::ops::scale(got.flat_slice(3, 997), 1.7f);
  EXPECT_EQ(st::test::count_wrong(got.to(Device::cpu()), x), 0);
}

TEST(CudaElementwise, AxpyMatchesCpuBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 3000;
  for (int64_t n : kSizes) {
    for (DType tx : kFloatTypes) {
      for (DType ty : kFloatTypes) {
        for (float alpha : {0.75f, -1.3f}) {
          SCOPED_TRACE(st::format("n={} x={} y={} alpha={}", n, dtype_str(tx), dtype_str(ty), alpha));
          const Tensor x = tensor_with_specials({n}, tx, seed++);
          const Tensor y = random_tensor({n}, ty, seed++, -4.0f, 4.0f);
          const Tensor got = y.to(kGpu);
          st::ops::axpy(alpha, x.to(kGpu), got);
          st::ops::axpy(alpha, x, y);
          EXPECT_EQ(count_wrong_any_nan(got.to(Device::cpu()), y), 0);
        }
      }
    }
  }
}

TEST(CudaElementwise, CastFloatsMatchesCpuIncludingNanBits) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 4000;
  for (int64_t n : kSizes) {
    for (DType from : kFloatTypes) {
      for (DType to : kFloatTypes) {
        SCOPED_TRACE(st::format("n={} {} -> {}", n, dtype_str(from), dtype_str(to)));
        const Tensor src = tensor_with_specials({n}, from, seed++);
        const Tensor want = st::ops::cast(src, to);
        const Tensor got = st::ops::cast(src.to(kGpu), to);
        EXPECT_EQ(got.dtype(), to);
        EXPECT_EQ(st::test::count_wrong(got.to(Device::cpu()), want), 0);
      }
    }
  }
}

TEST(CudaElementwise, CastIntegersMatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(5000);
  std::uniform_int_distribution<int32_t> dist(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  std::vector<int32_t> v(4099);
  for (int32_t& x : v) x = dist(rng);
  // Integers whose F32 value lands on a BF16 midpoint it is not itself on
  // (2^24 + 2^16 is a midpoint; F32 spacing there is 2), exact midpoints,
  // small values and the extremes.
  const int32_t crafted[] = {16842753,
                             16842751,
                             -16842753,
                             16842752,
                             -16842752,
                             33685505,
                             0,
                             1,
                             -1,
                             255,
                             257,
                             -129,
                             std::numeric_limits<int32_t>::max(),
                             std::numeric_limits<int32_t>::min()};
  for (size_t i = 0; i < std::size(crafted); ++i) v[i * 7] = crafted[i];
  const Tensor src = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  for (DType to : kFloatTypes) {
    SCOPED_TRACE(dtype_str(to));
    const Tensor want = st::ops::cast(src, to);
    const Tensor got = st::ops::cast(src.to(kGpu), to);
    EXPECT_EQ(st::test::count_wrong(got.to(Device::cpu()), want), 0);
  }
}

TEST(CudaElementwise, FillMatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (int64_t n : kSizes) {
    for (DType t : {DType::F32, DType::BF16, DType::I32}) {
      for (double value : {0.1, -3.5, 12345.678, -7.9}) {
        SCOPED_TRACE(st::format("n={} {} value={}", n, dtype_str(t), value));
        const Tensor cpu = Tensor::empty({n}, t);
        st::ops::fill(cpu, value);
        // Start from non-zero contents so a fill that writes nothing shows.
        const Tensor gpu = Tensor::full({n}, 99.0, t, kGpu);
        st::ops::fill(gpu, value);
        EXPECT_EQ(st::test::count_wrong(gpu.to(Device::cpu()), cpu), 0);
      }
    }
  }
}

TEST(CudaElementwise, SumOfSquaresMatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 7000;
  for (int64_t n : kSizes) {
    for (DType t : kFloatTypes) {
      SCOPED_TRACE(st::format("n={} {}", n, dtype_str(t)));
      const Tensor x = random_tensor({n}, t, seed++, -3.0f, 3.0f);
      const double want = st::ops::sum_of_squares(x);
      const double got = st::ops::sum_of_squares(x.to(kGpu));
      ASSERT_GT(want, 0.0);
      EXPECT_NEAR(got, want, 1e-12 * want);
    }
  }
  EXPECT_EQ(st::ops::sum_of_squares(Tensor::empty({0}, DType::F32, kGpu)), 0.0);
  // Inf and NaN propagate.
  EXPECT_TRUE(std::isinf(
      st::ops::sum_of_squares(Tensor::full({5}, std::numeric_limits<double>::infinity(), DType::F32, kGpu))));
  EXPECT_TRUE(std::isnan(st::ops::sum_of_squares(tensor_with_specials({100}, DType::F32, 7999).to(kGpu))));
}

// --- optimizer kernels ---------------------------------------------------------------

// Ranges as the optimizer passes them: (offset, numel, decay) rows.
struct RangeRow {
  int32_t offset, numel, decay;
};

Tensor range_table(const std::vector<RangeRow>& rows) {
  std::vector<int32_t> flat;
  for (const RangeRow& r : rows) flat.insert(flat.end(), {r.offset, r.numel, r.decay});
  return Tensor::from_vector(flat, {static_cast<int64_t>(rows.size()), 3}).to(kGpu);
}

// A few large ranges with gaps between them, and one that ends before n.
std::vector<RangeRow> large_ranges() {
  return {{0, 1000, 1}, {1000, 37, 0}, {1040, 5000, 1}, {6100, 1, 0}, {6200, 3807, 1}};
}

// Hundreds of short ranges (1..60 elements, gaps of 0..9), so every chunk of
// the kernels spans many ranges and ranges straddle chunk borders.
std::vector<RangeRow> many_small_ranges(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> len(1, 60);
  std::uniform_int_distribution<int32_t> gap(0, 9);
  std::vector<RangeRow> rows;
  int32_t pos = gap(rng);
  while (true) {
    const int32_t numel = len(rng);
    if (pos + numel > n) break;
    rows.push_back({pos, numel, static_cast<int32_t>(rows.size() % 3 != 0)});
    pos += numel + gap(rng);
  }
  return rows;
}

#if defined(__GNUC__) && !defined(__clang__)
#define ST_NO_CONTRACT [[gnu::optimize("fp-contract=off")]]
#else
#define ST_NO_CONTRACT
#endif

// optim/segment_ops.cpp's adamw_kernel, statement for statement: the reference the
// GPU must match bit for bit. Contraction is off (GCC would fuse across
// statements where the CPU has FMA), std::fma exactly where the CPU uses it.
ST_NO_CONTRACT void adamw_reference(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float decayed = p[i] * s.decay;
    const float m_scaled = s.beta1 * m[i];
    const float mi = std::fma(gi, s.one_minus_beta1, m_scaled);
    const float v_scaled = s.beta2 * v[i];
    const float g_scaled = s.one_minus_beta2 * gi;
    const float vi = std::fma(g_scaled, gi, v_scaled);
    const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    const float update = (s.neg_step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = decayed + update;
  }
}

// The step-t scalars exactly as optim/adamw.cpp rounds them.
AdamWScalars adamw_scalars(int64_t t, double lr, double beta1, double beta2, double eps, double weight_decay) {
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  AdamWScalars s{};
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return s;
}

void check_adamw(int64_t n, const std::vector<RangeRow>& rows, uint32_t seed) {
  SCOPED_TRACE(st::format("n={} ranges={}", n, rows.size()));
  const Tensor p = random_tensor({n}, DType::F32, seed);
  const Tensor g = random_tensor({n}, DType::F32, seed + 1);
  const Tensor m = random_tensor({n}, DType::F32, seed + 2, -0.1f, 0.1f);
  const Tensor v = random_tensor({n}, DType::F32, seed + 3, 1e-6f, 1e-2f);
  const Tensor p_gpu = p.to(kGpu);
  const Tensor g_gpu = g.to(kGpu);
  const Tensor m_gpu = m.to(kGpu);
  const Tensor v_gpu = v.to(kGpu);
  const Tensor table = range_table(rows);

  for (int64_t t = 1; t <= 3; ++t) {
    const AdamWScalars s = adamw_scalars(t, 1e-3 * static_cast<double>(t), 0.9, 0.95, 1e-8, 0.1);
    st::optim::cuda::adamw_step(p_gpu, g_gpu, m_gpu, v_gpu, table, s);
    for (const RangeRow& r : rows) {
      AdamWScalars rs = s;
      if (r.decay == 0) rs.decay = 1.0f;
      adamw_reference(p.data<float>() + r.offset, g.data<float>() + r.offset, m.data<float>() + r.offset,
                      v.data<float>() + r.offset, r.numel, rs);
    }
    // A different gradient each step, on both sides.
    const Tensor g_next = random_tensor({n}, DType::F32, seed + 10 + static_cast<uint32_t>(t));
    g.copy_from(g_next);
    g_gpu.copy_from(g_next);
  }
  // Outside the ranges the reference wrote nothing, so equality also shows
  // the kernel left those elements alone.
  EXPECT_EQ(st::test::count_wrong(p_gpu.to(Device::cpu()), p), 0) << "param";
  EXPECT_EQ(st::test::count_wrong(m_gpu.to(Device::cpu()), m), 0) << "exp_avg";
  EXPECT_EQ(st::test::count_wrong(v_gpu.to(Device::cpu()), v), 0) << "exp_avg_sq";
}

TEST(CudaAdamW, BitIdenticalToCpuArithmetic) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  check_adamw(10007, large_ranges(), 8000);
  check_adamw(20011, many_small_ranges(20011, 8100), 8200);
  // One range covering everything, larger than one grid's worth of chunks.
  const int64_t big = 3 * 1024 * 2048 + 5;
  check_adamw(big, {{0, static_cast<int32_t>(big), 1}}, 8300);
}

TEST(CudaAdamW, EmptyTableTouchesNothing) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const Tensor p = random_tensor({100}, DType::F32, 8400).to(kGpu);
  const Tensor before = p.to(Device::cpu());
  const Tensor table = Tensor::empty({0, 3}, DType::I32, kGpu);
  st::optim::cuda::adamw_step(p, p.clone(), p.clone(), p.clone(), table, adamw_scalars(1, 1e-3, 0.9, 0.95, 1e-8, 0.1));
  EXPECT_EQ(st::test::count_wrong(p.to(Device::cpu()), before), 0);
  EXPECT_EQ(st::optim::cuda::masked_sum_of_squares(p, table), 0.0);
}

TEST(CudaAdamW, RejectsABadTable) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const Tensor x = random_tensor({10}, DType::F32, 8500).to(kGpu);
  const Tensor wrong_shape = Tensor::zeros({2, 2}, DType::I32, kGpu);
  EXPECT_NE(st::test::error_of([&] { st::optim::cuda::masked_scale(x, wrong_shape, 2.0f); }).find("[R, 3]"),
            std::string::npos);
  const Tensor on_cpu = Tensor::zeros({1, 3}, DType::I32);
  EXPECT_NE(st::test::error_of([&] { st::optim::cuda::masked_scale(x, on_cpu, 2.0f); }).find("ranges"),
            std::string::npos);
}

TEST(CudaMasked, SumOfSquaresOverRanges) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 9000;
  for (int64_t n : {int64_t{10007}, int64_t{20011}}) {
    const std::vector<RangeRow> rows = n == 10007 ? large_ranges() : many_small_ranges(n, 9100);
    const Tensor table = range_table(rows);
    for (DType t : kFloatTypes) {
      SCOPED_TRACE(st::format("n={} {}", n, dtype_str(t)));
      const Tensor x = random_tensor({n}, t, seed++, -2.0f, 2.0f);
      const std::vector<float> xv = x.to_floats();
      double want = 0.0;
      for (const RangeRow& r : rows)
        for (int32_t i = r.offset; i < r.offset + r.numel; ++i)
          want += static_cast<double>(xv[static_cast<size_t>(i)]) * xv[static_cast<size_t>(i)];
      ASSERT_GT(want, 0.0);
      EXPECT_NEAR(st::optim::cuda::masked_sum_of_squares(x.to(kGpu), table), want, 1e-12 * want);
    }
  }
}

TEST(CudaMasked, ScaleOverRangesOnly) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 9500;
  for (int64_t n : {int64_t{10007}, int64_t{20011}}) {
    const std::vector<RangeRow> rows = n == 10007 ? large_ranges() : many_small_ranges(n, 9600);
    const Tensor table = range_table(rows);
    for (DType t : kFloatTypes) {
      SCOPED_TRACE(st::format("n={} {}", n, dtype_str(t)));
      const Tensor x = random_tensor({n}, t, seed++);
      const Tensor got = x.to(kGpu);
      st::optim::cuda::masked_scale(got, table, 0.3f);
      // The CPU scale over each range is the reference; the rest keeps its bits.
      for (const RangeRow& r : rows) st::ops::scale(x.flat_slice(r.offset, r.numel), 0.3f);
      EXPECT_EQ(st::test::count_wrong(got.to(Device::cpu()), x), 0);
    }
  }
}

}  // namespace
