#pragma once
// Private to optim/: the optimizer's ops over the parameter ranges of one
// segment, dispatched by device as core/ops.h's ops are (core/ops.cpp): each
// function takes the segment's tensors and runs the CPU loop
// (optim/segment_ops.cpp) or the CUDA kernel (optim/cuda/segment_ops.cu,
// declared in optim/cuda/segment_ops_cuda.h; optim/cuda/no_cuda_segment_ops.cpp
// stands in without CUDA). Elements outside every range are never read or
// written. The two backends round alike: the CPU as kernel.h states, the
// CUDA kernels pinning the same roundings with intrinsics, so an AdamW step
// or a scale gives the same bits on either device.
//
// The caller has validated the segment (validate_segment): param and grad F32
// [n] on one device, ranges sorted and disjoint, device_ranges present on a GPU.
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "optim/kernel.h"
#include "optim/optimizer.h"

namespace st::optim::detail {

/// One AdamW step's scalars, already rounded to F32 (optim/adamw.cpp computes
/// them); both backends take this struct.
struct AdamWScalars {
  float decay;  // 1 - lr * weight_decay, used for ranges whose decay flag is set (others use 1)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
};

/// AdamW over every range of `segment` (optim/adamw.cpp states the formula):
/// segment.param, `exp_avg` and `exp_avg_sq` (F32 [n] on the segment's device)
/// updated in place from segment.grad. `blocks` are the ranges cut for the CPU
/// loop (range_blocks, made once per segment); a GPU walks
/// segment.device_ranges in one launch instead.
void adamw_step(const Segment& segment, std::span<const RangeBlock> blocks, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWScalars& s);
/// Sum of x*x over the ranges of `segment` (x: F32 [n] on its device, e.g. its
/// grad), accumulated in double. CPU: one ops::sum_of_squares per range, added
/// in range order, so the result does not depend on the thread count.
double masked_sum_of_squares(const Tensor& x, const Segment& segment);
/// x *= s over the ranges of `segment` (others untouched).
void masked_scale(const Tensor& x, const Segment& segment, float s);

}  // namespace st::optim::detail
