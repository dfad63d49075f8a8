// The model ops (core/ops.h, "model ops") against references written here in
// double precision:
//  - forward values against naive double loops;
//  - every analytic gradient (inputs and parameters) against central
//    differences of the double reference forward, with L = sum(out o R) for a
//    random R, so the check is limited by the op's F32 arithmetic only;
//  - BF16 operands against the F32 op run on the same BF16-rounded values
//    (attention within the bound of its BF16 products, derived below);
//  - the accumulation rules (+= for parameters, = for inputs), aliasing,
//    determinism and the error messages.
// Sizes are odd on purpose (T=5, hd=6, V=11, N=7).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu/parallel.h"
#include "core/ops.h"
#include "tests/harness/attention_ref.h"
#include "tests/harness/test_util.h"

namespace {

using st::Device;
using st::DType;
using st::Shape;
using st::Tensor;
using st::test::error_of;
using Vec = std::vector<double>;

// ---------------------------------------------------------------- helpers

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

using st::test::random_floats;

// Values as they are stored in `dtype` (rounded through BF16 when needed).
std::vector<float> as_stored(std::vector<float> v, DType dtype) {
  if (dtype == DType::BF16)
    for (float& x : v) x = st::round_to_bf16(x);
  return v;
}

Tensor make(const std::vector<float>& v, const Shape& shape, DType dtype = DType::F32) {
  return Tensor::from_floats(v, shape, dtype);
}

Tensor make_i32(const std::vector<int32_t>& v, const Shape& shape) { return Tensor::from_vector(v, shape); }

Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
Vec to_double(const Tensor& t) { return to_double(t.to_floats()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of L(x) = sum(f(x) o r) with respect to every element of x.
template <class F>
Vec numeric_grad(F&& f, Vec x, const Vec& r, double eps = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = dot(f(x), r);
    x[i] = saved - eps;
    const double minus = dot(f(x), r);
    x[i] = saved;
    g[i] = (plus - minus) / (2.0 * eps);
  }
  return g;
}

// max |got - want| / max |want|: the error relative to the result's scale.
double rel_err(const Vec& got, const Vec& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0;
  double scale = 0.0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return scale > 0.0 ? err / scale : err;
}

// The finite-difference checks print their errors so a run shows the margins.
constexpr double kGradTol = 1e-5;
constexpr double kForwardTol = 1e-5;

void expect_grad_close(const char* what, const Vec& analytic, const Vec& numeric) {
  const double err = rel_err(analytic, numeric);
  std::printf("  [fd] %-34s max rel err %.2e\n", what, err);
  EXPECT_LT(err, kGradTol) << what;
}

void expect_forward_close(const char* what, const Vec& got, const Vec& want, double tol = kForwardTol) {
  const double err = rel_err(got, want);
  EXPECT_LT(err, tol) << what << ": max rel err " << err;
}

// Spacing of BF16 values at |x| (the ulp of the binade x lies in).
double bf16_ulp(double x) {
  if (x == 0.0) return std::ldexp(1.0, -133);
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, std::max(exponent - 1, -126) - 7);
}

// Each element of a BF16 result is within one BF16 ulp of the F32 result
// (computed on the same BF16-rounded inputs) rounded to BF16.
void expect_bf16_matches(const char* what, const Tensor& bf16, const Tensor& f32) {
  ASSERT_EQ(bf16.dtype(), DType::BF16) << what;
  ASSERT_EQ(f32.dtype(), DType::F32) << what;
  const std::vector<float> got = bf16.to_floats();
  const std::vector<float> want = f32.to_floats();
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double rounded = st::round_to_bf16(want[i]);
    if (std::fabs(got[i] - rounded) > bf16_ulp(rounded)) {
      if (bad == 0) ADD_FAILURE() << what << "[" << i << "]: BF16 " << got[i] << " vs F32 " << want[i];
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements off by more than one BF16 ulp";
}

void expect_bitwise_equal(const char* what, const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " differs bit for bit";
}

// ---------------------------------------------------------------- references (double)

struct RmsRef {
  Vec out, rstd;
};

RmsRef rmsnorm_ref(const Vec& x, const Vec& w, int64_t d, double eps) {
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  RmsRef r{Vec(x.size()), Vec(static_cast<size_t>(rows))};
  for (int64_t n = 0; n < rows; ++n) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += x[n * d + i] * x[n * d + i];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    r.rstd[n] = rs;
    for (int64_t i = 0; i < d; ++i) r.out[n * d + i] = x[n * d + i] * rs * w[i];
  }
  return r;
}

// x [B, T, heads, hd]; cos, sin [T', hd]; out = x * cos + rotate_half(x) * sin.
Vec rope_ref(const Vec& x, const Vec& cos, const Vec& sin, int64_t batch, int64_t seq, int64_t heads, int64_t hd) {
  Vec out(x.size());
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((b * seq + t) * heads + h) * hd;
        for (int64_t i = 0; i < hd; ++i) {
          const double rotated = i < half ? -x[base + i + half] : x[base + i - half];
          out[base + i] = x[base + i] * cos[t * hd + i] + rotated * sin[t * hd + i];
        }
      }
  return out;
}

using AttnDims = st::test::AttnShape;
using st::test::attention_ref;
using st::test::AttnRef;

Vec swiglu_ref(const Vec& gate, const Vec& up) {
  Vec out(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) out[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return out;
}

Vec relu_ref(const Vec& x) {
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::max(x[i], 0.0);
  return out;
}

// Sum over counted rows of logsumexp(row) - row[target], and the count.
st::ops::LossSum cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int64_t vocab,
                                   int64_t ignore_index) {
  st::ops::LossSum r;
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] == ignore_index) continue;
    const double* row = &logits[n * static_cast<size_t>(vocab)];
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, row[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - m);
    r.sum += m + std::log(sum) - row[targets[n]];
    ++r.count;
  }
  return r;
}

// ---------------------------------------------------------------- embedding

TEST(Embedding, ForwardCopiesRows) {
  const int64_t vocab = 11, d = 6;
  const std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 3, 1};  // N = 7, token 3 three times
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::vector<float> w = as_stored(random_floats(vocab * d, 1), dtype);
    Tensor weight = make(w, {vocab, d}, dtype);
    Tensor out = Tensor::full({7, d}, 99.0, dtype);
    st::ops::embedding_forward(make_i32(tokens, {7}), weight, out);
    const std::vector<float> got = out.to_floats();
    for (size_t n = 0; n < tokens.size(); ++n)
      for (int64_t j = 0; j < d; ++j)
        EXPECT_EQ(got[n * d + j], w[static_cast<size_t>(tokens[n] * d + j)]) << "row " << n << " col " << j;
  }
}

TEST(Embedding, ForwardAcceptsBatchShapes) {
  // tokens [B, T] and out [B, T, D] are the same rows as [N] and [N, D].
  Tensor weight = make(random_floats(11 * 4, 2), {11, 4});
  Tensor out = Tensor::zeros({2, 3, 4}, DType::F32);
  st::ops::embedding_forward(make_i32({1, 2, 3, 4, 5, 6}, {2, 3}), weight, out);
  EXPECT_EQ(out.to_floats()[5 * 4 + 2], weight.to_floats()[6 * 4 + 2]);
}

TEST(Embedding, BackwardAccumulatesIntoRepeatedRows) {
  const int64_t vocab = 11, d = 6, n = 7;
  const std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 3, 1};
  const std::vector<float> g = random_floats(n * d, 3);
  const std::vector<float> prefill = random_floats(vocab * d, 4);
  Tensor dweight = make(prefill, {vocab, d});
  st::ops::embedding_backward(make_i32(tokens, {n}), make(g, {n, d}), dweight);

  Vec want = to_double(prefill);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < d; ++j) want[tokens[r] * d + j] += g[r * d + j];
  const Vec got = to_double(dweight);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "element " << i;
  // A row no token touched keeps its value exactly.
  EXPECT_EQ(dweight.to_floats()[2 * d], prefill[2 * d]);
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  const int64_t vocab = 11, d = 6, n = 7;
  const std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 3, 1};
  const std::vector<float> w = random_floats(vocab * d, 5);
  const std::vector<float> r = random_floats(n * d, 6);
  Tensor dweight = Tensor::zeros({vocab, d}, DType::F32);
  st::ops::embedding_backward(make_i32(tokens, {n}), make(r, {n, d}), dweight);
  auto f = [&](const Vec& wd) {
    Vec out(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) out[i * d + j] = wd[tokens[i] * d + j];
    return out;
  };
  expect_grad_close("embedding dweight", to_double(dweight), numeric_grad(f, to_double(w), to_double(r)));
}

TEST(Embedding, ParameterGradientAccumulatesAcrossCalls) {
  const std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 3, 1};
  Tensor tok = make_i32(tokens, {7});
  Tensor g = make(random_floats(7 * 6, 7), {7, 6});
  const std::vector<float> prefill = random_floats(11 * 6, 8);
  Tensor once = make(prefill, {11, 6});
  Tensor twice = make(prefill, {11, 6});
  st::ops::embedding_backward(tok, g, once);
  st::ops::embedding_backward(tok, g, twice);
  st::ops::embedding_backward(tok, g, twice);
  const auto a = once.to_floats(), b = twice.to_floats();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(b[i] - prefill[i], 2.0 * (a[i] - prefill[i]), 1e-5) << "element " << i;
}

TEST(Embedding, Bf16MatchesF32) {
  const std::vector<int32_t> tokens = {3, 0, 10, 3, 7, 3, 1};
  Tensor tok = make_i32(tokens, {7});
  const auto g = as_stored(random_floats(7 * 6, 9), DType::BF16);
  const auto prefill = as_stored(random_floats(11 * 6, 10), DType::BF16);
  Tensor dw32 = make(prefill, {11, 6});
  Tensor dw16 = make(prefill, {11, 6}, DType::BF16);
  st::ops::embedding_backward(tok, make(g, {7, 6}), dw32);
  st::ops::embedding_backward(tok, make(g, {7, 6}, DType::BF16), dw16);
  expect_bf16_matches("embedding dweight", dw16, dw32);
}

TEST(Embedding, TokenOutOfRangeNamesIt) {
  Tensor weight = Tensor::zeros({11, 6}, DType::F32);
  Tensor out = Tensor::zeros({3, 6}, DType::F32);
  std::string msg = error_of([&] { st::ops::embedding_forward(make_i32({1, 11, 2}, {3}), weight, out); });
  EXPECT_TRUE(contains(msg, "token 11") && contains(msg, "position 1") && contains(msg, "[0, 11)")) << msg;
  msg = error_of([&] { st::ops::embedding_backward(make_i32({-1, 1, 2}, {3}), out, weight); });
  EXPECT_TRUE(contains(msg, "token -1") && contains(msg, "position 0")) << msg;
  // Nothing was written before the check failed.
  EXPECT_EQ(st::ops::sum_of_squares(weight), 0.0);
}

TEST(Embedding, ShapeMismatchNamesBothShapes) {
  Tensor weight = Tensor::zeros({11, 6}, DType::F32);
  Tensor out = Tensor::zeros({3, 5}, DType::F32);
  const std::string msg = error_of([&] { st::ops::embedding_forward(make_i32({1, 2, 3}, {3}), weight, out); });
  EXPECT_TRUE(contains(msg, "[3, 5]") && contains(msg, "[11, 6]")) << msg;
}

// ---------------------------------------------------------------- RMSNorm

constexpr float kEps = 1e-5f;

TEST(RmsNorm, ForwardMatchesReference) {
  for (int64_t d : {6, 64}) {
    const int64_t n = 7;
    const auto x = random_floats(n * d, 11, 2.0f);
    const auto w = random_floats(d, 12);
    Tensor out = Tensor::zeros({n, d}, DType::F32);
    Tensor rstd = Tensor::zeros({n}, DType::F32);
    st::ops::rmsnorm_forward(make(x, {n, d}), make(w, {d}), kEps, out, rstd);
    const RmsRef ref = rmsnorm_ref(to_double(x), to_double(w), d, kEps);
    expect_forward_close("rmsnorm out", to_double(out), ref.out);
    expect_forward_close("rmsnorm rstd", to_double(rstd), ref.rstd);
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  const int64_t n = 7, d = 6;
  const auto x = random_floats(n * d, 13);
  const auto w = random_floats(d, 14);
  const auto r = random_floats(n * d, 15);
  Tensor xt = make(x, {n, d}), wt = make(w, {d});
  Tensor out = Tensor::zeros({n, d}, DType::F32), rstd = Tensor::zeros({n}, DType::F32);
  st::ops::rmsnorm_forward(xt, wt, kEps, out, rstd);
  Tensor dx = Tensor::full({n, d}, std::nan(""), DType::F32);  // written, not accumulated
  Tensor dw = Tensor::zeros({d}, DType::F32);
  st::ops::rmsnorm_backward(make(r, {n, d}), xt, wt, rstd, dx, dw);

  const Vec xd = to_double(x), wd = to_double(w), rd = to_double(r);
  expect_grad_close("rmsnorm dx", to_double(dx),
                    numeric_grad([&](const Vec& v) { return rmsnorm_ref(v, wd, d, kEps).out; }, xd, rd));
  expect_grad_close("rmsnorm dweight", to_double(dw),
                    numeric_grad([&](const Vec& v) { return rmsnorm_ref(xd, v, d, kEps).out; }, wd, rd));
}

TEST(RmsNorm, ParameterGradientAccumulatesAcrossCalls) {
  const int64_t n = 7, d = 6;
  Tensor x = make(random_floats(n * d, 16), {n, d}), w = make(random_floats(d, 17), {d});
  Tensor out = Tensor::zeros({n, d}, DType::F32), rstd = Tensor::zeros({n}, DType::F32);
  st::ops::rmsnorm_forward(x, w, kEps, out, rstd);
  Tensor g = make(random_floats(n * d, 18), {n, d});
  const auto prefill = random_floats(d, 19);
  Tensor once = make(prefill, {d}), twice = make(prefill, {d});
  Tensor dx1 = Tensor::zeros({n, d}, DType::F32), dx2 = Tensor::zeros({n, d}, DType::F32);
  st::ops::rmsnorm_backward(g, x, w, rstd, dx1, once);
  st::ops::rmsnorm_backward(g, x, w, rstd, dx2, twice);
  st::ops::rmsnorm_backward(g, x, w, rstd, dx2, twice);
  const auto a = once.to_floats(), b = twice.to_floats();
  for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(b[i] - prefill[i], 2.0 * (a[i] - prefill[i]), 1e-5) << i;
  // The input gradient is written, so the second call leaves the same dx.
  expect_bitwise_equal("rmsnorm dx", dx1, dx2);
}

TEST(RmsNorm, Bf16MatchesF32) {
  const int64_t n = 7, d = 6;
  const auto x = as_stored(random_floats(n * d, 20), DType::BF16);
  const auto w = as_stored(random_floats(d, 21), DType::BF16);
  const auto g = as_stored(random_floats(n * d, 22), DType::BF16);
  const auto prefill = as_stored(random_floats(d, 23), DType::BF16);
  Tensor out[2], rstd[2], dx[2], dw[2];
  const DType dtypes[2] = {DType::F32, DType::BF16};
  for (int i = 0; i < 2; ++i) {
    const DType t = dtypes[i];
    Tensor xt = make(x, {n, d}, t), wt = make(w, {d}, t);
    out[i] = Tensor::zeros({n, d}, t);
    rstd[i] = Tensor::zeros({n}, DType::F32);
    dx[i] = Tensor::zeros({n, d}, t);
    dw[i] = make(prefill, {d}, t);
    st::ops::rmsnorm_forward(xt, wt, kEps, out[i], rstd[i]);
    st::ops::rmsnorm_backward(make(g, {n, d}, t), xt, wt, rstd[i], dx[i], dw[i]);
  }
  expect_bf16_matches("rmsnorm out", out[1], out[0]);
  expect_bitwise_equal("rmsnorm rstd", rstd[1], rstd[0]);
  expect_bf16_matches("rmsnorm dx", dx[1], dx[0]);
  expect_bf16_matches("rmsnorm dweight", dw[1], dw[0]);
}

TEST(RmsNorm, MixedDtypesBf16ActivationsF32Weight) {
  // Each operand may have its own dtype: BF16 activations with an F32 weight
  // and an F32 gradient round only the BF16 outputs.
  const int64_t n = 7, d = 6;
  const auto x = as_stored(random_floats(n * d, 26), DType::BF16);
  const auto g = as_stored(random_floats(n * d, 27), DType::BF16);
  Tensor w = make(random_floats(d, 28), {d});
  Tensor out32 = Tensor::zeros({n, d}, DType::F32), out16 = Tensor::zeros({n, d}, DType::BF16);
  Tensor rstd32 = Tensor::zeros({n}, DType::F32), rstd16 = Tensor::zeros({n}, DType::F32);
  Tensor dx32 = Tensor::zeros({n, d}, DType::F32), dx16 = Tensor::zeros({n, d}, DType::BF16);
  Tensor dw32 = Tensor::zeros({d}, DType::F32), dw_mixed = Tensor::zeros({d}, DType::F32);
  st::ops::rmsnorm_forward(make(x, {n, d}), w, kEps, out32, rstd32);
  st::ops::rmsnorm_forward(make(x, {n, d}, DType::BF16), w, kEps, out16, rstd16);
  st::ops::rmsnorm_backward(make(g, {n, d}), make(x, {n, d}), w, rstd32, dx32, dw32);
  st::ops::rmsnorm_backward(make(g, {n, d}, DType::BF16), make(x, {n, d}, DType::BF16), w, rstd16, dx16, dw_mixed);
  expect_bf16_matches("rmsnorm out", out16, out32);
  expect_bf16_matches("rmsnorm dx", dx16, dx32);
  expect_bitwise_equal("rmsnorm dweight (F32)", dw_mixed, dw32);
}

TEST(RmsNorm, OutputMayAliasInput) {
  const int64_t n = 7, d = 6;
  const auto x = random_floats(n * d, 24);
  Tensor w = make(random_floats(d, 25), {d});
  Tensor separate = Tensor::zeros({n, d}, DType::F32), rstd = Tensor::zeros({n}, DType::F32);
  st::ops::rmsnorm_forward(make(x, {n, d}), w, kEps, separate, rstd);
  Tensor in_place = make(x, {n, d});
  st::ops::rmsnorm_forward(in_place, w, kEps, in_place, rstd);
  expect_bitwise_equal("rmsnorm in place", in_place, separate);
}

TEST(RmsNorm, ShapeMismatchNamesBothShapes) {
  Tensor x = Tensor::zeros({7, 6}, DType::F32), out = Tensor::zeros({7, 6}, DType::F32);
  Tensor rstd = Tensor::zeros({7}, DType::F32);
  std::string msg = error_of([&] { st::ops::rmsnorm_forward(x, Tensor::zeros({5}, DType::F32), kEps, out, rstd); });
  EXPECT_TRUE(contains(msg, "[5]") && contains(msg, "[7, 6]")) << msg;
  msg = error_of(
      [&] { st::ops::rmsnorm_forward(x, Tensor::zeros({6}, DType::F32), kEps, out, Tensor::zeros({7}, DType::BF16)); });
  EXPECT_TRUE(contains(msg, "rstd") && contains(msg, "F32") && contains(msg, "BF16")) << msg;
  msg = error_of([&] {
    st::ops::rmsnorm_forward(x, Tensor::zeros({6}, DType::F32), kEps, Tensor::zeros({6, 7}, DType::F32), rstd);
  });
  EXPECT_TRUE(contains(msg, "[6, 7]") && contains(msg, "[7, 6]")) << msg;
}

// ---------------------------------------------------------------- residual add + RMSNorm

// Shapes of the fused ops' tests: tiny, a width with a vector remainder, and
// m8's width over enough rows for several parallel blocks.
struct NormDims {
  int64_t n, d;
};
constexpr NormDims kNormDims[] = {{7, 6}, {9, 37}, {70, 288}};

TEST(AddRmsNorm, ForwardBitIdenticalToAddThenRmsNorm) {
  for (const NormDims& dims : kNormDims) {
    for (DType t : {DType::F32, DType::BF16}) {
      for (DType wt : {t, DType::F32}) {
        const int64_t n = dims.n, d = dims.d;
        Tensor x = make(as_stored(random_floats(n * d, 30, 2.0f), t), {n, d}, t);
        Tensor delta = make(as_stored(random_floats(n * d, 31), t), {n, d}, t);
        Tensor w = make(as_stored(random_floats(d, 32), wt), {d}, wt);
        // The chain: h = x + delta in place, then the norm of h.
        Tensor h_ref = delta.clone(), out_ref = Tensor::zeros({n, d}, t), rstd_ref = Tensor::zeros({n}, DType::F32);
        st::ops::add(x, h_ref, h_ref);
        st::ops::rmsnorm_forward(h_ref, w, kEps, out_ref, rstd_ref);
        // Fused into a separate h, and in place over delta as DecoderLayer does.
        Tensor h = Tensor::full({n, d}, std::nan(""), t), out = Tensor::zeros({n, d}, t);
        Tensor rstd = Tensor::zeros({n}, DType::F32);
        st::ops::add_rmsnorm_forward(x, delta, w, kEps, h, out, rstd);
        expect_bitwise_equal("fused h", h, h_ref);
        expect_bitwise_equal("fused out", out, out_ref);
        expect_bitwise_equal("fused rstd", rstd, rstd_ref);
        Tensor in_place = delta.clone(), out2 = Tensor::zeros({n, d}, t);
        st::ops::add_rmsnorm_forward(x, in_place, w, kEps, in_place, out2, rstd);
        expect_bitwise_equal("fused h in place", in_place, h_ref);
        expect_bitwise_equal("fused out (h in place)", out2, out_ref);
      }
    }
  }
}

TEST(AddRmsNorm, BackwardBitIdenticalToRmsNormBackwardThenAdd) {
  for (const NormDims& dims : kNormDims) {
    for (DType t : {DType::F32, DType::BF16}) {
      const int64_t n = dims.n, d = dims.d;
      Tensor x = make(as_stored(random_floats(n * d, 33, 2.0f), t), {n, d}, t);
      Tensor w = make(as_stored(random_floats(d, 34), t), {d}, t);
      Tensor g = make(as_stored(random_floats(n * d, 35), t), {n, d}, t);
      Tensor res = make(as_stored(random_floats(n * d, 36), t), {n, d}, t);
      const auto prefill = as_stored(random_floats(d, 37), t);
      Tensor out = Tensor::zeros({n, d}, t), rstd = Tensor::zeros({n}, DType::F32);
      st::ops::rmsnorm_forward(x, w, kEps, out, rstd);
      // The chain: dx = rmsnorm_backward, then dx = residual + dx.
      Tensor dx_ref = Tensor::zeros({n, d}, t), dw_ref = make(prefill, {d}, t);
      st::ops::rmsnorm_backward(g, x, w, rstd, dx_ref, dw_ref);
      st::ops::add(res, dx_ref, dx_ref);
      Tensor dx = Tensor::full({n, d}, std::nan(""), t), dw = make(prefill, {d}, t);
      st::ops::rmsnorm_backward_add(g, x, w, rstd, res, dx, dw);
      expect_bitwise_equal("fused dx", dx, dx_ref);
      expect_bitwise_equal("fused dweight", dw, dw_ref);
      // dx may be the residual itself.
      Tensor in_place = res.clone(), dw2 = make(prefill, {d}, t);
      st::ops::rmsnorm_backward_add(g, x, w, rstd, in_place, in_place, dw2);
      expect_bitwise_equal("fused dx in place", in_place, dx_ref);
      expect_bitwise_equal("fused dweight (dx in place)", dw2, dw_ref);
    }
  }
}

TEST(AddRmsNorm, Bf16MatchesF32) {
  // The fused BF16 ops against the fused F32 ones on the same BF16 values:
  // each stored output within one BF16 ulp (h and out are normalised from
  // the rounded h, so out follows h's rounding).
  const int64_t n = 9, d = 37;
  const auto x = as_stored(random_floats(n * d, 38), DType::BF16);
  const auto delta = as_stored(random_floats(n * d, 39), DType::BF16);
  const auto w = as_stored(random_floats(d, 40), DType::BF16);
  Tensor h[2], out[2];
  const DType dtypes[2] = {DType::F32, DType::BF16};
  for (int i = 0; i < 2; ++i) {
    const DType t = dtypes[i];
    h[i] = Tensor::zeros({n, d}, t);
    out[i] = Tensor::zeros({n, d}, t);
    Tensor rstd = Tensor::zeros({n}, DType::F32);
    st::ops::add_rmsnorm_forward(make(x, {n, d}, t), make(delta, {n, d}, t), make(w, {d}, t), kEps, h[i], out[i], rstd);
  }
  expect_bf16_matches("fused h", h[1], h[0]);
  // out[1] is the norm of the rounded h: compare with F32's norm of that h.
  Tensor out_of_rounded = Tensor::zeros({n, d}, DType::F32), rstd = Tensor::zeros({n}, DType::F32);
  st::ops::rmsnorm_forward(st::ops::cast(h[1], DType::F32), make(w, {d}), kEps, out_of_rounded, rstd);
  expect_bf16_matches("fused out", out[1], out_of_rounded);
}

TEST(AddRmsNorm, OverlappingOutputIsNamed) {
  const int64_t n = 7, d = 6;
  Tensor x = Tensor::zeros({n, d}, DType::F32), h = Tensor::zeros({n, d}, DType::F32);
  Tensor w = Tensor::zeros({d}, DType::F32), rstd = Tensor::zeros({n}, DType::F32);
  std::string msg = error_of([&] { st::ops::add_rmsnorm_forward(x, x, w, kEps, h, h, rstd); });
  EXPECT_TRUE(contains(msg, "add_rmsnorm_forward: out") && contains(msg, "it must be a separate buffer")) << msg;
  msg = error_of([&] {
    st::ops::rmsnorm_backward_add(x, x, w, rstd, Tensor::zeros({n, d + 1}, DType::F32), h, w.clone());
  });
  EXPECT_TRUE(contains(msg, "rmsnorm_backward_add: residual has shape [7, 7]")) << msg;
}

// ---------------------------------------------------------------- RoPE

struct RopeTables {
  Tensor cos, sin;
};

RopeTables make_tables(int64_t seq, int64_t hd, double theta = 10000.0) {
  RopeTables t{Tensor::zeros({seq, hd}, DType::F32), Tensor::zeros({seq, hd}, DType::F32)};
  st::ops::rope_tables(seq, hd, theta, t.cos, t.sin);
  return t;
}

TEST(Rope, TablesFollowHuggingFaceLayout) {
  const int64_t seq = 5, hd = 6;
  for (double theta : {10000.0, 500000.0}) {
    const RopeTables tab = make_tables(seq, hd, theta);
    const auto c = tab.cos.to_floats(), s = tab.sin.to_floats();
    for (int64_t t = 0; t < seq; ++t)
      for (int64_t i = 0; i < hd; ++i) {
        const int64_t j = i % (hd / 2);  // cat((freqs, freqs))
        const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(j) / hd);
        EXPECT_NEAR(c[t * hd + i], std::cos(angle), 2e-6) << "t " << t << " i " << i;
        EXPECT_NEAR(s[t * hd + i], std::sin(angle), 2e-6) << "t " << t << " i " << i;
      }
  }
}

TEST(Rope, ForwardMatchesRotateHalf) {
  const int64_t b = 2, seq = 5, heads = 3, hd = 6;
  const RopeTables tab = make_tables(seq, hd);
  const auto x = random_floats(b * seq * heads * hd, 30);
  Tensor xt = make(x, {b, seq, heads, hd});
  st::ops::rope_forward(xt, tab.cos, tab.sin);
  const Vec want = rope_ref(to_double(x), to_double(tab.cos), to_double(tab.sin), b, seq, heads, hd);
  expect_forward_close("rope forward", to_double(xt), want, 1e-6);
  // Position 0 is the identity.
  for (int64_t i = 0; i < heads * hd; ++i) EXPECT_EQ(xt.to_floats()[i], x[i]);
}

TEST(Rope, BackwardInvertsForward) {
  const int64_t b = 2, seq = 5, heads = 3, hd = 6;
  const RopeTables tab = make_tables(seq, hd);
  const auto x = random_floats(b * seq * heads * hd, 31);
  Tensor xt = make(x, {b, seq, heads, hd});
  st::ops::rope_forward(xt, tab.cos, tab.sin);
  st::ops::rope_backward(xt, tab.cos, tab.sin);
  expect_forward_close("rope backward(forward(x))", to_double(xt), to_double(x), 1e-6);
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  const int64_t b = 2, seq = 5, heads = 3, hd = 6;
  const RopeTables tab = make_tables(seq, hd);
  const auto x = random_floats(b * seq * heads * hd, 32);
  const auto r = random_floats(b * seq * heads * hd, 33);
  Tensor dx = make(r, {b, seq, heads, hd});
  st::ops::rope_backward(dx, tab.cos, tab.sin);
  const Vec c = to_double(tab.cos), s = to_double(tab.sin);
  auto f = [&](const Vec& v) { return rope_ref(v, c, s, b, seq, heads, hd); };
  expect_grad_close("rope dx", to_double(dx), numeric_grad(f, to_double(x), to_double(r)));
}

TEST(Rope, LongerTablesServeShorterSequences) {
  const int64_t b = 1, seq = 5, heads = 2, hd = 6;
  const auto x = random_floats(b * seq * heads * hd, 34);
  const RopeTables exact = make_tables(seq, hd), longer = make_tables(9, hd);
  Tensor a = make(x, {b, seq, heads, hd}), c = make(x, {b, seq, heads, hd});
  st::ops::rope_forward(a, exact.cos, exact.sin);
  st::ops::rope_forward(c, longer.cos, longer.sin);
  expect_bitwise_equal("rope with longer tables", c, a);
}

TEST(Rope, Bf16MatchesF32) {
  const int64_t b = 2, seq = 5, heads = 3, hd = 6;
  const RopeTables tab = make_tables(seq, hd);
  const auto x = as_stored(random_floats(b * seq * heads * hd, 35), DType::BF16);
  for (int direction = 0; direction < 2; ++direction) {
    Tensor x32 = make(x, {b, seq, heads, hd}), x16 = make(x, {b, seq, heads, hd}, DType::BF16);
    for (const Tensor& t : {x32, x16}) {
      if (direction == 0) {
        st::ops::rope_forward(t, tab.cos, tab.sin);
      } else {
        st::ops::rope_backward(t, tab.cos, tab.sin);
      }
    }
    expect_bf16_matches(direction == 0 ? "rope forward" : "rope backward", x16, x32);
  }
}

TEST(Rope, BadShapesNameThem) {
  const RopeTables tab = make_tables(5, 6);
  std::string msg = error_of([&] { st::ops::rope_forward(Tensor::zeros({1, 6, 2, 6}, DType::F32), tab.cos, tab.sin); });
  EXPECT_TRUE(contains(msg, "[5, 6]") && contains(msg, "[1, 6, 2, 6]")) << msg;
  msg = error_of([&] {
    Tensor c = Tensor::zeros({5, 5}, DType::F32), s = Tensor::zeros({5, 5}, DType::F32);
    st::ops::rope_tables(5, 5, 10000.0, c, s);
  });
  EXPECT_TRUE(contains(msg, "head_dim") && contains(msg, "5")) << msg;
  msg = error_of([&] { st::ops::rope_forward(Tensor::zeros({5, 2, 6}, DType::F32), tab.cos, tab.sin); });
  EXPECT_TRUE(contains(msg, "[5, 2, 6]")) << msg;
}

// ---------------------------------------------------------------- attention

class Attention : public ::testing::TestWithParam<AttnDims> {};

struct AttnInputs {
  std::vector<float> q, k, v;
};

AttnInputs attention_inputs(const AttnDims& d, uint32_t seed) {
  return {random_floats(d.b * d.t * d.h * d.hd, seed), random_floats(d.b * d.t * d.kv * d.hd, seed + 1),
          random_floats(d.b * d.t * d.kv * d.hd, seed + 2)};
}

TEST_P(Attention, ForwardMatchesNaiveSoftmax) {
  const AttnDims d = GetParam();
  const AttnInputs in = attention_inputs(d, 40);
  Tensor out = Tensor::full({d.b, d.t, d.h, d.hd}, std::nan(""), DType::F32);
  Tensor lse = Tensor::zeros({d.b, d.h, d.t}, DType::F32);
  st::ops::attention_forward(make(in.q, {d.b, d.t, d.h, d.hd}), make(in.k, {d.b, d.t, d.kv, d.hd}),
                             make(in.v, {d.b, d.t, d.kv, d.hd}), out, lse);
  const AttnRef ref = attention_ref(to_double(in.q), to_double(in.k), to_double(in.v), d);
  expect_forward_close("attention out", to_double(out), ref.out);
  expect_forward_close("attention lse", to_double(lse), ref.lse);
}

TEST_P(Attention, GradientsMatchFiniteDifferences) {
  const AttnDims d = GetParam();
  const AttnInputs in = attention_inputs(d, 41);
  const auto r = random_floats(d.b * d.t * d.h * d.hd, 44);
  const Shape qs{d.b, d.t, d.h, d.hd}, ks{d.b, d.t, d.kv, d.hd};
  Tensor q = make(in.q, qs), k = make(in.k, ks), v = make(in.v, ks);
  Tensor out = Tensor::zeros(qs, DType::F32), lse = Tensor::zeros({d.b, d.h, d.t}, DType::F32);
  st::ops::attention_forward(q, k, v, out, lse);
  // Prefilled with NaN: input gradients are written, never accumulated.
  Tensor dq = Tensor::full(qs, std::nan(""), DType::F32);
  Tensor dk = Tensor::full(ks, std::nan(""), DType::F32);
  Tensor dv = Tensor::full(ks, std::nan(""), DType::F32);
  st::ops::attention_backward(make(r, qs), q, k, v, out, lse, dq, dk, dv);

  const Vec qd = to_double(in.q), kd = to_double(in.k), vd = to_double(in.v), rd = to_double(r);
  expect_grad_close("attention dq", to_double(dq),
                    numeric_grad([&](const Vec& x) { return attention_ref(x, kd, vd, d).out; }, qd, rd));
  expect_grad_close("attention dk", to_double(dk),
                    numeric_grad([&](const Vec& x) { return attention_ref(qd, x, vd, d).out; }, kd, rd));
  expect_grad_close("attention dv", to_double(dv),
                    numeric_grad([&](const Vec& x) { return attention_ref(qd, kd, x, d).out; }, vd, rd));
}

// The last `n` positions of x [B, T, heads, hd].
std::vector<float> last_positions(const std::vector<float>& x, const AttnDims& d, int64_t heads, int64_t n) {
  std::vector<float> out;
  const int64_t row = heads * d.hd;
  for (int64_t b = 0; b < d.b; ++b) {
    const auto first = x.begin() + (b * d.t + d.t - n) * row;
    out.insert(out.end(), first, first + n * row);
  }
  return out;
}

struct AttnRun {
  Tensor out, lse, dq, dk, dv;
};

// Forward and backward of attention with every tensor in `dtype`. The
// backward reads `o` as the forward's output when given (so two runs compare
// their backward's own rounding only), else its own forward's.
AttnRun run_attention(const AttnInputs& in, const std::vector<float>& g, const AttnDims& d, DType dtype,
                      const std::vector<float>* o = nullptr) {
  const Shape qs{d.b, d.t, d.h, d.hd}, ks{d.b, d.t, d.kv, d.hd};
  AttnRun r{Tensor::zeros(qs, dtype), Tensor::zeros({d.b, d.h, d.t}, DType::F32), Tensor::full(qs, std::nan(""), dtype),
            Tensor::full(ks, std::nan(""), dtype), Tensor::full(ks, std::nan(""), dtype)};
  const Tensor q = make(in.q, qs, dtype), k = make(in.k, ks, dtype), v = make(in.v, ks, dtype);
  st::ops::attention_forward(q, k, v, r.out, r.lse);
  const Tensor out = o != nullptr ? make(*o, qs, dtype) : r.out;
  st::ops::attention_backward(make(g, qs, dtype), q, k, v, out, r.lse, r.dq, r.dk, r.dv);
  return r;
}

// BF16 operands (on AVX512_BF16 CPUs, the BF16 tile path of
// core/cpu/attention_bf16.h) against the F32 op on the same values.
void expect_bf16_attention_within_bound(const AttnDims& d, uint32_t seed) {
  const AttnInputs raw = attention_inputs(d, seed);
  const AttnInputs in{as_stored(raw.q, DType::BF16), as_stored(raw.k, DType::BF16), as_stored(raw.v, DType::BF16)};
  const auto g = as_stored(random_floats(d.b * d.t * d.h * d.hd, seed + 3), DType::BF16);
  const AttnRun half = run_attention(in, g, d, DType::BF16);
  const std::vector<float> o = half.out.to_floats();
  const AttnRun full = run_attention(in, g, d, DType::F32, &o);
  const st::test::AttnBounds bound =
      st::test::attention_bf16_bounds(to_double(in.q), to_double(in.k), to_double(in.v), to_double(g), d);
  st::test::expect_within_bound("attention out", half.out, full.out, bound.out);
  // lse sums F32 exponentials of scores that differ only by F32 summation
  // order (products of BF16 values are exact in F32): a few F32 ulps.
  expect_forward_close("attention lse", to_double(half.lse.to_floats()), to_double(full.lse.to_floats()), 4e-6);
  st::test::expect_within_bound("attention dq", half.dq, full.dq, bound.dq);
  st::test::expect_within_bound("attention dk", half.dk, full.dk, bound.dk);
  st::test::expect_within_bound("attention dv", half.dv, full.dv, bound.dv);
}

TEST_P(Attention, Bf16WithinItsBound) { expect_bf16_attention_within_bound(GetParam(), 45); }

// The shapes of the benchmark's m8 (hd 48) and of stories110M (hd 64), with
// partial tiles, so the BF16 kernels' padding and every micro-tile width run.
TEST(AttentionBf16, TrainingShapesWithinTheBound) {
  expect_bf16_attention_within_bound(AttnDims{1, 130, 2, 2, 48}, 60);
  expect_bf16_attention_within_bound(AttnDims{2, 67, 2, 1, 64}, 61);
  expect_bf16_attention_within_bound(AttnDims{1, 40, 1, 1, 37}, 62);  // odd head dim
}

// The BF16 path keeps the F32 path's determinism: a recomputed forward and
// backward are bit-identical, and a KV cache's queries get exactly their rows
// of the full pass (the same key tiles, and each product element sums the
// same terms in the same order whatever rows share its tile).
TEST(AttentionBf16, RecomputationAndCacheAreBitIdentical) {
  const AttnDims d{2, 130, 4, 2, 48};
  const AttnInputs in = attention_inputs(d, 63);
  const auto g = random_floats(d.b * d.t * d.h * d.hd, 66);
  const AttnRun first = run_attention(in, g, d, DType::BF16);
  const AttnRun again = run_attention(in, g, d, DType::BF16);
  expect_bitwise_equal("attention out", first.out, again.out);
  expect_bitwise_equal("attention lse", first.lse, again.lse);
  expect_bitwise_equal("attention dq", first.dq, again.dq);
  expect_bitwise_equal("attention dk", first.dk, again.dk);
  expect_bitwise_equal("attention dv", first.dv, again.dv);
  const Shape ks{d.b, d.t, d.kv, d.hd};
  for (int64_t tq : {int64_t{1}, int64_t{3}, int64_t{70}}) {
    const Shape tail{d.b, tq, d.h, d.hd};
    Tensor part = Tensor::zeros(tail, DType::BF16), part_lse = Tensor::zeros({d.b, d.h, tq}, DType::F32);
    st::ops::attention_forward(make(last_positions(in.q, d, d.h, tq), tail, DType::BF16), make(in.k, ks, DType::BF16),
                               make(in.v, ks, DType::BF16), part, part_lse);
    EXPECT_EQ(part.to_floats(), last_positions(first.out.to_floats(), d, d.h, tq)) << "Tq " << tq;
  }
}

TEST_P(Attention, RecomputationIsBitIdentical) {
  const AttnDims d = GetParam();
  const AttnInputs in = attention_inputs(d, 49);
  const Shape qs{d.b, d.t, d.h, d.hd}, ks{d.b, d.t, d.kv, d.hd};
  Tensor q = make(in.q, qs), k = make(in.k, ks), v = make(in.v, ks), g = make(random_floats(q.numel(), 52), qs);
  Tensor out[2], lse[2], dq[2], dk[2], dv[2];
  for (int i = 0; i < 2; ++i) {
    out[i] = Tensor::zeros(qs, DType::F32);
    lse[i] = Tensor::zeros({d.b, d.h, d.t}, DType::F32);
    dq[i] = Tensor::zeros(qs, DType::F32);
    dk[i] = Tensor::zeros(ks, DType::F32);
    dv[i] = Tensor::zeros(ks, DType::F32);
    st::ops::attention_forward(q, k, v, out[i], lse[i]);
    st::ops::attention_backward(g, q, k, v, out[i], lse[i], dq[i], dk[i], dv[i]);
  }
  expect_bitwise_equal("attention out", out[0], out[1]);
  expect_bitwise_equal("attention lse", lse[0], lse[1]);
  expect_bitwise_equal("attention dq", dq[0], dq[1]);
  expect_bitwise_equal("attention dk", dk[0], dk[1]);
  expect_bitwise_equal("attention dv", dv[0], dv[1]);
}

// A KV cache's step: the last tq queries against all T keys give the rows of
// the full pass for those positions (same key tiles, same softmax; the
// products' rounding may differ with the number of query rows).
TEST_P(Attention, FewerQueriesThanKeysGiveTheLastRows) {
  const AttnDims d = GetParam();
  const AttnInputs in = attention_inputs(d, 53);
  const Shape qs{d.b, d.t, d.h, d.hd}, ks{d.b, d.t, d.kv, d.hd};
  Tensor out = Tensor::zeros(qs, DType::F32), lse = Tensor::zeros({d.b, d.h, d.t}, DType::F32);
  st::ops::attention_forward(make(in.q, qs), make(in.k, ks), make(in.v, ks), out, lse);
  for (int64_t tq : {int64_t{1}, std::min<int64_t>(2, d.t), d.t}) {
    const Shape tail{d.b, tq, d.h, d.hd};
    Tensor part = Tensor::full(tail, std::nan(""), DType::F32), part_lse = Tensor::zeros({d.b, d.h, tq}, DType::F32);
    st::ops::attention_forward(make(last_positions(in.q, d, d.h, tq), tail), make(in.k, ks), make(in.v, ks), part,
                               part_lse);
    expect_forward_close("cached attention out", to_double(part),
                         to_double(last_positions(out.to_floats(), d, d.h, tq)), 1e-6);
    if (tq == d.t) expect_bitwise_equal("attention with Tq == Tk", part, out);
  }
}

// "B2_T5_H4_KV2_hd6". A stream, not operator+ chains, which GCC 12 warns about.
std::string attention_case_name(const ::testing::TestParamInfo<AttnDims>& param) {
  const AttnDims& d = param.param;
  std::ostringstream os;
  os << "B" << d.b << "_T" << d.t << "_H" << d.h << "_KV" << d.kv << "_hd" << d.hd;
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnDims{2, 5, 4, 2, 6},    // GQA, two query heads per K/V head
                                           AttnDims{1, 5, 4, 4, 6},    // H == KV
                                           AttnDims{2, 7, 3, 1, 4},    // one K/V head for all
                                           AttnDims{1, 1, 2, 2, 6},    // a single position
                                           AttnDims{1, 32, 4, 2, 16},  // the CPU training config's attention
                                           AttnDims{1, 150, 2, 1, 4}   // three query/key tiles, the last partial
                                           ),
                         attention_case_name);

TEST(AttentionErrors, ShapeMismatchNamesBothShapes) {
  Tensor q = Tensor::zeros({2, 5, 4, 6}, DType::F32), out = Tensor::zeros({2, 5, 4, 6}, DType::F32);
  Tensor lse = Tensor::zeros({2, 4, 5}, DType::F32);
  Tensor k3 = Tensor::zeros({2, 5, 3, 6}, DType::F32);
  std::string msg = error_of([&] { st::ops::attention_forward(q, k3, k3, out, lse); });
  EXPECT_TRUE(contains(msg, "[2, 5, 4, 6]") && contains(msg, "[2, 5, 3, 6]")) << msg;
  Tensor k = Tensor::zeros({2, 5, 2, 6}, DType::F32);
  msg = error_of([&] { st::ops::attention_forward(q, k, k, out, Tensor::zeros({2, 5, 4}, DType::F32)); });
  EXPECT_TRUE(contains(msg, "lse") && contains(msg, "[2, 5, 4]") && contains(msg, "[2, 4, 5]")) << msg;
  msg = error_of([&] { st::ops::attention_forward(q, k, k, q, lse); });
  EXPECT_TRUE(contains(msg, "overlaps")) << msg;
  // More queries than keys, and backward with fewer: both name the shapes.
  Tensor k4 = Tensor::zeros({2, 4, 2, 6}, DType::F32);
  msg = error_of([&] { st::ops::attention_forward(q, k4, k4, out, lse); });
  EXPECT_TRUE(contains(msg, "[2, 5, 4, 6]") && contains(msg, "[2, 4, 2, 6]")) << msg;
  Tensor q4 = Tensor::zeros({2, 4, 4, 6}, DType::F32), lse4 = Tensor::zeros({2, 4, 4}, DType::F32);
  Tensor dq4 = Tensor::zeros({2, 4, 4, 6}, DType::F32), dk = Tensor::zeros({2, 5, 2, 6}, DType::F32);
  Tensor dv = Tensor::zeros({2, 5, 2, 6}, DType::F32);
  msg = error_of([&] { st::ops::attention_backward(q4, q4, k, k, q4, lse4, dq4, dk, dv); });
  EXPECT_TRUE(contains(msg, "[2, 4, 4, 6]") && contains(msg, "[2, 5, 2, 6]") && contains(msg, "q's T")) << msg;
}

// ---------------------------------------------------------------- SwiGLU

TEST(SwiGlu, ForwardMatchesReference) {
  const int64_t n = 7, f = 11;
  const auto g = random_floats(n * f, 60, 3.0f), u = random_floats(n * f, 61);
  Tensor out = Tensor::zeros({n, f}, DType::F32);
  st::ops::swiglu_forward(make(g, {n, f}), make(u, {n, f}), out);
  expect_forward_close("swiglu out", to_double(out), swiglu_ref(to_double(g), to_double(u)));
}

TEST(SwiGlu, GradientsMatchFiniteDifferences) {
  const int64_t n = 7, f = 11;
  const auto g = random_floats(n * f, 62, 3.0f), u = random_floats(n * f, 63), r = random_floats(n * f, 64);
  Tensor dg = Tensor::full({n, f}, std::nan(""), DType::F32), du = Tensor::full({n, f}, std::nan(""), DType::F32);
  st::ops::swiglu_backward(make(r, {n, f}), make(g, {n, f}), make(u, {n, f}), dg, du);
  const Vec gd = to_double(g), ud = to_double(u), rd = to_double(r);
  expect_grad_close("swiglu dgate", to_double(dg),
                    numeric_grad([&](const Vec& x) { return swiglu_ref(x, ud); }, gd, rd));
  expect_grad_close("swiglu dup", to_double(du), numeric_grad([&](const Vec& x) { return swiglu_ref(gd, x); }, ud, rd));
}

TEST(SwiGlu, Bf16MatchesF32) {
  const int64_t n = 7, f = 11;
  const auto g = as_stored(random_floats(n * f, 65, 3.0f), DType::BF16);
  const auto u = as_stored(random_floats(n * f, 66), DType::BF16);
  const auto r = as_stored(random_floats(n * f, 67), DType::BF16);
  Tensor out[2], dg[2], du[2];
  const DType dtypes[2] = {DType::F32, DType::BF16};
  for (int i = 0; i < 2; ++i) {
    const DType t = dtypes[i];
    out[i] = Tensor::zeros({n, f}, t);
    dg[i] = Tensor::zeros({n, f}, t);
    du[i] = Tensor::zeros({n, f}, t);
    st::ops::swiglu_forward(make(g, {n, f}, t), make(u, {n, f}, t), out[i]);
    st::ops::swiglu_backward(make(r, {n, f}, t), make(g, {n, f}, t), make(u, {n, f}, t), dg[i], du[i]);
  }
  expect_bf16_matches("swiglu out", out[1], out[0]);
  expect_bf16_matches("swiglu dgate", dg[1], dg[0]);
  expect_bf16_matches("swiglu dup", du[1], du[0]);
}

TEST(SwiGlu, GradientsMayOverwriteInputs) {
  const int64_t n = 3, f = 5000;  // more than one chunk of the CPU kernel
  for (DType t : {DType::F32, DType::BF16}) {
    const auto g = as_stored(random_floats(n * f, 68), t), u = as_stored(random_floats(n * f, 69), t);
    const auto r = as_stored(random_floats(n * f, 70), t);
    Tensor dg = Tensor::zeros({n, f}, t), du = Tensor::zeros({n, f}, t);
    st::ops::swiglu_backward(make(r, {n, f}, t), make(g, {n, f}, t), make(u, {n, f}, t), dg, du);
    Tensor gate = make(g, {n, f}, t), up = make(u, {n, f}, t);
    st::ops::swiglu_backward(make(r, {n, f}, t), gate, up, gate, up);
    expect_bitwise_equal("swiglu dgate in place", gate, dg);
    expect_bitwise_equal("swiglu dup in place", up, du);
  }
}

TEST(SwiGlu, ShapeMismatchNamesBothShapes) {
  const std::string msg = error_of([&] {
    st::ops::swiglu_forward(Tensor::zeros({7, 11}, DType::F32), Tensor::zeros({7, 10}, DType::F32),
                            Tensor::zeros({7, 11}, DType::F32));
  });
  EXPECT_TRUE(contains(msg, "[7, 11]") && contains(msg, "[7, 10]")) << msg;
}

// ---------------------------------------------------------------- ReLU

TEST(Relu, ForwardBackwardAndGradient) {
  const int64_t n = 7, f = 11;
  const auto x = random_floats(n * f, 71, 1.0f, 0.05f);  // away from the kink
  const auto r = random_floats(n * f, 72);
  Tensor out = Tensor::zeros({n, f}, DType::F32);
  st::ops::relu_forward(make(x, {n, f}), out);
  EXPECT_EQ(to_double(out), relu_ref(to_double(x)));
  Tensor dx = Tensor::full({n, f}, std::nan(""), DType::F32);
  st::ops::relu_backward(make(r, {n, f}), make(x, {n, f}), dx);
  expect_grad_close("relu dx", to_double(dx), numeric_grad(relu_ref, to_double(x), to_double(r)));
  // dx may be dout itself.
  Tensor g = make(r, {n, f});
  st::ops::relu_backward(g, make(x, {n, f}), g);
  expect_bitwise_equal("relu dx in place", g, dx);
}

TEST(Relu, Bf16MatchesF32AndNanPropagates) {
  const auto x = as_stored(random_floats(77, 73), DType::BF16), r = as_stored(random_floats(77, 74), DType::BF16);
  Tensor out[2], dx[2];
  const DType dtypes[2] = {DType::F32, DType::BF16};
  for (int i = 0; i < 2; ++i) {
    out[i] = Tensor::zeros({77}, dtypes[i]);
    dx[i] = Tensor::zeros({77}, dtypes[i]);
    st::ops::relu_forward(make(x, {77}, dtypes[i]), out[i]);
    st::ops::relu_backward(make(r, {77}, dtypes[i]), make(x, {77}, dtypes[i]), dx[i]);
  }
  expect_bf16_matches("relu out", out[1], out[0]);
  expect_bf16_matches("relu dx", dx[1], dx[0]);
  Tensor nan_out = Tensor::zeros({2}, DType::F32);
  st::ops::relu_forward(make({std::nanf(""), -1.0f}, {2}), nan_out);
  EXPECT_TRUE(std::isnan(nan_out.to_floats()[0]));
  EXPECT_EQ(nan_out.to_floats()[1], 0.0f);
}

// ---------------------------------------------------------------- cross-entropy

constexpr int64_t kIgnore = -100;

TEST(CrossEntropy, MatchesLogSumExpAndIgnoresRows) {
  const int64_t n = 7, vocab = 11;
  const std::vector<int32_t> targets = {3, kIgnore, 0, 10, 5, kIgnore, 3};
  for (float offset : {0.0f, 1000.0f}) {  // large logits must not overflow
    auto logits = random_floats(n * vocab, 80, 2.0f);
    for (float& x : logits) x += offset;
    const float grad_scale = 1.0f / 5.0f;
    Tensor dlogits = Tensor::full({n, vocab}, std::nan(""), DType::F32);
    const st::ops::LossSum loss =
        st::ops::cross_entropy(make(logits, {n, vocab}), make_i32(targets, {n}), kIgnore, grad_scale, dlogits);
    const st::ops::LossSum ref = cross_entropy_ref(to_double(logits), targets, vocab, kIgnore);
    EXPECT_EQ(loss.count, 5);
    EXPECT_EQ(ref.count, 5);
    EXPECT_NEAR(loss.sum, ref.sum, 1e-5 * std::max(1.0, std::fabs(ref.sum)));

    const auto g = dlogits.to_floats();
    for (int64_t r = 0; r < n; ++r) {
      double row_sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) {
        if (targets[r] == kIgnore) {
          EXPECT_EQ(g[r * vocab + i], 0.0f) << "ignored row " << r;
        }
        row_sum += g[r * vocab + i];
      }
      EXPECT_NEAR(row_sum, 0.0, 1e-6) << "row " << r;  // softmax minus one-hot sums to 0
    }
  }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t n = 7, vocab = 11;
  const std::vector<int32_t> targets = {3, kIgnore, 0, 10, 5, 2, 3};
  const auto logits = random_floats(n * vocab, 81, 2.0f);
  const float grad_scale = 1.0f / 6.0f;
  Tensor dlogits = Tensor::zeros({n, vocab}, DType::F32);
  st::ops::cross_entropy(make(logits, {n, vocab}), make_i32(targets, {n}), kIgnore, grad_scale, dlogits);
  auto f = [&](const Vec& x) { return Vec{cross_entropy_ref(x, targets, vocab, kIgnore).sum * grad_scale}; };
  expect_grad_close("cross_entropy dlogits", to_double(dlogits), numeric_grad(f, to_double(logits), Vec{1.0}));
}

TEST(CrossEntropy, DlogitsMayAliasLogits) {
  const int64_t n = 7, vocab = 11;
  const std::vector<int32_t> targets = {3, kIgnore, 0, 10, 5, 2, 3};
  for (DType t : {DType::F32, DType::BF16}) {
    const auto logits = as_stored(random_floats(n * vocab, 82), t);
    Tensor separate = Tensor::zeros({n, vocab}, t);
    const auto a = st::ops::cross_entropy(make(logits, {n, vocab}, t), make_i32(targets, {n}), kIgnore, 0.5f, separate);
    Tensor in_place = make(logits, {n, vocab}, t);
    const auto b = st::ops::cross_entropy(in_place, make_i32(targets, {n}), kIgnore, 0.5f, in_place);
    EXPECT_EQ(a.sum, b.sum);
    EXPECT_EQ(a.count, b.count);
    expect_bitwise_equal("cross_entropy in place", in_place, separate);
  }
}

TEST(CrossEntropy, Bf16MatchesF32) {
  const int64_t n = 7, vocab = 11;
  const std::vector<int32_t> targets = {3, kIgnore, 0, 10, 5, 2, 3};
  const auto logits = as_stored(random_floats(n * vocab, 83, 3.0f), DType::BF16);
  Tensor d32 = Tensor::zeros({n, vocab}, DType::F32), d16 = Tensor::zeros({n, vocab}, DType::BF16);
  const auto a = st::ops::cross_entropy(make(logits, {n, vocab}), make_i32(targets, {n}), kIgnore, 0.25f, d32);
  const auto b =
      st::ops::cross_entropy(make(logits, {n, vocab}, DType::BF16), make_i32(targets, {n}), kIgnore, 0.25f, d16);
  EXPECT_EQ(a.sum, b.sum);  // the same F32 arithmetic on the same values
  expect_bf16_matches("cross_entropy dlogits", d16, d32);
}

TEST(CrossEntropy, BadTargetNamesRowAndValue) {
  const int64_t n = 7, vocab = 11;
  const auto logits = random_floats(n * vocab, 84);
  Tensor lt = make(logits, {n, vocab});
  std::string msg = error_of([&] {
    st::ops::cross_entropy(lt, make_i32({3, 0, 1, 2, 11, 4, 5}, {n}), kIgnore, 1.0f, lt);
  });
  EXPECT_TRUE(contains(msg, "target 11") && contains(msg, "row 4") && contains(msg, "[0, 11)")) << msg;
  // Nothing was consumed before the check failed.
  EXPECT_EQ(lt.to_floats(), logits);
  msg = error_of([&] {
    st::ops::cross_entropy(lt, make_i32({0, 1, 2, 3, 4, 5}, {6}), kIgnore, 1.0f, Tensor::zeros({n, vocab}, DType::F32));
  });
  EXPECT_TRUE(contains(msg, "[6]") && contains(msg, "[7, 11]")) << msg;
}

// ---------------------------------------------------------------- MSE

TEST(Mse, MatchesReferenceAndGradient) {
  const int64_t n = 7, f = 3;
  const auto p = random_floats(n * f, 90), t = random_floats(n * f, 91);
  const float grad_scale = 1.0f / 21.0f;
  Tensor dp = Tensor::full({n, f}, std::nan(""), DType::F32);
  const auto loss = st::ops::mse(make(p, {n, f}), make(t, {n, f}), grad_scale, dp);
  double want = 0.0;
  for (size_t i = 0; i < p.size(); ++i) want += (double(p[i]) - t[i]) * (double(p[i]) - t[i]);
  EXPECT_EQ(loss.count, n * f);
  EXPECT_NEAR(loss.sum, want, 1e-6 * want);
  const Vec td = to_double(t);
  auto fn = [&](const Vec& x) {
    double s = 0.0;
    for (size_t i = 0; i < x.size(); ++i) s += (x[i] - td[i]) * (x[i] - td[i]);
    return Vec{s * grad_scale};
  };
  expect_grad_close("mse dpred", to_double(dp), numeric_grad(fn, to_double(p), Vec{1.0}));
}

TEST(Mse, Bf16MatchesF32AndMayAlias) {
  const auto p = as_stored(random_floats(77, 92), DType::BF16), t = as_stored(random_floats(77, 93), DType::BF16);
  Tensor d32 = Tensor::zeros({77}, DType::F32), d16 = Tensor::zeros({77}, DType::BF16);
  const auto a = st::ops::mse(make(p, {77}), make(t, {77}), 0.5f, d32);
  const auto b = st::ops::mse(make(p, {77}, DType::BF16), make(t, {77}, DType::BF16), 0.5f, d16);
  EXPECT_EQ(a.sum, b.sum);
  expect_bf16_matches("mse dpred", d16, d32);
  Tensor pred = make(p, {77});
  st::ops::mse(pred, make(t, {77}), 0.5f, pred);
  expect_bitwise_equal("mse dpred in place", pred, d32);
  const std::string msg = error_of([&] {
    st::ops::mse(make(p, {7, 11}), make(t, {11, 7}), 1.0f, Tensor::zeros({77}, DType::F32));
  });
  EXPECT_TRUE(contains(msg, "[7, 11]") && contains(msg, "[11, 7]")) << msg;
}

// ---------------------------------------------------------------- dtypes, devices

TEST(ModelOps, WrongDtypesAreNamed) {
  Tensor x = Tensor::zeros({7, 6}, DType::I32);
  std::string msg = error_of([&] { st::ops::relu_forward(x, Tensor::zeros({7, 6}, DType::F32)); });
  EXPECT_TRUE(contains(msg, "relu_forward") && contains(msg, "I32") && contains(msg, "[7, 6]")) << msg;
  msg = error_of([&] {
    st::ops::embedding_forward(Tensor::zeros({3}, DType::F32), Tensor::zeros({11, 6}, DType::F32),
                               Tensor::zeros({3, 6}, DType::F32));
  });
  EXPECT_TRUE(contains(msg, "tokens") && contains(msg, "I32")) << msg;
}

// ---------------------------------------------------------------- threads

// Runs `run` (which fills its outputs) with 1, 2 and 3 CPU threads and
// requires every output to be bit-identical across the three: block bounds
// and the order of cross-block sums depend on shapes only.
template <class Run>
void expect_same_for_thread_counts(const char* what, Run run) {
  const int saved = st::cpu::cpu_threads();
  std::vector<std::vector<uint8_t>> first;
  for (int threads : {1, 2, 3}) {
    st::cpu::set_cpu_threads(threads);
    const std::vector<Tensor> outs = run();
    std::vector<std::vector<uint8_t>> bytes;
    for (const Tensor& t : outs) {
      const auto* p = static_cast<const uint8_t*>(t.raw_data());
      bytes.emplace_back(p, p + t.nbytes());
    }
    if (first.empty()) {
      first = bytes;
    } else {
      for (size_t i = 0; i < bytes.size(); ++i)
        EXPECT_TRUE(bytes[i] == first[i]) << what << ": output " << i << " differs with " << threads << " threads";
    }
  }
  st::cpu::set_cpu_threads(saved);
}

// A double's bits as an I32 tensor [2], so bit comparisons cover loss sums.
Tensor double_bits(double v) {
  std::vector<int32_t> bits(2);
  std::memcpy(bits.data(), &v, sizeof v);
  return make_i32(bits, {2});
}

TEST(Threads, ResultsDoNotDependOnThreadCount) {
  for (DType t : {DType::F32, DType::BF16}) {
    // RMSNorm over several row blocks; dweight is a cross-block sum.
    const int64_t rows = 300, d = 96;
    const auto x = as_stored(random_floats(rows * d, 100), t), w = as_stored(random_floats(d, 101), t);
    const auto dy = as_stored(random_floats(rows * d, 102), t);
    expect_same_for_thread_counts("rmsnorm", [&] {
      Tensor out = Tensor::zeros({rows, d}, t), rstd = Tensor::zeros({rows}, DType::F32);
      Tensor dx = Tensor::zeros({rows, d}, t), dw = Tensor::zeros({d}, DType::F32);
      st::ops::rmsnorm_forward(make(x, {rows, d}, t), make(w, {d}, t), 1e-5f, out, rstd);
      st::ops::rmsnorm_backward(make(dy, {rows, d}, t), make(x, {rows, d}, t), make(w, {d}, t), rstd, dx, dw);
      return std::vector<Tensor>{out, rstd, dx, dw};
    });

    // Attention over several (batch, head, tile) units, GQA.
    const AttnDims a{2, 130, 4, 2, 16};
    const AttnInputs in = attention_inputs(a, 103);
    const auto go = as_stored(random_floats(a.b * a.t * a.h * a.hd, 104), t);
    const Shape qs{a.b, a.t, a.h, a.hd}, ks{a.b, a.t, a.kv, a.hd};
    expect_same_for_thread_counts("attention", [&] {
      Tensor q = make(as_stored(in.q, t), qs, t), k = make(as_stored(in.k, t), ks, t);
      Tensor v = make(as_stored(in.v, t), ks, t);
      Tensor out = Tensor::zeros(qs, t), lse = Tensor::zeros({a.b, a.h, a.t}, DType::F32);
      Tensor dq = Tensor::zeros(qs, t), dk = Tensor::zeros(ks, t), dv = Tensor::zeros(ks, t);
      st::ops::attention_forward(q, k, v, out, lse);
      st::ops::attention_backward(make(go, qs, t), q, k, v, out, lse, dq, dk, dv);
      return std::vector<Tensor>{out, lse, dq, dk, dv};
    });

    // Cross-entropy over many rows (loss summed across blocks), MSE, SwiGLU.
    const int64_t n = 53, vocab = 1000;
    const auto logits = as_stored(random_floats(n * vocab, 105, 3.0f), t);
    std::vector<int32_t> targets(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) targets[static_cast<size_t>(r)] = r % 9 == 4 ? kIgnore : (r * 37) % vocab;
    expect_same_for_thread_counts("cross_entropy, mse, swiglu", [&] {
      Tensor dl = Tensor::zeros({n, vocab}, t), dp = Tensor::zeros({n, vocab}, t);
      Tensor sw = Tensor::zeros({n, vocab}, t), dg = Tensor::zeros({n, vocab}, t), du = Tensor::zeros({n, vocab}, t);
      Tensor lt = make(logits, {n, vocab}, t);
      const auto ce = st::ops::cross_entropy(lt, make_i32(targets, {n}), kIgnore, 0.01f, dl);
      const auto ms = st::ops::mse(lt, dl, 0.5f, dp);
      st::ops::swiglu_forward(lt, dl, sw);
      st::ops::swiglu_backward(dp, lt, dl, dg, du);
      return std::vector<Tensor>{dl, dp, sw, dg, du, double_bits(ce.sum), double_bits(ms.sum)};
    });
  }

  // Embedding backward with repeated tokens, and sum_of_squares over many blocks.
  const int64_t n = 2000, vocab = 37, d = 24;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * i + 3 * i) % vocab);
  const auto g = random_floats(n * d, 106);
  const auto big = random_floats(100003, 107);
  expect_same_for_thread_counts("embedding_backward, sum_of_squares", [&] {
    Tensor dw = Tensor::zeros({vocab, d}, DType::F32);
    st::ops::embedding_backward(make_i32(tokens, {n}), make(g, {n, d}), dw);
    const double ss = st::ops::sum_of_squares(make(big, {100003}));
    return std::vector<Tensor>{dw, double_bits(ss)};
  });
}

}  // namespace
