// The op set against plain loops written here. GEMM is checked against a
// double-precision triple loop with an error bound derived from F32
// accumulation; elementwise ops against the same F32 formula, bit for bit,
// including the one BF16 rounding of each result.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/cuda/cuda_runtime.h"
#include "core/ops.h"
#include "tests/harness/test_util.h"

namespace {

using st::BFloat16;
using st::Device;
using st::DType;
using st::Shape;
using st::Tensor;
using st::ops::Transpose;

using st::test::error_of;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Normal values with a fixed seed: never all zero, and both signs.
std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Values as they are stored in `dtype` (rounded through BF16 when needed).
std::vector<float> as_stored(std::vector<float> v, DType dtype) {
  if (dtype == DType::BF16)
    for (float& x : v) x = st::round_to_bf16(x);
  return v;
}

// Spacing of BF16 values at |x| (the ulp of the binade x lies in).
double bf16_ulp(double x) {
  if (x == 0.0) return std::ldexp(1.0, -133);
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, std::max(exponent - 1, -126) - 7);
}

uint16_t bf16_bits(float stored) { return st::f32_to_bf16_bits(stored); }

// ---------------------------------------------------------------- GEMM

struct GemmCase {
  int64_t m, n, k;
};

struct AlphaBeta {
  float alpha, beta;
};

// The GEMM under test: the dispatcher's (oneDNN when built with it) or the
// portable Eigen path; both are held to the same bounds.
enum class GemmPath : uint8_t { Dispatch, Eigen };

using GemmParam = std::tuple<DType, DType, DType, Transpose, Transpose, GemmPath>;

class GemmTest : public ::testing::TestWithParam<GemmParam> {};

// Holds the GEMM of `param` on every case and scaling to the double triple loop.
void check_gemm_cases(const GemmParam& param, const std::vector<GemmCase>& cases,
                      const std::vector<AlphaBeta>& scalings) {
  const auto [a_dtype, b_dtype, c_dtype, ta, tb, path] = param;
  uint32_t seed = 1;
  for (const GemmCase& g : cases) {
    for (const AlphaBeta& s : scalings) {
      SCOPED_TRACE(::testing::Message() << "m=" << g.m << " n=" << g.n << " k=" << g.k << " alpha=" << s.alpha
                                        << " beta=" << s.beta);
      const int64_t m = g.m, n = g.n, k = g.k;
      const Shape a_shape = ta == Transpose::No ? Shape{m, k} : Shape{k, m};
      const Shape b_shape = tb == Transpose::No ? Shape{k, n} : Shape{n, k};
      const std::vector<float> a_vals = as_stored(random_floats(m * k, seed++), a_dtype);
      const std::vector<float> b_vals = as_stored(random_floats(k * n, seed++), b_dtype);
      // beta == 0 must ignore c entirely, so then c starts as NaN.
      const std::vector<float> c_old =
          s.beta == 0.0f ? std::vector<float>(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN())
                         : as_stored(random_floats(m * n, seed++), c_dtype);
      Tensor a = Tensor::from_floats(a_vals, a_shape, a_dtype);
      Tensor b = Tensor::from_floats(b_vals, b_shape, b_dtype);
      Tensor c = Tensor::from_floats(c_old, {m, n}, c_dtype);

      if (path == GemmPath::Eigen) {
        st::cpu::gemm_eigen(a, ta, b, tb, c, m, n, k, s.alpha, s.beta);
      } else {
        st::ops::gemm(a, ta, b, tb, c, s.alpha, s.beta);
      }
      const std::vector<float> got = c.to_floats();

      int64_t bad = 0;
      int64_t inexact = 0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0.0;
          double abs_sum = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            double av =
                ta == Transpose::No ? a_vals[static_cast<size_t>(i * k + p)] : a_vals[static_cast<size_t>(p * m + i)];
            double bv =
                tb == Transpose::No ? b_vals[static_cast<size_t>(p * n + j)] : b_vals[static_cast<size_t>(j * k + p)];
            sum += av * bv;
            abs_sum += std::abs(av * bv);
          }
          const size_t idx = static_cast<size_t>(i * n + j);
          double ref = s.alpha * sum;
          double scale = std::abs(s.alpha) * abs_sum;
          if (s.beta != 0.0f) {
            ref += s.beta * static_cast<double>(c_old[idx]);
            scale += std::abs(s.beta * static_cast<double>(c_old[idx]));
          }
          // F32 accumulation of k products, then the alpha and beta terms:
          // |error| <= (k + 3) u * scale with u = 2^-24; doubled for slack.
          const double f32_bound = 2.0 * static_cast<double>(k + 3) * std::ldexp(1.0, -24) * scale;
          const double v = got[idx];
          if (c_dtype == DType::F32) {
            if (!(std::abs(v - ref) <= f32_bound)) {
              if (++bad <= 5) ADD_FAILURE() << "c[" << i << "," << j << "] = " << v << ", want " << ref;
            }
          } else {
            // One rounding of an F32 result: equal to the rounded reference,
            // or one BF16 ulp off where F32 error crossed a rounding boundary.
            const float expected = st::round_to_bf16(static_cast<float>(ref));
            if (bf16_bits(static_cast<float>(v)) != bf16_bits(expected)) ++inexact;
            if (!(std::abs(v - expected) <= bf16_ulp(expected) + f32_bound)) {
              if (++bad <= 5) ADD_FAILURE() << "c[" << i << "," << j << "] = " << v << ", want " << expected;
            }
          }
        }
      }
      EXPECT_EQ(bad, 0);
      // Off-by-one-ulp results must be rare (truncating instead of rounding
      // would make about half of them so).
      EXPECT_LE(inexact, m * n / 20 + 1);
    }
  }
}

TEST_P(GemmTest, MatchesDoubleTripleLoop) {
  // Small shapes for the edges, larger ones for the blocked (AMX, AVX-512) kernels.
  check_gemm_cases(GetParam(),
                   {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 1, 128}, {1, 48, 70}, {70, 50, 300}, {130, 97, 260}},
                   {{1.0f, 0.0f}, {-0.75f, 0.0f}, {1.25f, -0.5f}, {1.0f, 1.0f}});
}

class GemmBlocksTest : public ::testing::TestWithParam<GemmParam> {};

TEST_P(GemmBlocksTest, MatchesDoubleTripleLoop) {
  // Shapes whose widened F32 copies exceed the GEMM's scratch target (8 MiB),
  // so that operands with a BF16 side are multiplied in blocks: of K
  // (m=9 n=8 k=250001: blocks of 123,361, c accumulating with beta = 1 after
  // the first) and of rows (m=400001 n=3 k=8: blocks of 190,650 rows when
  // a is copied, of 262,144 when only c is), all with remainders.
  // Mixed operands take that path on every CPU; BF16 ones below avx512_bf16
  // (ST_MAX_CPU_ISA=avx2 tests it on any machine).
  check_gemm_cases(GetParam(), {{9, 8, 250001}, {400001, 3, 8}}, {{1.0f, 0.0f}, {-0.75f, 1.0f}});
}

std::string gemm_param_name(const ::testing::TestParamInfo<GemmParam>& info) {
  const auto [a, b, c, ta, tb, path] = info.param;
  return std::string(st::dtype_name(a)) + "_" + std::string(st::dtype_name(b)) + "_" + std::string(st::dtype_name(c)) +
         (ta == Transpose::Yes ? "_aT" : "_aN") + (tb == Transpose::Yes ? "_bT" : "_bN") +
         (path == GemmPath::Eigen ? "_eigen" : "");
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndTransposes, GemmTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(Transpose::No, Transpose::Yes),
                                            ::testing::Values(Transpose::No, Transpose::Yes),
                                            ::testing::Values(GemmPath::Dispatch, GemmPath::Eigen)),
                         gemm_param_name);

INSTANTIATE_TEST_SUITE_P(WidenedOperands, GemmBlocksTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::Values(DType::BF16),
                                            ::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(Transpose::No, Transpose::Yes),
                                            ::testing::Values(Transpose::No, Transpose::Yes),
                                            ::testing::Values(GemmPath::Dispatch)),
                         gemm_param_name);

TEST(GemmShapes, RepeatedCallIsBitIdentical) {
  // Activation recomputation relies on it: the same GEMM on the same inputs
  // (same thread count) gives the same bits, in F32 and in BF16.
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor a = Tensor::from_floats(as_stored(random_floats(96 * 288, 7), dtype), {96, 288}, dtype);
    Tensor w = Tensor::from_floats(as_stored(random_floats(200 * 288, 8), dtype), {200, 288}, dtype);
    Tensor c1 = Tensor::zeros({96, 200}, DType::F32);
    Tensor c2 = Tensor::zeros({96, 200}, DType::F32);
    st::ops::gemm(a, Transpose::No, w, Transpose::Yes, c1);
    st::ops::gemm(a, Transpose::No, w, Transpose::Yes, c2);
    const std::vector<float> v1 = c1.to_floats();
    const std::vector<float> v2 = c2.to_floats();
    EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * sizeof(float)), 0) << st::dtype_name(dtype);
  }
}

TEST(GemmShapes, BackendIsNamed) {
  const std::string backend = st::cpu::gemm_backend();
#ifdef ST_WITH_DNNL
  EXPECT_EQ(backend.rfind("oneDNN ", 0), 0u) << backend;
#else
  EXPECT_EQ(backend.rfind("Eigen ", 0), 0u) << backend;
#endif
}

TEST(GemmShapes, HandComputedProduct) {
  // [[1, 2, 3], [4, 5, 6]] @ [[1, 0], [0, 1], [1, 1]] = [[4, 5], [10, 11]]
  Tensor a = Tensor::from_floats(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::F32);
  Tensor b = Tensor::from_floats(std::vector<float>{1, 0, 0, 1, 1, 1}, {3, 2}, DType::BF16);
  Tensor c = Tensor::full({2, 2}, 1.0, DType::F32);
  st::ops::gemm(a, Transpose::No, b, Transpose::No, c, 2.0f, 3.0f);
  EXPECT_EQ(c.to_floats(), (std::vector<float>{11, 13, 23, 25}));
}

TEST(GemmShapes, LeadingDimensionsAreFlattened) {
  // a: [B, T, K] = [2, 3, 4] is the matrix [6, 4]; c: [2, 3, 5].
  const std::vector<float> a_vals = random_floats(24, 7);
  const std::vector<float> w_vals = random_floats(20, 8);
  Tensor a = Tensor::from_floats(a_vals, {2, 3, 4}, DType::F32);
  Tensor w = Tensor::from_floats(w_vals, {5, 4}, DType::F32);  // as a Linear weight [out, in]
  Tensor c = Tensor::empty({2, 3, 5}, DType::F32);
  st::ops::gemm(a, Transpose::No, w, Transpose::Yes, c);
  const std::vector<float> got = c.to_floats();
  for (int r = 0; r < 6; ++r) {
    for (int o = 0; o < 5; ++o) {
      double ref = 0;
      for (int i = 0; i < 4; ++i) ref += static_cast<double>(a_vals[r * 4 + i]) * w_vals[o * 4 + i];
      EXPECT_NEAR(got[r * 5 + o], ref, 1e-5) << r << "," << o;
    }
  }
  // The weight gradient: dW [5, 4] = dy^T [5, 6] @ x [6, 4], both [2, 3, *].
  Tensor dw = Tensor::empty({5, 4}, DType::F32);
  st::ops::gemm(c, Transpose::Yes, a, Transpose::No, dw);
  const std::vector<float> dw_got = dw.to_floats();
  for (int o = 0; o < 5; ++o) {
    for (int i = 0; i < 4; ++i) {
      double ref = 0;
      for (int r = 0; r < 6; ++r) ref += static_cast<double>(got[r * 5 + o]) * a_vals[r * 4 + i];
      EXPECT_NEAR(dw_got[o * 4 + i], ref, 1e-4) << o << "," << i;
    }
  }
}

TEST(GemmShapes, BetaOneAddsTheProductToC) {
  // Linear::backward_add sums parallel projections' input gradients with
  // beta = 1: c + a@b, with c read once and the sum rounded once.
  // Shapes of m8's backward: dy [N, F] @ W [F, D] and dy [N, D] @ W [D, D].
  //
  // No library promises in which order it adds c and the K products (oneDNN's
  // AVX-512 kernel adds c to the finished accumulator, its AVX2 kernel and
  // Eigen do not), so the fused result is held to the error bound of any
  // summation order against the unfused F32 product then an add: each of the
  // two differs from the exact c + sum(a*b) by at most gamma(k + 1) times
  // |c| + sum|a*b|, gamma(n) = n*u / (1 - n*u) with u = 2^-24 (Higham,
  // Accuracy and Stability of Numerical Algorithms, 3.1). A BF16 result
  // adds one rounding to BF16 (2^-8 relative, doubled to cover either side).
  // A missing, doubled or misplaced c is off by |c|, far above the bound.
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{512, 768, 288}, {512, 288, 288}, {7, 5, 3}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const std::vector<float> av = as_stored(random_floats(m * k, 41), dtype);
      const std::vector<float> bv = as_stored(random_floats(k * n, 42), dtype);
      const std::vector<float> c_old = as_stored(random_floats(m * n, 43), dtype);
      Tensor a = Tensor::from_floats(av, {m, k}, dtype);
      Tensor b = Tensor::from_floats(bv, {k, n}, dtype);
      Tensor fused = Tensor::from_floats(c_old, {m, n}, dtype);
      st::ops::gemm(a, Transpose::No, b, Transpose::No, fused, 1.0f, 1.0f);
      Tensor product = Tensor::zeros({m, n}, DType::F32);  // unrounded F32 product
      st::ops::gemm(a, Transpose::No, b, Transpose::No, product);
      const std::vector<float> got = fused.to_floats(), p = product.to_floats();
      // sum |a*b| per element, in double.
      std::vector<double> abs_sum(static_cast<size_t>(m * n), 0.0);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t kk = 0; kk < k; ++kk) {
          const double x = std::fabs(static_cast<double>(av[i * k + kk]));
          for (int64_t j = 0; j < n; ++j) abs_sum[i * n + j] += x * std::fabs(static_cast<double>(bv[kk * n + j]));
        }
      }
      const double u = 0x1p-24, nu = static_cast<double>(k + 1) * u, gamma = nu / (1.0 - nu);
      int64_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float want = as_stored({p[i] + c_old[i]}, dtype)[0];
        const double order = 2.0 * gamma * (std::fabs(c_old[i]) + abs_sum[i]);
        const double rounding = dtype == DType::F32 ? 0.0 : 0x1p-7 * std::fabs(static_cast<double>(want));
        const double diff = std::fabs(static_cast<double>(got[i]) - want);
        if (diff > order + rounding) ++wrong;
      }
      EXPECT_EQ(wrong, 0) << m << "x" << k << "x" << n << " " << st::dtype_name(dtype);
    }
  }
}

TEST(GemmShapes, EmptyInnerDimensionLeavesBetaTerm) {
  Tensor a = Tensor::empty({3, 0}, DType::F32);
  Tensor b = Tensor::empty({0, 2}, DType::BF16);
  Tensor c = Tensor::full({3, 2}, std::numeric_limits<double>::quiet_NaN(), DType::F32);
  st::ops::gemm(a, Transpose::No, b, Transpose::No, c, 1.0f, 0.0f);
  EXPECT_EQ(c.to_floats(), std::vector<float>(6, 0.0f));
  Tensor c2 = Tensor::full({3, 2}, 3.0, DType::BF16);
  st::ops::gemm(a, Transpose::No, b, Transpose::No, c2, 1.0f, 2.0f);
  EXPECT_EQ(c2.to_floats(), std::vector<float>(6, 6.0f));
}

TEST(GemmErrors, InnerDimensionMismatchNamesShapes) {
  Tensor a = Tensor::empty({3, 4}, DType::F32);
  Tensor b = Tensor::empty({5, 6}, DType::F32);
  Tensor c = Tensor::empty({3, 6}, DType::F32);
  std::string msg = error_of([&] { st::ops::gemm(a, Transpose::No, b, Transpose::No, c); });
  EXPECT_TRUE(contains(msg, "[3, 4]")) << msg;
  EXPECT_TRUE(contains(msg, "[5, 6]")) << msg;
  // The same operands are fine once b is read transposed... with matching K.
  Tensor bt = Tensor::empty({6, 4}, DType::F32);
  EXPECT_NO_THROW(st::ops::gemm(a, Transpose::No, bt, Transpose::Yes, c));
}

TEST(GemmErrors, OutputShapeMismatchNamesShapes) {
  Tensor a = Tensor::empty({3, 4}, DType::F32);
  Tensor b = Tensor::empty({4, 6}, DType::F32);
  Tensor c = Tensor::empty({6, 3}, DType::F32);  // right numel, wrong last dimension
  std::string msg = error_of([&] { st::ops::gemm(a, Transpose::No, b, Transpose::No, c); });
  EXPECT_TRUE(contains(msg, "[6, 3]")) << msg;
  EXPECT_TRUE(contains(msg, "[3, 6]")) << msg;
  Tensor c2 = Tensor::empty({3, 5}, DType::F32);
  msg = error_of([&] { st::ops::gemm(a, Transpose::No, b, Transpose::No, c2); });
  EXPECT_TRUE(contains(msg, "[3, 5]")) << msg;
}

TEST(GemmErrors, DtypeDeviceAndAliasing) {
  Tensor a = Tensor::empty({2, 2}, DType::I32);
  Tensor f = Tensor::zeros({2, 2}, DType::F32);
  std::string msg = error_of([&] { st::ops::gemm(a, Transpose::No, f, Transpose::No, f.clone()); });
  EXPECT_TRUE(contains(msg, "I32")) << msg;
  EXPECT_THROW(st::ops::gemm(Tensor(), Transpose::No, f, Transpose::No, f.clone()), st::Error);
  EXPECT_THROW(st::ops::gemm(Tensor::zeros({}, DType::F32), Transpose::No, f, Transpose::No, f.clone()), st::Error);
  // c may not overlap an input: it is written while they are read.
  Tensor buf = Tensor::zeros({8}, DType::F32);
  Tensor x = buf.flat_slice(0, 4).view({2, 2});
  Tensor y = buf.flat_slice(2, 4).view({2, 2});
  msg = error_of([&] { st::ops::gemm(x, Transpose::No, f, Transpose::No, y); });
  EXPECT_TRUE(contains(msg, "overlap")) << msg;
  // Disjoint views of one buffer are fine.
  Tensor z = buf.flat_slice(4, 4).view({2, 2});
  EXPECT_NO_THROW(st::ops::gemm(x, Transpose::No, f, Transpose::No, z));
}

// ---------------------------------------------------------- elementwise

// Stores an F32 result the way the op set does for `dtype`.
float store_as(float v, DType dtype) { return dtype == DType::BF16 ? st::round_to_bf16(v) : v; }

const DType kFloatDtypes[] = {DType::F32, DType::BF16};

// Bitwise equality of two float vectors, reporting the first mismatches.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t g, w;
    std::memcpy(&g, &got[i], 4);
    std::memcpy(&w, &want[i], 4);
    if (g != w && ++mismatches <= 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " want " << want[i];
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(ElementwiseOps, AddAllDtypeMixes) {
  const int64_t n = 1001;  // not a multiple of any vector width
  for (DType da : kFloatDtypes) {
    for (DType db : kFloatDtypes) {
      for (DType dout : kFloatDtypes) {
        SCOPED_TRACE(::testing::Message() << da << " + " << db << " -> " << dout);
        const std::vector<float> av = as_stored(random_floats(n, 11), da);
        const std::vector<float> bv = as_stored(random_floats(n, 12), db);
        Tensor a = Tensor::from_floats(av, {n}, da);
        Tensor b = Tensor::from_floats(bv, {7, 11, 13}, db);  // same numel, other shape
        Tensor out = Tensor::full({n}, std::numeric_limits<double>::quiet_NaN(), dout);
        st::ops::add(a, b, out);
        std::vector<float> want(static_cast<size_t>(n));
        for (size_t i = 0; i < want.size(); ++i) want[i] = store_as(av[i] + bv[i], dout);
        expect_same_bits(out.to_floats(), want);
      }
    }
  }
}

TEST(ElementwiseOps, AddInPlace) {
  for (DType d : kFloatDtypes) {
    const std::vector<float> av = as_stored(random_floats(100, 13), d);
    const std::vector<float> bv = as_stored(random_floats(100, 14), DType::F32);
    Tensor a = Tensor::from_floats(av, {100}, d);
    Tensor b = Tensor::from_floats(bv, {100}, DType::F32);
    st::ops::add(a, b, a);
    std::vector<float> want(100);
    for (size_t i = 0; i < 100; ++i) want[i] = store_as(av[i] + bv[i], d);
    expect_same_bits(a.to_floats(), want);
    st::ops::add(b, b, b);
    for (size_t i = 0; i < 100; ++i) EXPECT_EQ(b.to_floats()[i], bv[i] * 2.0f);
  }
}

TEST(ElementwiseOps, AddRoundsBf16Once) {
  // 1 + 2^-8 is a BF16 tie (rounds to 1.0), and each addend is a BF16 value:
  // rounding the sum once gives 1.0; 1 + 3 * 2^-8 ties up to 1 + 2^-6.
  Tensor a = Tensor::from_floats(std::vector<float>{1.0f, 1.0f}, {2}, DType::BF16);
  Tensor b = Tensor::from_floats(std::vector<float>{0x1p-8f, 3 * 0x1p-8f}, {2}, DType::F32);
  Tensor out = Tensor::empty({2}, DType::BF16);
  st::ops::add(a, b, out);
  EXPECT_EQ(out.span<BFloat16>()[0].bits, 0x3f80);
  EXPECT_EQ(out.span<BFloat16>()[1].bits, 0x3f82);
}

TEST(ElementwiseOps, Scale) {
  for (DType d : kFloatDtypes) {
    SCOPED_TRACE(::testing::Message() << d);
    const std::vector<float> xv = as_stored(random_floats(1003, 21), d);
    Tensor x = Tensor::from_floats(xv, {17, 59}, d);
    st::ops::scale(x, -0.3f);
    std::vector<float> want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) want[i] = store_as(xv[i] * -0.3f, d);
    expect_same_bits(x.to_floats(), want);
  }
  Tensor z = Tensor::full({4}, std::numeric_limits<double>::infinity(), DType::F32);
  st::ops::scale(z, 0.0f);  // IEEE: Inf * 0 is NaN; scale is not a fill
  for (float v : z.to_floats()) EXPECT_TRUE(std::isnan(v));
}

TEST(ElementwiseOps, AxpyAllDtypeMixes) {
  for (DType dx : kFloatDtypes) {
    for (DType dy : kFloatDtypes) {
      SCOPED_TRACE(::testing::Message() << dx << " -> " << dy);
      const std::vector<float> xv = as_stored(random_floats(517, 31), dx);
      const std::vector<float> yv = as_stored(random_floats(517, 32), dy);
      Tensor x = Tensor::from_floats(xv, {517}, dx);
      Tensor y = Tensor::from_floats(yv, {11, 47}, dy);
      const float alpha = 0.37f;
      st::ops::axpy(alpha, x, y);
      std::vector<float> want(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        const float prod = alpha * xv[i];
        want[i] = store_as(yv[i] + prod, dy);
      }
      expect_same_bits(y.to_floats(), want);
    }
  }
}

TEST(ElementwiseOps, CastBetweenFloatDtypes) {
  const std::vector<float> xv = random_floats(999, 41);
  Tensor f = Tensor::from_floats(xv, {999}, DType::F32);
  Tensor b = Tensor::empty({9, 111}, DType::BF16);
  st::ops::cast(f, b);
  std::vector<float> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) want[i] = st::round_to_bf16(xv[i]);
  expect_same_bits(b.to_floats(), want);
  // BF16 -> F32 is exact.
  Tensor back = st::ops::cast(b, DType::F32);
  EXPECT_EQ(back.shape(), (Shape{9, 111}));
  EXPECT_EQ(back.dtype(), DType::F32);
  expect_same_bits(back.to_floats(), want);
  // Hand-picked bits: tie to even both ways, NaN stays NaN, Inf stays Inf.
  Tensor special =
      Tensor::from_floats(std::vector<float>{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, std::numeric_limits<float>::infinity(),
                                             std::numeric_limits<float>::quiet_NaN(), -0.0f},
                          {5}, DType::F32);
  Tensor sb = st::ops::cast(special, DType::BF16);
  auto s = sb.span<BFloat16>();
  EXPECT_EQ(s[0].bits, 0x3f80);
  EXPECT_EQ(s[1].bits, 0x3f82);
  EXPECT_EQ(s[2].bits, 0x7f80);
  EXPECT_TRUE(std::isnan(static_cast<float>(s[3])));
  EXPECT_EQ(s[4].bits, 0x8000);
}

TEST(ElementwiseOps, CastFromI32) {
  const int32_t big = 1 << 30;
  const int32_t half_ulp = 1 << 22;  // half a BF16 ulp at 2^30
  std::vector<int32_t> iv = {0,
                             -7,
                             123456,
                             16777217,
                             big + half_ulp + 1,
                             big + half_ulp - 1,
                             big + 3 * half_ulp - 1,
                             big + 3 * half_ulp + 1,
                             -(big + half_ulp + 1),
                             std::numeric_limits<int32_t>::max(),
                             std::numeric_limits<int32_t>::min()};
  Tensor i = Tensor::from_vector(iv, {static_cast<int64_t>(iv.size())});
  Tensor f = st::ops::cast(i, DType::F32);
  auto fs = f.span<float>();
  EXPECT_EQ(fs[1], -7.0f);
  EXPECT_EQ(fs[2], 123456.0f);
  EXPECT_EQ(fs[3], 16777216.0f);  // 2^24 + 1 ties to even in F32
  EXPECT_EQ(fs[9], 2147483648.0f);
  Tensor b = st::ops::cast(i, DType::BF16);
  auto bs = b.span<BFloat16>();
  EXPECT_EQ(bs[0].bits, 0x0000);
  EXPECT_EQ(bs[1].bits, 0xc0e0);  // -7
  // Rounded once, to the nearest BF16: 2^30 is 0x4e80, its neighbours
  // 0x4e81 (2^30 + 2^23) and 0x4e82 (2^30 + 2^24). Through F32 these land
  // exactly on BF16 midpoints and would tie to even instead.
  EXPECT_EQ(bs[4].bits, 0x4e81);
  EXPECT_EQ(bs[5].bits, 0x4e80);
  EXPECT_EQ(bs[6].bits, 0x4e81);
  EXPECT_EQ(bs[7].bits, 0x4e82);
  EXPECT_EQ(bs[8].bits, 0xce81);
  EXPECT_EQ(bs[9].bits, 0x4f00);   // 2^31 - 1 rounds to 2^31
  EXPECT_EQ(bs[10].bits, 0xcf00);  // -2^31 is exact
}

TEST(ElementwiseOps, CastSameDtypeCopiesAndOthersAreRejected) {
  Tensor i = Tensor::from_vector(std::vector<int32_t>{1, 2, 3}, {3});
  Tensor i2 = st::ops::cast(i, DType::I32);
  EXPECT_FALSE(i2.shares_storage_with(i));
  EXPECT_EQ(i2.span<int32_t>()[2], 3);
  Tensor f = Tensor::zeros({3}, DType::F32);
  std::string msg = error_of([&] { st::ops::cast(f, DType::I32); });
  EXPECT_TRUE(contains(msg, "I32")) << msg;
  msg = error_of([&] { st::ops::cast(f, Tensor::empty({4}, DType::BF16)); });
  EXPECT_TRUE(contains(msg, "[3]") && contains(msg, "[4]")) << msg;
}

TEST(ElementwiseOps, Fill) {
  Tensor f = Tensor::empty({5}, DType::F32);
  st::ops::fill(f, -1.5);
  EXPECT_EQ(f.to_floats(), std::vector<float>(5, -1.5f));
  Tensor b = Tensor::empty({2, 3}, DType::BF16);
  st::ops::fill(b, 1.0 + 3.0 / 256.0);  // a tie: rounds up to the even 1 + 2^-6
  for (BFloat16 v : b.span<BFloat16>()) EXPECT_EQ(v.bits, 0x3f82);
  st::ops::fill(b.flat_slice(1, 2), 0.0);
  EXPECT_EQ(b.to_floats(), (std::vector<float>{1.015625f, 0, 0, 1.015625f, 1.015625f, 1.015625f}));
  Tensor i = Tensor::empty({3}, DType::I32);
  st::ops::fill(i, -3.9);
  for (int32_t v : i.span<int32_t>()) EXPECT_EQ(v, -3);
  std::string msg = error_of([&] { st::ops::fill(i, 3e9); });
  EXPECT_TRUE(contains(msg, "I32")) << msg;
  EXPECT_THROW(st::ops::fill(i, std::nan("")), st::Error);
}

TEST(ElementwiseOps, SumOfSquares) {
  for (DType d : kFloatDtypes) {
    for (int64_t n : {0, 1, 7, 8, 9, 1001, 100000}) {
      SCOPED_TRACE(::testing::Message() << d << " n=" << n);
      const std::vector<float> xv = as_stored(random_floats(n, 51 + static_cast<uint32_t>(n)), d);
      Tensor x = Tensor::from_floats(xv, {n}, d);
      double want = 0.0;
      for (float v : xv) want += static_cast<double>(v) * v;
      // Double accumulation: only summation order differs.
      EXPECT_NEAR(st::ops::sum_of_squares(x), want, 1e-12 * want);
    }
  }
  // Values whose squares overflow F32 still sum correctly in double.
  Tensor big = Tensor::full({4}, 1e30, DType::F32);
  const double v = static_cast<float>(1e30);
  EXPECT_EQ(st::ops::sum_of_squares(big), 4.0 * (v * v));  // 24-bit squares are exact in double
  EXPECT_THROW(st::ops::sum_of_squares(Tensor::zeros({2}, DType::I32)), st::Error);
}

TEST(ElementwiseErrors, ShapeMismatchNamesShapes) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32);
  Tensor b = Tensor::zeros({4, 2}, DType::F32);
  Tensor out = Tensor::zeros({2, 3}, DType::F32);
  std::string msg = error_of([&] { st::ops::add(a, b, out); });
  EXPECT_TRUE(contains(msg, "[2, 3]") && contains(msg, "[4, 2]")) << msg;
  msg = error_of([&] { st::ops::axpy(1.0f, a, b); });
  EXPECT_TRUE(contains(msg, "[2, 3]") && contains(msg, "[4, 2]")) << msg;
  msg = error_of([&] { st::ops::add(a, a, Tensor::zeros({7}, DType::BF16)); });
  EXPECT_TRUE(contains(msg, "[7]")) << msg;
}

TEST(ElementwiseErrors, DtypesAndAliasing) {
  Tensor f = Tensor::zeros({4}, DType::F32);
  Tensor i = Tensor::zeros({4}, DType::I32);
  std::string msg = error_of([&] { st::ops::add(f, i, f); });
  EXPECT_TRUE(contains(msg, "I32")) << msg;
  EXPECT_THROW(st::ops::scale(i, 2.0f), st::Error);
  EXPECT_THROW(st::ops::axpy(1.0f, i, f), st::Error);
  EXPECT_THROW(st::ops::scale(Tensor(), 2.0f), st::Error);
  // A shifted overlap between output and input is refused.
  Tensor buf = Tensor::zeros({6}, DType::F32);
  msg = error_of([&] { st::ops::add(buf.flat_slice(0, 4), f, buf.flat_slice(1, 4)); });
  EXPECT_TRUE(contains(msg, "overlap")) << msg;
  msg = error_of([&] { st::ops::axpy(1.0f, buf.flat_slice(2, 4), buf.flat_slice(0, 4)); });
  EXPECT_TRUE(contains(msg, "overlap")) << msg;
}

TEST(OpsCuda, DeviceMismatchAndSameDtypeCast) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  Tensor x = Tensor::zeros({4}, DType::F32, Device::cuda(0));
  std::string msg = error_of([&] { st::ops::add(x, Tensor::zeros({4}, DType::F32), x); });
  EXPECT_TRUE(contains(msg, "cuda:0") && contains(msg, "cpu")) << msg;
  // A same-dtype cast is a copy and works on any device.
  Tensor y = st::ops::cast(x, DType::F32);
  EXPECT_EQ(y.device(), Device::cuda(0));
  EXPECT_EQ(y.to_floats(), std::vector<float>(4, 0.0f));
}

}  // namespace
