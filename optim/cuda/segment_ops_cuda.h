#pragma once
// Private to optim/: the CUDA backend of optim/segment_ops.h, the twin of the
// CPU loops in optim/segment_ops.cpp. Each kernel is one launch over a whole
// flat segment on the compute stream of its tensors' GPU
// (core/cuda/stream.h); the ranges come as an I32 [R, 3] table on the same
// GPU with rows (offset, numel, decay flag 0/1), sorted and disjoint (what
// optim::range_table builds). Elements outside every range are not touched.
// Implemented in optim/cuda/segment_ops.cu; optim/cuda/no_cuda_segment_ops.cpp
// stands in without CUDA.
#include "core/tensor.h"
#include "optim/segment_ops.h"

namespace st::optim::cuda {

/// Fused AdamW over one flat F32 segment (param, grad, exp_avg, exp_avg_sq,
/// all [n] on one GPU). Same per-element operation order as the CPU loop
/// (FMA where it uses std::fma, no other contraction), so results match it
/// bit for bit.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const Tensor& ranges, const detail::AdamWScalars& s);
/// Sum of x*x over the ranges of the table (decay column ignored), accumulated
/// in double; waits for the result.
double masked_sum_of_squares(const Tensor& x, const Tensor& ranges);
/// x *= s over the ranges of the table (others untouched).
void masked_scale(const Tensor& x, const Tensor& ranges, float s);

}  // namespace st::optim::cuda
