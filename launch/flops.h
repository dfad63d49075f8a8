#pragma once
// Model FLOPs and MFU (model FLOPs utilisation), the way PaLM (Chowdhery et
// al. 2022, appendix B) and torchtitan count them: only the FLOPs the model
// needs, never the ones recomputation adds, so that runs with and without
// activation checkpointing are compared on the same work. bench/torch_fsdp2.py
// implements the same formulas again for the PyTorch peer; tests/test_flops.cpp
// keeps the two in agreement.
#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/dtype.h"

namespace st::launch {

/// Parameter counts and training FLOPs of one model configuration.
struct ModelFlops {
  int64_t params = 0;  // every parameter the model holds (a tied matrix once)
  // Parameters that take part in a matrix product for every token: each
  // Linear weight, lm_head included (the tied matrix counts once, as
  // lm_head); not the input embedding table (a gather) and not the norms.
  int64_t matmul_params = 0;
  // Training (forward + backward) FLOPs per token at the given sequence
  // length T: 6 * matmul_params (2 forward, 4 backward per weight) plus
  // attention 12 * L * T * (H * head_dim), which counts the full T x T score
  // matrix of QK^T and AV as PaLM does (no halving for the causal mask). For
  // the toy model a "token" is one sample and there is no attention term.
  double flops_per_token = 0;
};

/// Counts of `config` (model.name llama or toy) at sequence length `seq_len`.
/// An unknown model.name is an error naming the key.
ModelFlops model_flops(const ModelConfig& config, int64_t seq_len);

/// Dense (no sparsity) peak FLOP/s of one GPU for matrix products in `dtype`,
/// looked up by substrings of the CUDA device name ("NVIDIA H100 80GB HBM3").
/// BF16 means tensor cores with FP32 accumulation; F32 means plain FP32 (no
/// TF32). Returns 0 for an unknown device or dtype: callers print "MFU n/a".
double peak_flops(const std::string& device_name, DType dtype);

/// tokens_per_s (of one device) * flops_per_token / peak, in [0, 1] for a
/// plausible run; 0 when peak is 0 (unknown device).
double mfu(double tokens_per_s, double flops_per_token, double peak);

}  // namespace st::launch
