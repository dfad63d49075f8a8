// The CUDA model ops (core/cuda/nn.cu, core/cuda/attention.cu) against the
// CPU backend (core/cpu/nn_cpu.cpp, itself checked against double references
// in test_nn_ops) on the same random inputs: fixed seeds, never zeros, F32 and
// BF16, odd sizes. Both sides go through the dispatcher (st::ops::*).
//
// Tolerances, per output tensor:
//  - F32: max |gpu - cpu| <= 1e-5 * max |cpu| (1e-4 for attention, whose
//    cuBLAS products sum in another order than Eigen's).
//  - BF16: every element within 2 BF16 ulps of the CPU's element; an
//    element's ulp is taken at max(|cpu|, 2^-8 * max |cpu|), so an element
//    that cancels to near zero is judged at the tensor's scale. BF16
//    attention (BF16 products, P and dS rounded to BF16 on both devices)
//    is judged instead against the CPU's F32 op on the same values, within
//    one ulp plus the bound of those roundings (tests/harness/attention_ref.h).
//  - Exactly equal bits where the GPU does the CPU's arithmetic in the CPU's
//    order (embedding forward and backward, relu, mse's gradient, the rope
//    tables are within the F32 tolerance).
// Every test skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/cuda/cuda_runtime.h"
#include "core/ops.h"
#include "tests/harness/attention_ref.h"
#include "tests/harness/test_util.h"

namespace {

using st::Device;
using st::DType;
using st::Shape;
using st::Tensor;
using st::test::count_wrong;
using st::test::error_of;

constexpr double kF32Tol = 1e-5;
constexpr double kAttentionF32Tol = 1e-4;
constexpr double kBf16Ulps = 2.0;
constexpr double kBf16Floor = 1.0 / 256.0;  // of max |cpu|, where an element's ulp is taken at least

const Device kGpu = Device::cuda(0);

const char* dtype_str(DType t) { return t == DType::BF16 ? "BF16" : "F32"; }

using st::test::random_floats;

// A CPU tensor of random values stored in `dtype`.
Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float stddev = 1.0f) {
  return Tensor::from_floats(random_floats(st::shape_numel(shape), seed, stddev), shape, dtype);
}

std::vector<int32_t> random_ids(int64_t n, int32_t limit, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, limit - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(rng);
  return v;
}

Tensor ids_tensor(const std::vector<int32_t>& v, const Shape& shape) { return Tensor::from_vector(v, shape); }

Tensor gpu(const Tensor& t) { return t.to(kGpu); }

// Spacing of BF16 values at |x| (the ulp of the binade x lies in).
double bf16_ulp(double x) {
  int exponent = 0;
  std::frexp(x, &exponent);  // |x| = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0, std::max(exponent - 1, -126) - 7);
}

// The GPU result against the CPU result under the tolerances stated at the top.
void expect_close(const std::string& what, const Tensor& got_t, const Tensor& want_t, double f32_tol = kF32Tol) {
  ASSERT_TRUE(got_t.device().is_cuda()) << what;
  ASSERT_TRUE(want_t.device().is_cpu()) << what;
  ASSERT_EQ(got_t.dtype(), want_t.dtype()) << what;
  ASSERT_EQ(got_t.numel(), want_t.numel()) << what;
  const std::vector<float> got = got_t.to_floats();
  const std::vector<float> want = want_t.to_floats();
  double scale = 0.0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  int64_t bad = 0;
  double max_err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    const double w = want[i];
    bool ok = false;
    if (std::isnan(w) || std::isinf(w)) {
      ok = std::isnan(w) ? std::isnan(g) : g == w;
    } else {
      const double err = std::fabs(g - w);
      max_err = std::max(max_err, err);
      const double tol = want_t.dtype() == DType::F32
                             ? f32_tol * scale
                             : kBf16Ulps * bf16_ulp(std::max(std::fabs(w), kBf16Floor * scale));
      ok = err <= tol;  // false for a NaN g
    }
    if (!ok) {
      if (bad < 3) ADD_FAILURE() << what << "[" << i << "]: gpu " << g << " vs cpu " << w << " (scale " << scale << ")";
      ++bad;
    }
  }
  std::printf("  %-44s %-4s max abs err %.2e, max |cpu| %.2e\n", what.c_str(), dtype_str(want_t.dtype()), max_err,
              scale);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements out of tolerance";
}

void expect_same_bits(const std::string& what, const Tensor& got_gpu, const Tensor& want_cpu) {
  const Tensor got = got_gpu.to(Device::cpu());
  EXPECT_EQ(count_wrong(got, want_cpu), 0) << what << ": elements whose bits differ from the CPU's";
}

void expect_loss_close(const std::string& what, const st::ops::LossSum& got, const st::ops::LossSum& want) {
  EXPECT_EQ(got.count, want.count) << what;
  EXPECT_LE(std::fabs(got.sum - want.sum), kF32Tol * std::max(1.0, std::fabs(want.sum)))
      << what << ": gpu sum " << got.sum << " vs cpu " << want.sum;
}

constexpr DType kDtypes[] = {DType::F32, DType::BF16};

// ---------------------------------------------------------------- embedding

struct EmbedCase {
  int64_t vocab, d;
  Shape tokens;
};
// N=1; few tokens so rows repeat; batch-shaped tokens; a larger vocabulary;
// more rows than the 65536 blocks of a launch (the grid-stride loop) with long runs.
const EmbedCase kEmbedCases[] = {{11, 7, {1}}, {5, 7, {2, 13}}, {50, 64, {37}}, {1000, 33, {2, 32}}, {7, 5, {70001}}};

TEST(CudaEmbedding, ForwardMatchesCpuBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  // (weight, out) dtypes, mixed ones included: a copy with at most one rounding.
  const std::pair<DType, DType> kPairs[] = {
      {DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}, {DType::F32, DType::BF16}};
  uint32_t seed = 100;
  for (const EmbedCase& c : kEmbedCases) {
    for (auto [wt, ot] : kPairs) {
      const int64_t n = st::shape_numel(c.tokens);
      const Tensor tokens = ids_tensor(random_ids(n, static_cast<int32_t>(c.vocab), ++seed), c.tokens);
      const Tensor weight = random_tensor({c.vocab, c.d}, wt, ++seed);
      const Tensor want = Tensor::zeros({n, c.d}, ot);
      const Tensor got = Tensor::zeros({n, c.d}, ot, kGpu);
      st::ops::embedding_forward(tokens, weight, want);
      st::ops::embedding_forward(gpu(tokens), gpu(weight), got);
      const std::string what = "embedding_forward V=" + std::to_string(c.vocab) + " D=" + std::to_string(c.d) +
                               " N=" + std::to_string(n) + " weight " + dtype_str(wt);
      expect_close(what, got, want);
      expect_same_bits(what, got, want);
    }
  }
}

// dweight += the rows of dout, summed per token in position order and added
// once: the CPU's order and rounding, so the bits match and repeat.
TEST(CudaEmbedding, BackwardAccumulatesLikeCpuBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 200;
  for (const EmbedCase& c : kEmbedCases) {
    for (DType dt : kDtypes) {
      const int64_t n = st::shape_numel(c.tokens);
      Shape dout_shape = c.tokens;
      dout_shape.push_back(c.d);
      const Tensor tokens = ids_tensor(random_ids(n, static_cast<int32_t>(c.vocab), ++seed), c.tokens);
      const Tensor dout = random_tensor(dout_shape, dt, ++seed);
      const Tensor dweight0 = random_tensor({c.vocab, c.d}, dt, ++seed, 0.5f);  // earlier micro-batches
      const Tensor want = dweight0.clone();
      st::ops::embedding_backward(tokens, dout, want);
      const Tensor got = gpu(dweight0);
      st::ops::embedding_backward(gpu(tokens), gpu(dout), got);
      const std::string what =
          "embedding_backward V=" + std::to_string(c.vocab) + " D=" + std::to_string(c.d) + " N=" + std::to_string(n);
      expect_close(what, got, want);
      expect_same_bits(what, got, want);
      // A second call adds the same sums again, on both devices.
      st::ops::embedding_backward(tokens, dout, want);
      st::ops::embedding_backward(gpu(tokens), gpu(dout), got);
      expect_same_bits(what + " (second call)", got, want);
    }
  }
}

TEST(CudaEmbedding, BadTokenGivesTheCpuErrorAndWritesNothing) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const int64_t vocab = 11;
  const int64_t d = 6;
  // Two bad tokens: both backends name the first (position 3, value 13).
  const Tensor tokens = ids_tensor({1, 4, 0, 13, 2, -1, 10}, {7});
  const Tensor weight = random_tensor({vocab, d}, DType::F32, 301);
  const Tensor dout = random_tensor({7, d}, DType::F32, 302);

  const Tensor out_cpu = Tensor::zeros({7, d}, DType::F32);
  const Tensor out_gpu = Tensor::full({7, d}, 3.0, DType::F32, kGpu);
  const std::string cpu_fwd = error_of([&] { st::ops::embedding_forward(tokens, weight, out_cpu); });
  const std::string gpu_fwd = error_of([&] { st::ops::embedding_forward(gpu(tokens), gpu(weight), out_gpu); });
  EXPECT_NE(cpu_fwd, "");
  EXPECT_EQ(gpu_fwd, cpu_fwd);
  EXPECT_NE(gpu_fwd.find("token 13 at position 3"), std::string::npos) << gpu_fwd;
  for (float v : out_gpu.to_floats()) ASSERT_EQ(v, 3.0f) << "out was written before the error";

  const Tensor dw_cpu = weight.clone();
  const Tensor dw_gpu = gpu(weight);
  const std::string cpu_bwd = error_of([&] { st::ops::embedding_backward(tokens, dout, dw_cpu); });
  const std::string gpu_bwd = error_of([&] { st::ops::embedding_backward(gpu(tokens), gpu(dout), dw_gpu); });
  EXPECT_NE(cpu_bwd, "");
  EXPECT_EQ(gpu_bwd, cpu_bwd);
  EXPECT_EQ(count_wrong(dw_gpu.to(Device::cpu()), weight), 0) << "dweight was written before the error";

  // A negative first bad token too.
  const Tensor negative = ids_tensor({0, -2, 12}, {3});
  const Tensor out3 = Tensor::zeros({3, d}, DType::F32);
  EXPECT_EQ(error_of([&] { st::ops::embedding_forward(gpu(negative), gpu(weight), gpu(out3)); }),
            error_of([&] { st::ops::embedding_forward(negative, weight, out3); }));
}

// ---------------------------------------------------------------- RMSNorm

struct RmsCase {
  Shape x;  // [..., D]
  float eps;
};
// The last has more rows than the backward's 512 first-stage blocks, so each
// block handles several rows (its dweight partial and the block sum reused).
const RmsCase kRmsCases[] = {
    {{1, 7}, 1e-5f}, {{2, 13, 64}, 1e-6f}, {{37, 1000}, 1e-5f}, {{3, 5}, 0.0f}, {{600, 33}, 1e-5f}};

// (x, weight, out) dtypes: all F32, all BF16, BF16 activations with an F32 weight.
struct RmsDtypes {
  DType x, w, out;
};
const RmsDtypes kRmsDtypes[] = {{DType::F32, DType::F32, DType::F32},
                                {DType::BF16, DType::BF16, DType::BF16},
                                {DType::BF16, DType::F32, DType::BF16}};

std::string rms_name(const char* op, const RmsCase& c, const RmsDtypes& t) {
  return std::string(op) + " x " + st::shape_str(c.x) + " x/w/out " + dtype_str(t.x) + "/" + dtype_str(t.w) + "/" +
         dtype_str(t.out);
}

TEST(CudaRmsNorm, ForwardMatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 400;
  for (const RmsCase& c : kRmsCases) {
    for (const RmsDtypes& t : kRmsDtypes) {
      const int64_t d = c.x.back();
      const int64_t rows = st::shape_numel(c.x) / d;
      const Tensor x = random_tensor(c.x, t.x, ++seed, 2.0f);
      const Tensor w = random_tensor({d}, t.w, ++seed);
      const Tensor out_cpu = Tensor::zeros(c.x, t.out);
      const Tensor rstd_cpu = Tensor::zeros({rows}, DType::F32);
      const Tensor out_gpu = Tensor::zeros(c.x, t.out, kGpu);
      const Tensor rstd_gpu = Tensor::zeros({rows}, DType::F32, kGpu);
      st::ops::rmsnorm_forward(x, w, c.eps, out_cpu, rstd_cpu);
      st::ops::rmsnorm_forward(gpu(x), gpu(w), c.eps, out_gpu, rstd_gpu);
      expect_close(rms_name("rmsnorm_forward out", c, t), out_gpu, out_cpu);
      expect_close(rms_name("rmsnorm_forward rstd", c, t), rstd_gpu, rstd_cpu);
    }
  }
}

TEST(CudaRmsNorm, OutputMayAliasInput) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : kDtypes) {
    const Tensor x = random_tensor({9, 130}, dt, 450);
    const Tensor w = random_tensor({130}, dt, 451);
    const Tensor out_cpu = Tensor::zeros({9, 130}, dt);
    const Tensor rstd_cpu = Tensor::zeros({9}, DType::F32);
    st::ops::rmsnorm_forward(x, w, 1e-5f, out_cpu, rstd_cpu);
    const Tensor x_gpu = gpu(x);
    const Tensor rstd_gpu = Tensor::zeros({9}, DType::F32, kGpu);
    st::ops::rmsnorm_forward(x_gpu, gpu(w), 1e-5f, x_gpu, rstd_gpu);
    expect_close("rmsnorm_forward in place", x_gpu, out_cpu);
  }
}

// dx written, dweight accumulated onto earlier values; the two-stage dweight
// reduction gives the same bits on every call.
TEST(CudaRmsNorm, BackwardMatchesCpuAndRepeatsBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 500;
  for (const RmsCase& c : kRmsCases) {
    for (const RmsDtypes& t : kRmsDtypes) {
      const int64_t d = c.x.back();
      const int64_t rows = st::shape_numel(c.x) / d;
      const Tensor x = random_tensor(c.x, t.x, ++seed, 2.0f);
      const Tensor w = random_tensor({d}, t.w, ++seed);
      const Tensor dout = random_tensor(c.x, t.out, ++seed);
      const Tensor dweight0 = random_tensor({d}, t.w, ++seed);
      // One rstd for both backends (the CPU's), so the backward is compared alone.
      const Tensor rstd = Tensor::zeros({rows}, DType::F32);
      st::ops::rmsnorm_forward(x, w, c.eps, Tensor::zeros(c.x, t.out), rstd);

      const Tensor dx_cpu = Tensor::zeros(c.x, t.x);
      const Tensor dw_cpu = dweight0.clone();
      st::ops::rmsnorm_backward(dout, x, w, rstd, dx_cpu, dw_cpu);
      const Tensor dx_gpu = Tensor::zeros(c.x, t.x, kGpu);
      const Tensor dw_gpu = gpu(dweight0);
      st::ops::rmsnorm_backward(gpu(dout), gpu(x), gpu(w), gpu(rstd), dx_gpu, dw_gpu);
      expect_close(rms_name("rmsnorm_backward dx", c, t), dx_gpu, dx_cpu);
      expect_close(rms_name("rmsnorm_backward dweight", c, t), dw_gpu, dw_cpu);

      const Tensor dw_again = gpu(dweight0);
      st::ops::rmsnorm_backward(gpu(dout), gpu(x), gpu(w), gpu(rstd), Tensor::zeros(c.x, t.x, kGpu), dw_again);
      EXPECT_EQ(count_wrong(dw_again.to(Device::cpu()), dw_gpu.to(Device::cpu())), 0)
          << rms_name("rmsnorm_backward dweight differs between runs", c, t);
    }
  }
}

TEST(CudaRmsNorm, DxMayAliasDout) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const Shape shape{5, 96};
  const Tensor x = random_tensor(shape, DType::BF16, 560);
  const Tensor w = random_tensor({96}, DType::BF16, 561);
  const Tensor dout = random_tensor(shape, DType::BF16, 562);
  const Tensor rstd = Tensor::zeros({5}, DType::F32);
  st::ops::rmsnorm_forward(x, w, 1e-5f, Tensor::zeros(shape, DType::BF16), rstd);
  const Tensor dx_cpu = Tensor::zeros(shape, DType::BF16);
  const Tensor dw_cpu = Tensor::zeros({96}, DType::F32);
  st::ops::rmsnorm_backward(dout, x, w, rstd, dx_cpu, dw_cpu);
  const Tensor dout_gpu = gpu(dout);
  const Tensor dw_gpu = Tensor::zeros({96}, DType::F32, kGpu);
  st::ops::rmsnorm_backward(dout_gpu, gpu(x), gpu(w), gpu(rstd), dout_gpu, dw_gpu);
  expect_close("rmsnorm_backward dx over dout", dout_gpu, dx_cpu);
  expect_close("rmsnorm_backward dweight (dx over dout)", dw_gpu, dw_cpu);
}

// The residual add fused with RMSNorm (forward) and its gradient (backward):
// CUDA runs the unfused chain, which must match the CPU's fused op, also with
// h over delta and dx over the residual.
TEST(CudaRmsNorm, FusedResidualOpsMatchCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 580;
  for (const RmsCase& c : kRmsCases) {
    for (const RmsDtypes& t : kRmsDtypes) {
      const int64_t d = c.x.back();
      const int64_t rows = st::shape_numel(c.x) / d;
      const Tensor x = random_tensor(c.x, t.x, ++seed, 2.0f);
      const Tensor delta = random_tensor(c.x, t.x, ++seed);
      const Tensor w = random_tensor({d}, t.w, ++seed);
      const Tensor h_cpu = delta.clone(), out_cpu = Tensor::zeros(c.x, t.out);
      const Tensor rstd = Tensor::zeros({rows}, DType::F32);
      st::ops::add_rmsnorm_forward(x, h_cpu, w, c.eps, h_cpu, out_cpu, rstd);
      const Tensor h_gpu = gpu(delta), out_gpu = Tensor::zeros(c.x, t.out, kGpu);
      st::ops::add_rmsnorm_forward(gpu(x), h_gpu, gpu(w), c.eps, h_gpu, out_gpu,
                                   Tensor::zeros({rows}, DType::F32, kGpu));
      expect_close(rms_name("add_rmsnorm_forward h", c, t), h_gpu, h_cpu);
      expect_close(rms_name("add_rmsnorm_forward out", c, t), out_gpu, out_cpu);

      const Tensor dout = random_tensor(c.x, t.out, ++seed);
      const Tensor res = random_tensor(c.x, t.x, ++seed);
      const Tensor dx_cpu = res.clone(), dw_cpu = Tensor::zeros({d}, t.w);
      st::ops::rmsnorm_backward_add(dout, h_cpu, w, rstd, dx_cpu, dx_cpu, dw_cpu);
      const Tensor dx_gpu = gpu(res), dw_gpu = Tensor::zeros({d}, t.w, kGpu);
      st::ops::rmsnorm_backward_add(gpu(dout), gpu(h_cpu), gpu(w), gpu(rstd), dx_gpu, dx_gpu, dw_gpu);
      expect_close(rms_name("rmsnorm_backward_add dx", c, t), dx_gpu, dx_cpu);
      expect_close(rms_name("rmsnorm_backward_add dweight", c, t), dw_gpu, dw_cpu);
    }
  }
}

// ---------------------------------------------------------------- RoPE

TEST(CudaRope, TablesMatchCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  struct Case {
    int64_t seq, hd;
    double theta;
  };
  for (const Case& c : {Case{13, 8, 10000.0}, Case{64, 64, 500000.0}, Case{2048, 128, 10000.0}, Case{1, 2, 10.0}}) {
    const Tensor cos_cpu = Tensor::zeros({c.seq, c.hd}, DType::F32);
    const Tensor sin_cpu = Tensor::zeros({c.seq, c.hd}, DType::F32);
    const Tensor cos_gpu = Tensor::zeros({c.seq, c.hd}, DType::F32, kGpu);
    const Tensor sin_gpu = Tensor::zeros({c.seq, c.hd}, DType::F32, kGpu);
    st::ops::rope_tables(c.seq, c.hd, c.theta, cos_cpu, sin_cpu);
    st::ops::rope_tables(c.seq, c.hd, c.theta, cos_gpu, sin_gpu);
    const std::string what = "rope_tables T=" + std::to_string(c.seq) + " hd=" + std::to_string(c.hd);
    expect_close(what + " cos", cos_gpu, cos_cpu);
    expect_close(what + " sin", sin_gpu, sin_cpu);
  }
}

TEST(CudaRope, ForwardAndBackwardMatchCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const Shape kShapes[] = {{2, 13, 4, 8}, {1, 64, 8, 64}, {3, 1, 2, 2}};
  uint32_t seed = 600;
  for (const Shape& shape : kShapes) {
    // Tables longer than the sequence: row t serves position t.
    const int64_t table_len = shape[1] + 3;
    const int64_t hd = shape[3];
    const Tensor cos = Tensor::zeros({table_len, hd}, DType::F32);
    const Tensor sin = Tensor::zeros({table_len, hd}, DType::F32);
    st::ops::rope_tables(table_len, hd, 10000.0, cos, sin);
    for (DType dt : kDtypes) {
      const Tensor x = random_tensor(shape, dt, ++seed);
      const std::string what = std::string("rope ") + st::shape_str(shape);
      const Tensor fwd_cpu = x.clone();
      const Tensor fwd_gpu = gpu(x);
      st::ops::rope_forward(fwd_cpu, cos, sin);
      st::ops::rope_forward(fwd_gpu, gpu(cos), gpu(sin));
      expect_close(what + " forward", fwd_gpu, fwd_cpu);
      const Tensor bwd_cpu = x.clone();
      const Tensor bwd_gpu = gpu(x);
      st::ops::rope_backward(bwd_cpu, cos, sin);
      st::ops::rope_backward(bwd_gpu, gpu(cos), gpu(sin));
      expect_close(what + " backward", bwd_gpu, bwd_cpu);
    }
  }
}

// ---------------------------------------------------------------- attention

struct AttnCase {
  int64_t b, t, h, kv, hd;
};
// GQA with odd T; MHA at a real head size; groups of two with odd hd; groups of four.
const AttnCase kAttnCases[] = {{2, 13, 4, 2, 8}, {1, 64, 8, 8, 64}, {3, 5, 6, 3, 6}, {2, 33, 8, 2, 16}};
// T = 1 too for the forward (a one-element softmax: out = v). Its backward is
// checked apart: dq and dk are 0 up to rounding, which a relative tolerance
// cannot judge.
const AttnCase kAttnForwardCases[] = {
    {2, 13, 4, 2, 8}, {1, 64, 8, 8, 64}, {1, 1, 2, 1, 4}, {3, 5, 6, 3, 6}, {2, 33, 8, 2, 16}};

std::vector<double> doubles(const Tensor& t) {
  const std::vector<float> f = t.to_floats();
  return {f.begin(), f.end()};
}

// A BF16 forward on the GPU against the CPU's F32 forward on the same values
// (Tq <= Tk), within the BF16 bound.
void expect_forward_within_bound(const std::string& what, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out_gpu, const Tensor& lse_gpu) {
  const st::test::AttnShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), k.size(1)};
  const Tensor out = Tensor::zeros(q.shape(), DType::F32);
  const Tensor lse = Tensor::zeros({s.b, s.h, s.t}, DType::F32);
  st::ops::attention_forward(st::ops::cast(q, DType::F32), st::ops::cast(k, DType::F32), st::ops::cast(v, DType::F32),
                             out, lse);
  const st::test::AttnBounds bound = st::test::attention_bf16_bounds(
      doubles(q), doubles(k), doubles(v), std::vector<double>(static_cast<size_t>(q.numel()), 0.0), s);
  st::test::expect_within_bound((what + " out").c_str(), out_gpu.to(Device::cpu()), out, bound.out);
  expect_close(what + " lse", lse_gpu, lse, kAttentionF32Tol);
}

std::string attn_name(const char* what, const AttnCase& c) {
  return std::string(what) + " B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) +
         " KV=" + std::to_string(c.kv) + " hd=" + std::to_string(c.hd);
}

TEST(CudaAttention, ForwardMatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 700;
  for (const AttnCase& c : kAttnForwardCases) {
    for (DType dt : kDtypes) {
      const Shape q_shape{c.b, c.t, c.h, c.hd};
      const Shape kv_shape{c.b, c.t, c.kv, c.hd};
      const Tensor q = random_tensor(q_shape, dt, ++seed);
      const Tensor k = random_tensor(kv_shape, dt, ++seed);
      const Tensor v = random_tensor(kv_shape, dt, ++seed);
      const Tensor out_cpu = Tensor::zeros(q_shape, dt);
      const Tensor lse_cpu = Tensor::zeros({c.b, c.h, c.t}, DType::F32);
      st::ops::attention_forward(q, k, v, out_cpu, lse_cpu);
      const Tensor out_gpu = Tensor::zeros(q_shape, dt, kGpu);
      const Tensor lse_gpu = Tensor::zeros({c.b, c.h, c.t}, DType::F32, kGpu);
      st::ops::attention_forward(gpu(q), gpu(k), gpu(v), out_gpu, lse_gpu);
      if (dt == DType::BF16) {
        expect_forward_within_bound(attn_name("attention_forward", c), q, k, v, out_gpu, lse_gpu);
        continue;
      }
      expect_close(attn_name("attention_forward out", c), out_gpu, out_cpu, kAttentionF32Tol);
      expect_close(attn_name("attention_forward lse", c), lse_gpu, lse_cpu, kAttentionF32Tol);
    }
  }
}

// A KV cache's step: fewer queries than keys (the last Tq of Tk positions).
TEST(CudaAttention, FewerQueriesThanKeysMatchCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 750;
  for (const AttnCase& c : kAttnCases) {
    for (int64_t tq : {int64_t{1}, c.t / 2 + 1}) {
      for (DType dt : kDtypes) {
        const Shape q_shape{c.b, tq, c.h, c.hd};
        const Shape kv_shape{c.b, c.t, c.kv, c.hd};
        const Tensor q = random_tensor(q_shape, dt, ++seed);
        const Tensor k = random_tensor(kv_shape, dt, ++seed);
        const Tensor v = random_tensor(kv_shape, dt, ++seed);
        const Tensor out_cpu = Tensor::zeros(q_shape, dt);
        const Tensor lse_cpu = Tensor::zeros({c.b, c.h, tq}, DType::F32);
        st::ops::attention_forward(q, k, v, out_cpu, lse_cpu);
        const Tensor out_gpu = Tensor::zeros(q_shape, dt, kGpu);
        const Tensor lse_gpu = Tensor::zeros({c.b, c.h, tq}, DType::F32, kGpu);
        st::ops::attention_forward(gpu(q), gpu(k), gpu(v), out_gpu, lse_gpu);
        const std::string what = attn_name("cached attention_forward", c) + " Tq=" + std::to_string(tq);
        if (dt == DType::BF16) {
          expect_forward_within_bound(what, q, k, v, out_gpu, lse_gpu);
          continue;
        }
        expect_close(what + " out", out_gpu, out_cpu, kAttentionF32Tol);
        expect_close(what + " lse", lse_gpu, lse_cpu, kAttentionF32Tol);
      }
    }
  }
}

TEST(CudaAttention, BackwardMatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 800;
  for (const AttnCase& c : kAttnCases) {
    for (DType dt : kDtypes) {
      const Shape q_shape{c.b, c.t, c.h, c.hd};
      const Shape kv_shape{c.b, c.t, c.kv, c.hd};
      const Tensor q = random_tensor(q_shape, dt, ++seed);
      const Tensor k = random_tensor(kv_shape, dt, ++seed);
      const Tensor v = random_tensor(kv_shape, dt, ++seed);
      const Tensor dout = random_tensor(q_shape, dt, ++seed);
      // The CPU forward's out and lse feed both backwards, so the backward is compared alone.
      const Tensor out = Tensor::zeros(q_shape, dt);
      const Tensor lse = Tensor::zeros({c.b, c.h, c.t}, DType::F32);
      st::ops::attention_forward(q, k, v, out, lse);

      const Tensor dq_cpu = Tensor::zeros(q_shape, dt);
      const Tensor dk_cpu = Tensor::zeros(kv_shape, dt);
      const Tensor dv_cpu = Tensor::zeros(kv_shape, dt);
      st::ops::attention_backward(dout, q, k, v, out, lse, dq_cpu, dk_cpu, dv_cpu);
      // Outputs start non-zero: they must be written (=), not accumulated.
      const Tensor dq_gpu = gpu(random_tensor(q_shape, dt, ++seed));
      const Tensor dk_gpu = gpu(random_tensor(kv_shape, dt, ++seed));
      const Tensor dv_gpu = gpu(random_tensor(kv_shape, dt, ++seed));
      st::ops::attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), gpu(out), gpu(lse), dq_gpu, dk_gpu, dv_gpu);
      if (dt == DType::BF16) {
        // The CPU's F32 backward on the same values (and the same out, lse).
        const Tensor dq32 = Tensor::zeros(q_shape, DType::F32);
        const Tensor dk32 = Tensor::zeros(kv_shape, DType::F32);
        const Tensor dv32 = Tensor::zeros(kv_shape, DType::F32);
        st::ops::attention_backward(st::ops::cast(dout, DType::F32), st::ops::cast(q, DType::F32),
                                    st::ops::cast(k, DType::F32), st::ops::cast(v, DType::F32),
                                    st::ops::cast(out, DType::F32), lse, dq32, dk32, dv32);
        const st::test::AttnBounds bound = st::test::attention_bf16_bounds(doubles(q), doubles(k), doubles(v),
                                                                           doubles(dout), {c.b, c.t, c.h, c.kv, c.hd});
        st::test::expect_within_bound(attn_name("attention_backward dq", c).c_str(), dq_gpu.to(Device::cpu()), dq32,
                                      bound.dq);
        st::test::expect_within_bound(attn_name("attention_backward dk", c).c_str(), dk_gpu.to(Device::cpu()), dk32,
                                      bound.dk);
        st::test::expect_within_bound(attn_name("attention_backward dv", c).c_str(), dv_gpu.to(Device::cpu()), dv32,
                                      bound.dv);
        continue;
      }
      expect_close(attn_name("attention_backward dq", c), dq_gpu, dq_cpu, kAttentionF32Tol);
      expect_close(attn_name("attention_backward dk", c), dk_gpu, dk_cpu, kAttentionF32Tol);
      expect_close(attn_name("attention_backward dv", c), dv_gpu, dv_cpu, kAttentionF32Tol);
    }
  }
}

// T = 1: P = 1, so dv is the sum of dout over the group's query heads and dq,
// dk are zero up to rounding (dS = scale * (dO.V - dO.O) with O = V).
TEST(CudaAttention, BackwardAtOnePosition) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const AttnCase c{2, 1, 4, 2, 8};
  const Shape q_shape{c.b, c.t, c.h, c.hd};
  const Shape kv_shape{c.b, c.t, c.kv, c.hd};
  const Tensor q = random_tensor(q_shape, DType::F32, 851);
  const Tensor k = random_tensor(kv_shape, DType::F32, 852);
  const Tensor v = random_tensor(kv_shape, DType::F32, 853);
  const Tensor dout = random_tensor(q_shape, DType::F32, 854);
  const Tensor out = Tensor::zeros(q_shape, DType::F32, kGpu);
  const Tensor lse = Tensor::zeros({c.b, c.h, c.t}, DType::F32, kGpu);
  st::ops::attention_forward(gpu(q), gpu(k), gpu(v), out, lse);
  const Tensor dq = gpu(random_tensor(q_shape, DType::F32, 855));
  const Tensor dk = gpu(random_tensor(kv_shape, DType::F32, 856));
  const Tensor dv = gpu(random_tensor(kv_shape, DType::F32, 857));
  st::ops::attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), out, lse, dq, dk, dv);
  const std::vector<float> o = out.to_floats();
  const std::vector<float> vv = v.to_floats();
  const std::vector<float> dov = dout.to_floats();
  const std::vector<float> dvv = dv.to_floats();
  const int64_t group = c.h / c.kv;
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t g = 0; g < c.kv; ++g) {
      for (int64_t i = 0; i < c.hd; ++i) {
        const size_t kv_at = static_cast<size_t>((b * c.kv + g) * c.hd + i);
        float want_dv = 0.0f;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const size_t q_at = static_cast<size_t>((b * c.h + h) * c.hd + i);
          EXPECT_EQ(o[q_at], vv[kv_at]) << "out must be v at T = 1";
          want_dv += dov[q_at];
        }
        EXPECT_NEAR(dvv[kv_at], want_dv, 1e-6f * std::max(1.0f, std::fabs(want_dv)));
      }
    }
  }
  for (float x : dq.to_floats()) EXPECT_LT(std::fabs(x), 1e-5f) << "dq at T = 1";
  for (float x : dk.to_floats()) EXPECT_LT(std::fabs(x), 1e-5f) << "dk at T = 1";
}

// The GPU's own forward then backward, twice: the same bits both times
// (cuBLAS and the kernels have a fixed order). Closeness to the CPU is
// checked by the tests above.
TEST(CudaAttention, ForwardBackwardRepeatBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const AttnCase c{2, 29, 4, 2, 32};
  const Shape q_shape{c.b, c.t, c.h, c.hd};
  const Shape kv_shape{c.b, c.t, c.kv, c.hd};
  const Tensor q = gpu(random_tensor(q_shape, DType::BF16, 901));
  const Tensor k = gpu(random_tensor(kv_shape, DType::BF16, 902));
  const Tensor v = gpu(random_tensor(kv_shape, DType::BF16, 903));
  const Tensor dout = gpu(random_tensor(q_shape, DType::BF16, 904));
  std::vector<Tensor> runs;
  for (int run = 0; run < 2; ++run) {
    const Tensor out = Tensor::zeros(q_shape, DType::BF16, kGpu);
    const Tensor lse = Tensor::zeros({c.b, c.h, c.t}, DType::F32, kGpu);
    const Tensor dq = Tensor::zeros(q_shape, DType::BF16, kGpu);
    const Tensor dk = Tensor::zeros(kv_shape, DType::BF16, kGpu);
    const Tensor dv = Tensor::zeros(kv_shape, DType::BF16, kGpu);
    st::ops::attention_forward(q, k, v, out, lse);
    st::ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv);
    for (const Tensor& t : {out, lse, dq, dk, dv}) runs.push_back(t.to(Device::cpu()));
  }
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(count_wrong(runs[i], runs[i + 5]), 0) << "output " << i << " of 5";
}

// ---------------------------------------------------------------- SwiGLU, ReLU

const Shape kElemShapes[] = {{1, 1}, {1, 7}, {13, 77}, {3, 1000}};

TEST(CudaSwiGlu, ForwardAndBackwardMatchCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 1000;
  for (const Shape& shape : kElemShapes) {
    for (DType dt : kDtypes) {
      // A wide gate reaches both saturated ends of the sigmoid.
      const Tensor gate = random_tensor(shape, dt, ++seed, 4.0f);
      const Tensor up = random_tensor(shape, dt, ++seed);
      const Tensor dout = random_tensor(shape, dt, ++seed);
      const std::string what = std::string("swiglu ") + st::shape_str(shape);
      const Tensor out_cpu = Tensor::zeros(shape, dt);
      const Tensor out_gpu = Tensor::zeros(shape, dt, kGpu);
      st::ops::swiglu_forward(gate, up, out_cpu);
      st::ops::swiglu_forward(gpu(gate), gpu(up), out_gpu);
      expect_close(what + " forward", out_gpu, out_cpu);

      const Tensor dg_cpu = Tensor::zeros(shape, dt);
      const Tensor du_cpu = Tensor::zeros(shape, dt);
      st::ops::swiglu_backward(dout, gate, up, dg_cpu, du_cpu);
      const Tensor dg_gpu = Tensor::zeros(shape, dt, kGpu);
      const Tensor du_gpu = Tensor::zeros(shape, dt, kGpu);
      st::ops::swiglu_backward(gpu(dout), gpu(gate), gpu(up), dg_gpu, du_gpu);
      expect_close(what + " dgate", dg_gpu, dg_cpu);
      expect_close(what + " dup", du_gpu, du_cpu);

      // Gradients written over the inputs: dgate over gate, dup over up.
      const Tensor gate_gpu = gpu(gate);
      const Tensor up_gpu = gpu(up);
      st::ops::swiglu_backward(gpu(dout), gate_gpu, up_gpu, gate_gpu, up_gpu);
      expect_close(what + " dgate over gate", gate_gpu, dg_cpu);
      expect_close(what + " dup over up", up_gpu, du_cpu);
    }
  }
}

TEST(CudaRelu, ForwardAndBackwardMatchCpuBitForBit) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 1100;
  for (const Shape& shape : kElemShapes) {
    for (DType dt : kDtypes) {
      std::vector<float> xv = random_floats(st::shape_numel(shape), ++seed);
      if (xv.size() > 3) xv[3] = std::numeric_limits<float>::quiet_NaN();  // passes through forward
      const Tensor x = Tensor::from_floats(xv, shape, dt);
      const Tensor dout = random_tensor(shape, dt, ++seed);
      const std::string what = std::string("relu ") + st::shape_str(shape);
      const Tensor out_cpu = Tensor::zeros(shape, dt);
      const Tensor out_gpu = Tensor::zeros(shape, dt, kGpu);
      st::ops::relu_forward(x, out_cpu);
      st::ops::relu_forward(gpu(x), out_gpu);
      expect_close(what + " forward", out_gpu, out_cpu);
      expect_same_bits(what + " forward", out_gpu, out_cpu);

      const Tensor dx_cpu = Tensor::zeros(shape, dt);
      st::ops::relu_backward(dout, x, dx_cpu);
      const Tensor dout_gpu = gpu(dout);
      st::ops::relu_backward(dout_gpu, gpu(x), dout_gpu);  // dx over dout
      expect_close(what + " backward", dout_gpu, dx_cpu);
      expect_same_bits(what + " backward", dout_gpu, dx_cpu);
    }
  }
}

// ---------------------------------------------------------------- losses

constexpr int64_t kIgnore = -100;

struct CeCase {
  int64_t rows, vocab;
  int ignored_every;  // every k-th target is ignore_index (0: none)
};
// The last has more rows than the 65536 blocks of a launch (grid-stride loop).
const CeCase kCeCases[] = {{1, 7, 0}, {37, 1000, 4}, {5, 32003, 2}, {2, 1, 0}, {70001, 3, 5}};

std::vector<int32_t> ce_targets(const CeCase& c, uint32_t seed) {
  std::vector<int32_t> t = random_ids(c.rows, static_cast<int32_t>(c.vocab), seed);
  if (c.ignored_every > 0)
    for (size_t i = 0; i < t.size(); i += static_cast<size_t>(c.ignored_every)) t[i] = static_cast<int32_t>(kIgnore);
  return t;
}

TEST(CudaCrossEntropy, MatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint32_t seed = 1200;
  for (const CeCase& c : kCeCases) {
    for (DType dt : kDtypes) {
      const Tensor logits = random_tensor({c.rows, c.vocab}, dt, ++seed, 3.0f);
      const Tensor targets = ids_tensor(ce_targets(c, ++seed), {c.rows});
      const float grad_scale = 1.0f / static_cast<float>(c.rows);
      const Tensor dl_cpu = Tensor::zeros({c.rows, c.vocab}, dt);
      const st::ops::LossSum want = st::ops::cross_entropy(logits, targets, kIgnore, grad_scale, dl_cpu);
      const Tensor dl_gpu = Tensor::full({c.rows, c.vocab}, 5.0, dt, kGpu);  // ignored rows must become 0
      const st::ops::LossSum got = st::ops::cross_entropy(gpu(logits), gpu(targets), kIgnore, grad_scale, dl_gpu);
      const std::string what = "cross_entropy N=" + std::to_string(c.rows) + " V=" + std::to_string(c.vocab);
      EXPECT_GT(want.count, 0) << what;
      expect_loss_close(what + " loss", got, want);
      expect_close(what + " dlogits", dl_gpu, dl_cpu);
    }
  }
}

TEST(CudaCrossEntropy, DlogitsMayAliasLogits) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const CeCase c{9, 517, 3};
  for (DType dt : kDtypes) {
    const Tensor logits = random_tensor({c.rows, c.vocab}, dt, 1300, 2.0f);
    const Tensor targets = ids_tensor(ce_targets(c, 1301), {c.rows});
    const Tensor dl_cpu = Tensor::zeros({c.rows, c.vocab}, dt);
    const st::ops::LossSum want = st::ops::cross_entropy(logits, targets, kIgnore, 0.25f, dl_cpu);
    const Tensor logits_gpu = gpu(logits);
    const st::ops::LossSum got = st::ops::cross_entropy(logits_gpu, gpu(targets), kIgnore, 0.25f, logits_gpu);
    expect_loss_close("cross_entropy in place loss", got, want);
    expect_close("cross_entropy in place dlogits", logits_gpu, dl_cpu);
  }
}

TEST(CudaCrossEntropy, AllRowsIgnoredCountsNothing) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const Tensor logits = random_tensor({3, 10}, DType::F32, 1400);
  const Tensor targets = ids_tensor({-100, -100, -100}, {3});
  const Tensor dl = Tensor::full({3, 10}, 1.0, DType::F32, kGpu);
  const st::ops::LossSum got = st::ops::cross_entropy(gpu(logits), gpu(targets), kIgnore, 1.0f, dl);
  EXPECT_EQ(got.count, 0);
  EXPECT_EQ(got.sum, 0.0);
  for (float g : dl.to_floats()) ASSERT_EQ(g, 0.0f);
}

TEST(CudaCrossEntropy, BadTargetGivesTheCpuErrorAndWritesNothing) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const int64_t vocab = 11;
  const Tensor logits = random_tensor({6, vocab}, DType::F32, 1500);
  // ignore_index is fine anywhere; the first bad target is 11 in row 2.
  const Tensor targets = ids_tensor({3, -100, 11, 0, -5, 10}, {6});
  const Tensor logits_cpu = logits.clone();
  const std::string cpu_msg = error_of([&] { st::ops::cross_entropy(logits_cpu, targets, kIgnore, 1.0f, logits_cpu); });
  const Tensor logits_gpu = gpu(logits);
  const std::string gpu_msg =
      error_of([&] { st::ops::cross_entropy(logits_gpu, gpu(targets), kIgnore, 1.0f, logits_gpu); });
  EXPECT_NE(cpu_msg, "");
  EXPECT_EQ(gpu_msg, cpu_msg);
  EXPECT_NE(gpu_msg.find("target 11 in row 2"), std::string::npos) << gpu_msg;
  // dlogits is the logits here: nothing may have been consumed.
  EXPECT_EQ(count_wrong(logits_gpu.to(Device::cpu()), logits), 0);

  // A negative target that is not ignore_index, with another ignore_index.
  const Tensor negative = ids_tensor({0, -1}, {2});
  const Tensor two_rows = random_tensor({2, vocab}, DType::F32, 1501);
  const Tensor dl = Tensor::zeros({2, vocab}, DType::F32);
  EXPECT_EQ(error_of([&] { st::ops::cross_entropy(gpu(two_rows), gpu(negative), 7, 1.0f, gpu(dl)); }),
            error_of([&] { st::ops::cross_entropy(two_rows, negative, 7, 1.0f, dl); }));
}

TEST(CudaMse, MatchesCpu) {
  if (st::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const Shape kShapes[] = {{1}, {13, 7}, {1000, 37}, {70001}};
  uint32_t seed = 1600;
  for (const Shape& shape : kShapes) {
    for (DType dt : kDtypes) {
      const Tensor pred = random_tensor(shape, dt, ++seed);
      const Tensor target = random_tensor(shape, dt, ++seed);
      const float grad_scale = 1.0f / static_cast<float>(st::shape_numel(shape));
      const std::string what = std::string("mse ") + st::shape_str(shape);
      const Tensor dp_cpu = Tensor::zeros(shape, dt);
      const st::ops::LossSum want = st::ops::mse(pred, target, grad_scale, dp_cpu);
      const Tensor dp_gpu = Tensor::zeros(shape, dt, kGpu);
      const st::ops::LossSum got = st::ops::mse(gpu(pred), gpu(target), grad_scale, dp_gpu);
      expect_loss_close(what + " loss", got, want);
      expect_close(what + " dpred", dp_gpu, dp_cpu);
      expect_same_bits(what + " dpred", dp_gpu, dp_cpu);

      // dpred over pred.
      const Tensor pred_gpu = gpu(pred);
      const st::ops::LossSum again = st::ops::mse(pred_gpu, gpu(target), grad_scale, pred_gpu);
      expect_loss_close(what + " loss (in place)", again, want);
      expect_same_bits(what + " dpred over pred", pred_gpu, dp_cpu);
    }
  }
}

}  // namespace
