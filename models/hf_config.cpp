#include "models/hf_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/format.h"

namespace st::models {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

template <class Json>
Json parse_object(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const json::exception& e) {
    ST_FAIL("{} is not valid JSON: {}", where, e.what());
  }
  ST_CHECK(j.is_object(), "{} is not a JSON object", where);
  return j;
}

}  // namespace

std::string_view hf_torch_dtype(DType model_weights_dtype) {
  return model_weights_dtype == DType::BF16 ? "bfloat16" : "float32";
}

std::string hf_llama_config_json(const ModelConfig& m, std::string_view torch_dtype) {
  json j{{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"vocab_size", m.vocab_size},
         {"hidden_size", m.hidden_size},
         {"intermediate_size", m.intermediate_size},
         {"num_hidden_layers", m.num_hidden_layers},
         {"num_attention_heads", m.num_attention_heads},
         {"num_key_value_heads", m.num_key_value_heads},
         {"head_dim", m.hidden_size / m.num_attention_heads},
         {"max_position_embeddings", m.max_position_embeddings},
         {"rope_theta", m.rope_theta},
         {"rope_scaling", nullptr},
         {"rms_norm_eps", m.rms_norm_eps},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"attention_dropout", 0.0},
         {"mlp_bias", false},
         {"initializer_range", m.init_std},
         {"tie_word_embeddings", m.tie_word_embeddings},
         {"use_cache", true},
         {"torch_dtype", torch_dtype}};
  return j.dump(2) + "\n";
}

std::string hf_config_with_torch_dtype(const std::string& text, std::string_view torch_dtype,
                                       const std::string& where) {
  // ordered_json keeps a foreign file's keys in their order.
  ordered_json j = parse_object<ordered_json>(text, where);
  if (j.contains("torch_dtype")) j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::vector<std::string> hf_config_differences(const std::string& text, const ModelConfig& m,
                                               const std::string& where) {
  const json hf = parse_object<json>(text, where);
  std::vector<std::string> out;
  auto compare = [&](const char* key, const json& ours, const json& fallback) {
    const json theirs = hf.contains(key) ? hf.at(key) : fallback;
    if (theirs.is_null()) return;
    const bool same =
        theirs.is_number() && ours.is_number() ? theirs.get<double>() == ours.get<double>() : theirs == ours;
    if (!same) out.push_back(format("{} {} (model.{} {})", key, theirs.dump(), key, ours.dump()));
  };
  compare("vocab_size", m.vocab_size, nullptr);
  compare("hidden_size", m.hidden_size, nullptr);
  compare("intermediate_size", m.intermediate_size, nullptr);
  compare("num_hidden_layers", m.num_hidden_layers, nullptr);
  compare("num_attention_heads", m.num_attention_heads, nullptr);
  // Hugging Face's defaults where a config.json leaves a key out.
  compare("num_key_value_heads", m.num_key_value_heads, hf.value("num_attention_heads", json(nullptr)));
  compare("tie_word_embeddings", m.tie_word_embeddings, false);
  compare("rope_theta", m.rope_theta, 10000.0);
  return out;
}

}  // namespace st::models
