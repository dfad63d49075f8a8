#pragma once
// The Hugging Face config.json of a LLaMA model ("LlamaForCausalLM"), next to
// the model config it mirrors: its one writer and reader. A unified checkpoint
// carries it so that Hugging Face tools load the model-* weights unchanged;
// resume and init_from compare it with the run's model.* keys.
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "models/config.h"

namespace st::models {

/// The file's name inside a checkpoint or model directory.
inline constexpr std::string_view kHfConfigName = "config.json";

/// torch_dtype for a directory whose model-* weights are stored in `dtype`
/// ("bfloat16" or "float32"); a directory without model-* weights says float32.
std::string_view hf_torch_dtype(DType model_weights_dtype);

/// config.json's text for `model` (a llama model config).
std::string hf_llama_config_json(const ModelConfig& model, std::string_view torch_dtype);

/// The model config a llama config.json `text` describes (model.name "llama";
/// Hugging Face's defaults for absent optional keys: num_key_value_heads =
/// num_attention_heads, max_position_embeddings 2048, rope_theta 10000,
/// rms_norm_eps 1e-6, tie_word_embeddings false). Errors name `where` and the
/// key: a missing size, another model_type, a head_dim other than
/// hidden_size / num_attention_heads, rope_scaling (not supported).
ModelConfig hf_llama_model_config(const std::string& text, const std::string& where);

/// `text` (a config.json) with its torch_dtype replaced, when it has one;
/// every other key as it was. `where` names the file in errors.
std::string hf_config_with_torch_dtype(const std::string& text, std::string_view torch_dtype, const std::string& where);

/// The fields of config.json `text` that disagree with `model` (those that
/// decide the tensors or their meaning: sizes, heads, vocabulary, tied
/// embeddings, rope_theta), each as "num_hidden_layers 2 (model.num_hidden_layers 1)";
/// Hugging Face's defaults stand in for absent keys. `where` names the file in errors.
std::vector<std::string> hf_config_differences(const std::string& text, const ModelConfig& model,
                                               const std::string& where);

}  // namespace st::models
