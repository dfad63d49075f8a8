#include "models/hf_config.h"

#include <optional>

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

namespace {

// An integer key of config.json: `fallback` when absent, an error when absent without one.
int64_t int_key(const json& j, const char* key, const std::string& where, std::optional<int64_t> fallback = {}) {
  if (!j.contains(key) || j.at(key).is_null()) {
    ST_CHECK(fallback.has_value(), "{} has no '{}'", where, key);
    return *fallback;
  }
  ST_CHECK(j.at(key).is_number_integer(), "{}: '{}' is {}, expected an integer", where, key, j.at(key).dump());
  return j.at(key).get<int64_t>();
}

double number_key(const json& j, const char* key, const std::string& where, double fallback) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  ST_CHECK(j.at(key).is_number(), "{}: '{}' is {}, expected a number", where, key, j.at(key).dump());
  return j.at(key).get<double>();
}

}  // namespace

ModelConfig hf_llama_model_config(const std::string& text, const std::string& where) {
  const json j = parse_object<json>(text, where);
  const std::string type = j.value("model_type", std::string("llama"));
  ST_CHECK(type == "llama", "{}: model_type '{}', expected 'llama'", where, type);
  ST_CHECK(!j.contains("rope_scaling") || j.at("rope_scaling").is_null(), "{}: rope_scaling {} is not supported", where,
           j.contains("rope_scaling") ? j.at("rope_scaling").dump() : "");
  ModelConfig m;
  m.name = "llama";
  m.vocab_size = int_key(j, "vocab_size", where);
  m.hidden_size = int_key(j, "hidden_size", where);
  m.intermediate_size = int_key(j, "intermediate_size", where);
  m.num_hidden_layers = int_key(j, "num_hidden_layers", where);
  m.num_attention_heads = int_key(j, "num_attention_heads", where);
  m.num_key_value_heads = int_key(j, "num_key_value_heads", where, m.num_attention_heads);
  m.max_position_embeddings = int_key(j, "max_position_embeddings", where, 2048);
  m.rope_theta = number_key(j, "rope_theta", where, 10000.0);
  m.rms_norm_eps = number_key(j, "rms_norm_eps", where, 1e-6);
  m.init_std = number_key(j, "initializer_range", where, 0.02);
  m.tie_word_embeddings = j.value("tie_word_embeddings", false);
  if (m.num_attention_heads > 0) {
    const int64_t head_dim = int_key(j, "head_dim", where, m.hidden_size / m.num_attention_heads);
    ST_CHECK(head_dim * m.num_attention_heads == m.hidden_size,
             "{}: head_dim {} is not hidden_size / num_attention_heads = {} / {} (not supported)", where, head_dim,
             m.hidden_size, m.num_attention_heads);
  }
  return m;
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
