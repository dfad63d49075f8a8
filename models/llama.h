#pragma once
// LLaMA as Hugging Face's LlamaForCausalLM: the same tree, the same parameter
// names, the same math (RMSNorm with rms_norm_eps, rotary with rope_theta in
// the rotate_half layout, grouped-query attention, SwiGLU MLP, untied or tied
// lm_head).
//
//   LlamaForCausalLM
//     model: LlamaModel
//       embed_tokens: Embedding            model.embed_tokens.weight
//       layers: ModuleList
//         0, 1, ...: DecoderLayer          model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
//                                          model.layers.{i}.mlp.{gate,up,down}_proj.weight
//                                          model.layers.{i}.{input,post_attention}_layernorm.weight
//       norm: RMSNorm                      model.norm.weight
//     lm_head: Linear                      lm_head.weight (absent when tie_word_embeddings)
#include <memory>
#include <vector>

#include "models/layers.h"
#include "models/model.h"

namespace st::models {

/// model.name "llama" in the model table (models/model.cpp): the one check of
/// the model.* sizes (errors name the key), the train.seq_len limit, and the
/// FLOP count (models/model.h's ModelFlops).
void validate_llama(const ModelConfig& config);
void check_llama_seq_len(const ModelConfig& config, int64_t seq_len);
ModelFlops llama_flops(const ModelConfig& config, int64_t seq_len);
/// What one sequence keeps for its backward (the model table's activations).
ModelActivations llama_activations(const ModelConfig& config, int64_t seq_len);

/// The decoder stack without the head: tokens I32 [B, T] -> hidden [B, T, D].
class LlamaModel : public Module {
 public:
  explicit LlamaModel(const ModelConfig& config);
  std::string_view type_name() const override { return "LlamaModel"; }
  Embedding& embed_tokens() { return embed_tokens_; }
  ModuleList& layers() { return layers_; }
  DecoderLayer& layer(size_t i) { return static_cast<DecoderLayer&>(layers_[i]); }
  RMSNorm& norm() { return norm_; }

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Embedding& embed_tokens_;
  ModuleList& layers_;
  RMSNorm& norm_;
};

/// Keys and values of every decoder layer for the positions of one sequence
/// seen so far: a Llama's inference state (Llama::forward_step).
class KVCache {
 public:
  /// Room for `capacity` positions (at most model.max_position_embeddings)
  /// of one sequence; `dtype` must be the dtype of the model's weights.
  KVCache(const ModelConfig& config, int64_t capacity, DType dtype, Device device = Device::cpu());
  int64_t capacity() const { return capacity_; }
  /// Positions [0, length()) hold keys and values.
  int64_t length() const { return length_; }
  DType dtype() const { return layers_.front().k.dtype(); }
  /// Forgets positions from `length` on (0: start a new sequence).
  void truncate(int64_t length);
  const AttentionCache& layer(size_t i) const { return layers_[i]; }
  size_t num_layers() const { return layers_.size(); }

 private:
  friend class Llama;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  std::vector<AttentionCache> layers_;
};

/// Which positions' logits Llama::forward_step returns.
enum class StepLogits : uint8_t { All, Last };

/// forward(tokens I32 [B, T]) -> logits [B, T, V] (dtype of the weights);
/// backward(dlogits [B, T, V]) -> undefined tensor (tokens have no gradient).
class Llama : public Model {
 public:
  explicit Llama(const ModelConfig& config);
  std::string_view type_name() const override { return "LlamaForCausalLM"; }

  LossKind loss_kind() const override { return LossKind::CrossEntropy; }
  Shape sample_input_shape(int64_t seq_len) const override { return {seq_len}; }
  Shape sample_target_shape(int64_t seq_len) const override { return {seq_len}; }

  const ModelConfig& config() const { return config_; }
  LlamaModel& model() { return model_; }
  Linear& lm_head() { return lm_head_; }

  /// Inference with a KV cache, one sequence: tokens I32 [1, n] at positions
  /// [start, start + n), start <= cache.length() (a smaller start overwrites
  /// later positions); afterwards cache.length() is start + n. Returns logits
  /// [1, n, V] (StepLogits::All) or [1, 1, V] for the last position only
  /// (StepLogits::Last: a prompt's lm_head rows are not computed). The same
  /// ops as forward(tokens) over positions [0, start + n): rows agree with its
  /// rows up to the rounding of GEMMs over fewer rows. Runs the modules
  /// without hooks or wrappers, so it is for a plain (unsharded) model, and
  /// saves nothing for backward.
  Tensor forward_step(const Tensor& tokens, KVCache& cache, int64_t start, StepLogits which = StepLogits::All);

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dlogits) override;

 private:
  ModelConfig config_;
  LlamaModel& model_;
  Linear& lm_head_;
};

}  // namespace st::models
