#pragma once
// The GPU peak table and MFU (model FLOPs utilisation). A model's own FLOP
// count is its model-table entry's (models/model.h, model_flops()).
#include <string>

#include "core/dtype.h"

namespace st::metrics {

/// Dense (no sparsity) peak FLOP/s of one GPU for matrix products in `dtype`,
/// looked up by substrings of the CUDA device name ("NVIDIA H100 80GB HBM3").
/// BF16 means tensor cores with FP32 accumulation; F32 means plain FP32 (no
/// TF32). Returns 0 for an unknown device or dtype: callers print "MFU n/a".
double peak_flops(const std::string& device_name, DType dtype);

/// tokens_per_s (of one device) * flops_per_token / peak, in [0, 1] for a
/// plausible run; 0 when peak is 0 (unknown device).
double mfu(double tokens_per_s, double flops_per_token, double peak);

}  // namespace st::metrics
