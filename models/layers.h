#pragma once
// The layers of a LLaMA decoder (and the toy model's ReLU), each an explicit
// forward/backward pair over core/ops.h.
//
// Rules every layer follows:
// - Parameter gradients accumulate (+=); input gradients are written (=).
// - Activations take the dtype of the layer's parameter values (a BF16 weight
//   gives BF16 activations); an input gradient takes the dtype of its input;
//   saved statistics (rstd, lse) are F32.
// - Children are called through forward()/backward(), never *_impl, so hooks
//   and wrappers (e.g. recomputation) see every call.
// - forward saves handles (no copies) to what backward needs; backward drops
//   them when it is done, and so does release_saved().
// - Shapes: B batch, T time, D = hidden_size, H query heads, KV key/value
//   heads, hd = D / H, F = intermediate_size, V vocabulary, N = B*T rows.
#include <memory>

#include "models/config.h"
#include "models/module.h"

namespace st::models {

/// y = x W^T + b with W [out, in] (PyTorch layout), over any leading dims.
class Linear : public Module {
 public:
  enum class Bias : uint8_t { No, Yes };
  Linear(int64_t in_features, int64_t out_features, Bias bias, Init weight_init, Init bias_init = Init::zeros());
  /// A bias-free Linear over a weight [out, in] owned by another module (tied
  /// embeddings: lm_head over model.embed_tokens.weight). No FQN of its own;
  /// its gradient accumulates into the owner's grad.
  explicit Linear(Parameter& shared_weight);

  std::string_view type_name() const override { return "Linear"; }
  Parameter& weight() { return *weight_; }
  /// nullptr without bias.
  Parameter* bias() { return bias_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  /// dx += backward(dy), with the input gradient summed into dx by the GEMM
  /// itself (beta = 1: no temporary, no separate add pass). dx has the input's
  /// shape. A module with hooks or a wrapper runs backward() and an add.
  void backward_add(const Tensor& dy, const Tensor& dx);

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void release_saved() override { x_ = Tensor(); }

 private:
  // A column of ones [N, 1] (F32): the bias is added and reduced through gemm,
  // which every backend has.
  const Tensor& ones(int64_t rows, Device device);
  // dW += dy^T x (and db); then dx = dy W + beta * dx; then drops x_.
  void backward_into(const Tensor& dy, const Tensor& dx, float beta);

  int64_t in_ = 0;
  int64_t out_ = 0;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Tensor x_;     // (..., in) the input, saved for dW
  Tensor ones_;  // (N, 1) cache, not saved state
};

/// out[b, t, :] = weight[tokens[b, t], :]; tokens I32 of any shape. backward
/// returns an undefined tensor (tokens have no gradient).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Init init);
  std::string_view type_name() const override { return "Embedding"; }
  Parameter& weight() { return *weight_; }

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;
  void release_saved() override { tokens_ = Tensor(); }

 private:
  int64_t num_ = 0;
  int64_t dim_ = 0;
  Parameter* weight_ = nullptr;
  Tensor tokens_;  // (B,T) I32
};

/// x / sqrt(mean(x^2) + eps) * weight over the last dim; weight initialised to ones.
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  std::string_view type_name() const override { return "RMSNorm"; }
  Parameter& weight() { return *weight_; }
  /// The residual add before a pre-norm, fused with it: h = x + delta is
  /// written into `delta` (a branch output its caller owns and no one saved)
  /// and forward(h) is returned, bit-identical to add(x, delta, delta) then
  /// forward(delta). A module with hooks or a wrapper runs exactly that chain.
  Tensor forward_add(const Tensor& x, const Tensor& delta);
  /// backward(dy) + residual, fused the same way (bit-identical to the chain).
  Tensor backward_add(const Tensor& dy, const Tensor& residual);

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void release_saved() override {
    x_ = Tensor();
    rstd_ = Tensor();
  }

 private:
  int64_t dim_ = 0;
  float eps_ = 0;
  Parameter* weight_ = nullptr;
  Tensor x_;     // (N,D) input
  Tensor rstd_;  // (N) F32
};

/// Rotary cos/sin tables (F32 [T, hd]) for the current sequence length,
/// computed on first use and shared by every attention layer of a model.
class RopeCache {
 public:
  RopeCache(int64_t head_dim, double theta, int64_t max_positions);
  /// Tables for positions [0, seq_len) on `device`; recomputed when either changes.
  std::pair<const Tensor&, const Tensor&> get(int64_t seq_len, Device device);

 private:
  int64_t head_dim_ = 0;
  double theta_ = 0;
  int64_t max_positions_ = 0;
  Tensor cos_;  // (T,hd) F32
  Tensor sin_;  // (T,hd) F32
};

/// One attention layer's keys (after rotary) and values for positions
/// [0, capacity) of one sequence: what Attention::forward_cached reads and extends.
struct AttentionCache {
  Tensor k;  // (1,capacity,KV,hd) dtype of the layer's weights
  Tensor v;  // (1,capacity,KV,hd)
};

/// Causal self-attention with rotary positions and grouped-query heads; the
/// projections have no bias (Hugging Face LlamaAttention). Input [B, T, D].
class Attention : public Module {
 public:
  /// Uses hidden_size, num_attention_heads, num_key_value_heads,
  /// max_position_embeddings, rope_theta and init_std. `rope` may be shared
  /// between layers; nullptr makes a private one.
  explicit Attention(const ModelConfig& config, std::shared_ptr<RopeCache> rope = nullptr);
  std::string_view type_name() const override { return "Attention"; }
  Linear& q_proj() { return q_proj_; }
  Linear& k_proj() { return k_proj_; }
  Linear& v_proj() { return v_proj_; }
  Linear& o_proj() { return o_proj_; }

  /// Inference with a KV cache: x [1, n, D] holds the tokens at positions
  /// [start, start + n); their keys and values are written into `cache` and
  /// they attend to positions [0, start + n) of it (positions < start must
  /// hold earlier tokens). Returns [1, n, D]. The same ops as forward(), so a
  /// row equals forward()'s row for that position up to the rounding of
  /// products over fewer rows; nothing is saved for backward.
  Tensor forward_cached(const Tensor& x, const AttentionCache& cache, int64_t start);

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void release_saved() override;

 private:
  int64_t hidden_ = 0;
  int64_t heads_ = 0;
  int64_t kv_heads_ = 0;
  int64_t head_dim_ = 0;
  std::shared_ptr<RopeCache> rope_;
  Linear& q_proj_;
  Linear& k_proj_;
  Linear& v_proj_;
  Linear& o_proj_;
  Tensor q_;    // (B,T,H,hd) after rotary
  Tensor k_;    // (B,T,KV,hd) after rotary
  Tensor v_;    // (B,T,KV,hd)
  Tensor out_;  // (B,T,H,hd) attention output (also o_proj's saved input)
  Tensor lse_;  // (B,H,T) F32
};

/// down_proj(silu(gate_proj(x)) * up_proj(x)), no biases (Hugging Face LlamaMLP).
class MLP : public Module {
 public:
  /// Uses hidden_size, intermediate_size and init_std.
  explicit MLP(const ModelConfig& config);
  std::string_view type_name() const override { return "MLP"; }
  Linear& gate_proj() { return gate_proj_; }
  Linear& up_proj() { return up_proj_; }
  Linear& down_proj() { return down_proj_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void release_saved() override {
    gate_ = Tensor();
    up_ = Tensor();
  }

 private:
  Linear& gate_proj_;
  Linear& up_proj_;
  Linear& down_proj_;
  Tensor gate_;  // (B,T,F)
  Tensor up_;    // (B,T,F)
};

/// h = x + self_attn(input_layernorm(x)); y = h + mlp(post_attention_layernorm(h)).
class DecoderLayer : public Module {
 public:
  DecoderLayer(const ModelConfig& config, std::shared_ptr<RopeCache> rope = nullptr);
  std::string_view type_name() const override { return "DecoderLayer"; }
  RMSNorm& input_layernorm() { return input_layernorm_; }
  Attention& self_attn() { return self_attn_; }
  RMSNorm& post_attention_layernorm() { return post_attention_layernorm_; }
  MLP& mlp() { return mlp_; }

  /// forward() with the attention's KV cache (Attention::forward_cached):
  /// x [1, n, D] at positions [start, start + n). Its children run through
  /// forward(), so call release_saved_recursive() afterwards.
  Tensor forward_cached(const Tensor& x, const AttentionCache& cache, int64_t start);

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  // Registration order is the Hugging Face order of LlamaDecoderLayer.
  Attention& self_attn_;
  MLP& mlp_;
  RMSNorm& input_layernorm_;
  RMSNorm& post_attention_layernorm_;
};

/// max(x, 0); no parameters (the toy model's `relu`).
class ReLU : public Module {
 public:
  std::string_view type_name() const override { return "ReLU"; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void release_saved() override { x_ = Tensor(); }

 private:
  Tensor x_;  // (..) input
};

/// Children named "0", "1", ...; forward runs them in order and backward in
/// reverse (PyTorch's ModuleList has no forward; running it as a sequence lets
/// any subtree, this one included, become a shard unit).
class ModuleList : public Module {
 public:
  std::string_view type_name() const override { return "ModuleList"; }
  template <class M>
  M& append(std::unique_ptr<M> child) {
    return register_module(std::to_string(children().size()), std::move(child));
  }
  size_t size() const { return children().size(); }
  Module& operator[](size_t i) const { return *children()[i].second; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
};

}  // namespace st::models
