// LLaMA: the decoder stack and the head, wired as Hugging Face's
// LlamaForCausalLM so that parameter names and numerics match it; and its
// model-table entries: the one check of its model.* sizes and its FLOPs.
#include "models/llama.h"

#include <limits>

namespace st::models {

namespace {

const ModelConfig& checked(const ModelConfig& c) {
  c.validate();
  return c;
}

std::unique_ptr<ModuleList> make_layers(const ModelConfig& c) {
  auto layers = std::make_unique<ModuleList>();
  // One rotary table for the whole stack: every layer uses the same positions.
  auto rope =
      std::make_shared<RopeCache>(c.hidden_size / c.num_attention_heads, c.rope_theta, c.max_position_embeddings);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->append(std::make_unique<DecoderLayer>(c, rope));
  return layers;
}

}  // namespace

// --- LlamaModel -----------------------------------------------------------------

LlamaModel::LlamaModel(const ModelConfig& config)
    : embed_tokens_(register_module(
          "embed_tokens",
          std::make_unique<Embedding>(checked(config).vocab_size, config.hidden_size, Init::normal(config.init_std)))),
      layers_(register_module("layers", make_layers(config))),
      norm_(register_module("norm", std::make_unique<RMSNorm>(config.hidden_size, config.rms_norm_eps))) {}

Tensor LlamaModel::forward_impl(const Tensor& tokens) {
  ST_CHECK(tokens.defined() && tokens.dtype() == DType::I32 && tokens.dim() == 2,
           "LlamaModel: tokens must be I32 [B, T], got {}", tokens.defined() ? tokens.str() : std::string("undefined"));
  Tensor h = embed_tokens_.forward(tokens);  // (B,T,D)
  h = layers_.forward(h);                    // (B,T,D)
  return norm_.forward(h);                   // (B,T,D)
}

Tensor LlamaModel::backward_impl(const Tensor& dy) {
  Tensor d = norm_.backward(dy);  // (B,T,D)
  d = layers_.backward(d);        // (B,T,D)
  return embed_tokens_.backward(d);
}

// --- Llama ------------------------------------------------------------------------

Llama::Llama(const ModelConfig& config)
    : config_(checked(config)),
      model_(register_module("model", std::make_unique<LlamaModel>(config))),
      lm_head_(
          register_module("lm_head", config.tie_word_embeddings
                                         ? std::make_unique<Linear>(model_.embed_tokens().weight())
                                         : std::make_unique<Linear>(config.hidden_size, config.vocab_size,
                                                                    Linear::Bias::No, Init::normal(config.init_std)))) {
  assign_fqns(*this);
}

Tensor Llama::forward_impl(const Tensor& tokens) {
  Tensor h = model_.forward(tokens);  // (B,T,D)
  return lm_head_.forward(h);         // (B,T,V)
}

Tensor Llama::forward_step(const Tensor& tokens, KVCache& cache, int64_t start, StepLogits which) {
  ST_CHECK(tokens.defined() && tokens.dtype() == DType::I32 && tokens.dim() == 2 && tokens.size(0) == 1 &&
               tokens.size(1) > 0,
           "Llama::forward_step: tokens must be I32 [1, n] with n >= 1, got {}",
           tokens.defined() ? tokens.str() : std::string("undefined"));
  const int64_t n = tokens.size(1);
  ST_CHECK(start >= 0 && start <= cache.length(),
           "Llama::forward_step: start position {} is past the {} position(s) the KV cache holds", start,
           cache.length());
  ST_CHECK(start + n <= cache.capacity(), "Llama::forward_step: positions [{}, {}) exceed the KV cache's {} positions",
           start, start + n, cache.capacity());
  ST_CHECK(cache.num_layers() == model_.layers().size(),
           "Llama::forward_step: the KV cache has {} layers, the model {}", cache.num_layers(), model_.layers().size());
  const DType weights = model_.embed_tokens().weight().value.dtype();
  ST_CHECK(cache.dtype() == weights, "Llama::forward_step: the KV cache holds {} but the weights are {}",
           dtype_name(cache.dtype()), dtype_name(weights));
  cache.length_ = start;                             // what the layers write next is position `start`
  Tensor h = model_.embed_tokens().forward(tokens);  // (1,n,D)
  for (size_t i = 0; i < model_.layers().size(); ++i) h = model_.layer(i).forward_cached(h, cache.layers_[i], start);
  if (which == StepLogits::Last) h = h.view({n, h.size(2)}).narrow0(n - 1, 1).view({1, 1, h.size(2)});  // (1,1,D)
  h = model_.norm().forward(h);                                                                         // (1,n|1,D)
  Tensor logits = lm_head_.forward(h);                                                                  // (1,n|1,V)
  cache.length_ = start + n;
  release_saved_recursive();
  return logits;
}

Tensor Llama::backward_impl(const Tensor& dlogits) {
  Tensor dh = lm_head_.backward(dlogits);  // (B,T,D)
  model_.backward(dh);
  return Tensor();
}

// --- KVCache ------------------------------------------------------------------------

KVCache::KVCache(const ModelConfig& config, int64_t capacity, DType dtype, Device device) : capacity_(capacity) {
  config.validate();
  ST_CHECK(capacity > 0 && capacity <= config.max_position_embeddings,
           "KVCache: capacity {} must be in [1, model.max_position_embeddings = {}]", capacity,
           config.max_position_embeddings);
  const int64_t head_dim = config.hidden_size / config.num_attention_heads;
  const Shape shape{1, capacity, config.num_key_value_heads, head_dim};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers_.push_back({Tensor::zeros(shape, dtype, device), Tensor::zeros(shape, dtype, device)});
  }
}

void KVCache::truncate(int64_t length) {
  ST_CHECK(length >= 0 && length <= length_, "KVCache::truncate({}): the cache holds {} position(s)", length, length_);
  length_ = length;
}

// --- the model table's entries -----------------------------------------------------

void validate_llama(const ModelConfig& m) {
  require(m.vocab_size > 0, "model.vocab_size", m.vocab_size, "a positive integer");
  require(m.hidden_size > 0, "model.hidden_size", m.hidden_size, "a positive integer");
  require(m.intermediate_size > 0, "model.intermediate_size", m.intermediate_size, "a positive integer");
  require(m.num_hidden_layers > 0, "model.num_hidden_layers", m.num_hidden_layers, "a positive integer");
  require(m.num_attention_heads > 0, "model.num_attention_heads", m.num_attention_heads, "a positive integer");
  require(m.num_key_value_heads > 0, "model.num_key_value_heads", m.num_key_value_heads, "a positive integer");
  require(m.hidden_size % m.num_attention_heads == 0, "model.hidden_size", m.hidden_size,
          format("a multiple of model.num_attention_heads ({})", m.num_attention_heads));
  require(m.num_attention_heads % m.num_key_value_heads == 0, "model.num_key_value_heads", m.num_key_value_heads,
          format("a divisor of model.num_attention_heads ({})", m.num_attention_heads));
  const int64_t head_dim = m.hidden_size / m.num_attention_heads;
  // Rotary embeddings rotate pairs of channels within a head.
  require(head_dim % 2 == 0, "model.hidden_size", m.hidden_size,
          format("an even head_dim = hidden_size / num_attention_heads for rotary embeddings (got {} / {} = {})",
                 m.hidden_size, m.num_attention_heads, head_dim));
  require(m.max_position_embeddings > 0, "model.max_position_embeddings", m.max_position_embeddings,
          "a positive integer");
  require(m.rope_theta > 0 && fits_f32(m.rope_theta), "model.rope_theta", m.rope_theta,
          "a positive number within F32 range");
  require(m.rms_norm_eps >= std::numeric_limits<float>::min() && m.rms_norm_eps < 1, "model.rms_norm_eps",
          m.rms_norm_eps, "a number in [1.2e-38, 1)");
  require(m.init_std > 0 && m.init_std <= 10, "model.init_std", m.init_std, "a number in (0, 10]");
}

void check_llama_seq_len(const ModelConfig& m, int64_t seq_len) {
  require(seq_len <= m.max_position_embeddings, "train.seq_len", seq_len,
          format("at most model.max_position_embeddings ({})", m.max_position_embeddings));
}

ModelFlops llama_flops(const ModelConfig& c, int64_t seq_len) {
  const int64_t d = c.hidden_size;
  const int64_t head_dim = d / c.num_attention_heads;
  const int64_t kv_width = head_dim * c.num_key_value_heads;   // k_proj / v_proj output width
  const int64_t layer_matmul = 2 * d * d                       // q_proj, o_proj
                               + 2 * d * kv_width              // k_proj, v_proj
                               + 3 * d * c.intermediate_size;  // gate_proj, up_proj, down_proj
  const int64_t layer_norms = 2 * d;                           // input_layernorm, post_attention_layernorm
  const int64_t table = c.vocab_size * d;                      // embed_tokens; lm_head has the same shape

  ModelFlops f;
  f.matmul_params = c.num_hidden_layers * layer_matmul + table;      // + lm_head, tied or not
  f.params = c.num_hidden_layers * (layer_matmul + layer_norms) + d  // + final norm
             + table                                                 // embed_tokens
             + (c.tie_word_embeddings ? 0 : table);                  // lm_head's own matrix
  const auto attention = 12.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(seq_len) *
                         static_cast<double>(head_dim * c.num_attention_heads);
  f.flops_per_token = 6.0 * static_cast<double>(f.matmul_params) + attention;
  return f;
}

ModelActivations llama_activations(const ModelConfig& c, int64_t seq_len) {
  const int64_t d = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t kv_width = d / heads * c.num_key_value_heads;
  ModelActivations a;
  a.layers = c.num_hidden_layers;
  // Per token: the two norms' inputs and outputs (4 d: the projections keep
  // the norm output they read), q and the attention output (2 d), k and v
  // (2 kv_width), and the MLP's gate, up and their product (3 intermediate).
  a.layer_elements = seq_len * (6 * d + 2 * kv_width + 3 * c.intermediate_size);
  a.layer_input = seq_len * d;
  a.layer_f32 = seq_len * (heads + 2);  // log-sum-exp per head, one scale per norm
  // The logits, then their gradient written over them, plus the embedding
  // output and the final norm's input and output.
  a.outside_f32 = seq_len * (c.vocab_size + 3 * d);
  return a;
}

}  // namespace st::models
