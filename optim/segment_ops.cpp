// Dispatcher for optim/segment_ops.h, with the CPU loops beside it: a GPU
// segment goes to optim/cuda/, everything else runs here. The CUDA kernels
// are these loops statement for statement (tests/unit/test_cuda_ops.cpp compares
// them bit for bit).
#include "optim/segment_ops.h"

#include <cmath>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/ops.h"
#include "optim/cuda/segment_ops_cuda.h"

namespace st::optim::detail {
namespace {

// Elements per block of the CPU scale loop.
constexpr int64_t kScaleBlock = 32768;

ST_OPTIM_KERNEL void adamw_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                                  float* __restrict v, int64_t n, const AdamWScalars& s) {
  // Every operation is IEEE-exact per element (sqrt and division included),
  // so the vector and scalar code of this loop round identically.
#pragma omp simd
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

}  // namespace

void adamw_step(const Segment& segment, std::span<const RangeBlock> blocks, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWScalars& s) {
  if (segment.param.device().is_cuda()) {
    // One fused launch for the whole segment; the kernel applies decay to ranges whose flag is set.
    cuda::adamw_step(segment.param, segment.grad, exp_avg, exp_avg_sq, segment.device_ranges, s);
    return;
  }
  float* p = segment.param.data<float>();
  const float* g = segment.grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  // Elements are independent: blocks may run on any thread.
  cpu::parallel_for(static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const RangeBlock& blk = blocks[static_cast<size_t>(b)];
      AdamWScalars sb = s;
      // Multiplying by exactly 1 is what torch does for a group with weight_decay 0.
      sb.decay = blk.weight_decay ? s.decay : 1.0f;
      const int64_t o = blk.begin;
      adamw_kernel(p + o, g + o, m + o, v + o, blk.end - blk.begin, sb);
    }
  });
}

double masked_sum_of_squares(const Tensor& x, const Segment& segment) {
  if (x.device().is_cuda()) return cuda::masked_sum_of_squares(x, segment.device_ranges);
  // Each range through the op (parallel blocks summed in a fixed order), the
  // ranges in segment order: the result does not depend on the thread count.
  double sum = 0.0;
  for (const ParamRange& r : segment.ranges) sum += ops::sum_of_squares(x.flat_slice(r.offset, r.numel));
  return sum;
}

void masked_scale(const Tensor& x, const Segment& segment, float s) {
  if (x.device().is_cuda()) {
    cuda::masked_scale(x, segment.device_ranges, s);
    return;
  }
  float* px = x.data<float>();
  const std::vector<RangeBlock> blocks = range_blocks(segment, kScaleBlock);
  cpu::parallel_for(static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const RangeBlock& blk = blocks[static_cast<size_t>(b)];
#pragma omp simd
      for (int64_t i = blk.begin; i < blk.end; ++i) px[i] *= s;
    }
  });
}

}  // namespace st::optim::detail
