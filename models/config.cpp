// model.*: the keys and their one check (through the model table).
#include "models/config.h"

#include "models/model.h"

namespace st {

void visit_keys(ModelConfig& c, const KeyVisitor& v) {
  v({"name", R"("llama" or "toy" (the DCP tutorial's Linear(16,16)-ReLU-Linear(16,8)))", models::model_names()},
    c.name);
  v({"vocab_size", "tokens in the vocabulary (256 for byte-level text)"}, c.vocab_size);
  v({"hidden_size", "model width"}, c.hidden_size);
  v({"intermediate_size", "SwiGLU hidden width"}, c.intermediate_size);
  v({"num_hidden_layers", "decoder layers"}, c.num_hidden_layers);
  v({"num_attention_heads", "query heads; divides hidden_size"}, c.num_attention_heads);
  v({"num_key_value_heads", "key/value heads (GQA); divides num_attention_heads"}, c.num_key_value_heads);
  v({"max_position_embeddings", "longest sequence the rotary tables cover"}, c.max_position_embeddings);
  v({"rope_theta", "rotary base"}, c.rope_theta);
  v({"rms_norm_eps", "RMSNorm epsilon"}, c.rms_norm_eps);
  v({"tie_word_embeddings", "lm_head shares model.embed_tokens.weight"}, c.tie_word_embeddings);
  v({"init_std", "std of the normal init of linears and embeddings"}, c.init_std);
}

void ModelConfig::validate() const {
  const auto names = models::model_names();
  require(in_choices(name, names), "model.name", name,
          format("one of {}{}", join(names, " | "), did_you_mean(name, names)));
  models::model_spec(name).validate(*this);
}

}  // namespace st
