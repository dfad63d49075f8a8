// LLaMA: the decoder stack and the head, wired as Hugging Face's
// LlamaForCausalLM so that parameter names and numerics match it.
#include "models/llama.h"

namespace st::models {

namespace {

const ModelConfig& checked(const ModelConfig& c) {
  ST_CHECK(c.vocab_size > 0, "model.vocab_size must be positive, got {}", c.vocab_size);
  ST_CHECK(c.num_hidden_layers > 0, "model.num_hidden_layers must be positive, got {}", c.num_hidden_layers);
  ST_CHECK(c.max_position_embeddings > 0, "model.max_position_embeddings must be positive, got {}",
           c.max_position_embeddings);
  ST_CHECK(c.init_std > 0, "model.init_std must be positive, got {}", c.init_std);
  check_llama_dims(c);
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

Tensor Llama::backward_impl(const Tensor& dlogits) {
  Tensor dh = lm_head_.backward(dlogits);  // (B,T,D)
  model_.backward(dh);
  return Tensor();
}

}  // namespace st::models
