#pragma once
// The models the trainer knows: one table, one entry per model.name, holding
// everything the rest of the trainer asks of a model by name (building it,
// its checks, its FLOPs, its Hugging Face config.json). Adding a model is
// adding one entry in models/model.cpp.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/config.h"
#include "models/module.h"

namespace st::models {

enum class LossKind : uint8_t { CrossEntropy, Mse };

/// A root module plus what the trainer needs to feed it.
class Model : public Module {
 public:
  /// Cross-entropy over tokens (LLaMA) or MSE on features (toy).
  virtual LossKind loss_kind() const = 0;
  /// Shape of one input sample: {seq_len} tokens (I32) or {16} features (F32).
  virtual Shape sample_input_shape(int64_t seq_len) const = 0;
  /// Shape of one target sample: {seq_len} tokens (I32) or {8} features (F32).
  virtual Shape sample_target_shape(int64_t seq_len) const = 0;
};

/// Parameter counts and training FLOPs of one model configuration, counted
/// the way PaLM (Chowdhery et al. 2022, appendix B) and torchtitan count them:
/// only the FLOPs the model needs, never the ones recomputation adds, so that
/// runs with and without activation checkpointing are compared on the same
/// work. bench/torch_fsdp2.py implements the same formulas again for the
/// PyTorch peer; tests/unit/test_flops.cpp keeps the two in agreement.
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

/// What one sample (a sequence of seq_len tokens, or one toy sample) keeps in
/// memory between its forward and its backward, in elements: the estimate
/// behind the trainer's start-up memory line and its refusal of a micro-batch
/// that cannot fit (launch/memory_plan.h). Counted from the tensors the
/// layers keep for backward (models/layers.cpp); buffers inside an op are not.
struct ModelActivations {
  int64_t layers = 0;          // decoder layers (recomputation applies to these)
  int64_t layer_elements = 0;  // kept by one layer, in the compute dtype (param_dtype)
  int64_t layer_input = 0;     // kept by a recomputed layer (its input), in the compute dtype
  int64_t layer_f32 = 0;       // kept by one layer in F32 (softmax statistics, norm scales)
  int64_t outside_f32 = 0;     // outside the layers, in F32: the logits and their gradient, embeddings
};

/// One model.name and what it provides.
struct ModelSpec {
  std::string_view name;
  /// The model with unbound parameters (config already validated).
  std::unique_ptr<Model> (*build)(const ModelConfig& config);
  /// Throws st::Error naming the key unless `config`'s sizes make this model.
  void (*validate)(const ModelConfig& config);
  /// Throws unless sequences of `seq_len` fit the model (train.seq_len's check).
  void (*check_seq_len)(const ModelConfig& config, int64_t seq_len);
  /// Counts at sequence length `seq_len` (> 0; config validated).
  ModelFlops (*flops)(const ModelConfig& config, int64_t seq_len);
  /// The Hugging Face config.json text for model-* weights in `torch_dtype`;
  /// null for a model Hugging Face has no class for.
  std::string (*hf_config)(const ModelConfig& config, std::string_view torch_dtype);
  /// The fields of a config.json that disagree with `config` (see
  /// models/hf_config.h); null together with hf_config.
  std::vector<std::string> (*hf_config_differences)(const std::string& text, const ModelConfig& config,
                                                    const std::string& where);
  /// What one sample of `seq_len` keeps for its backward (config validated).
  ModelActivations (*activations)(const ModelConfig& config, int64_t seq_len);
};

/// Every model, in the order the help text lists them.
std::span<const ModelSpec> model_table();
/// The names of model_table(), for model.name's choices.
std::span<const std::string_view> model_names();
/// The entry of `name`; an error listing the known names when there is none.
const ModelSpec& model_spec(std::string_view name);

/// Builds `config.name` with unbound parameters (after validating `config`).
std::unique_ptr<Model> build_model(const ModelConfig& config);
/// The counts of `config` at sequence length `seq_len`; an error naming
/// train.seq_len unless it is positive.
ModelFlops model_flops(const ModelConfig& config, int64_t seq_len);

}  // namespace st::models
