// The model table: model.name -> everything the trainer asks of that model.
#include "models/model.h"

#include <array>

#include "models/hf_config.h"
#include "models/llama.h"
#include "models/toy.h"

namespace st::models {

namespace {

std::unique_ptr<Model> build_llama(const ModelConfig& config) { return std::make_unique<Llama>(config); }
std::unique_ptr<Model> build_toy(const ModelConfig&) { return std::make_unique<Toy>(); }
// The toy model has fixed shapes: no model.* size describes it, and it has no positions.
void accept_any(const ModelConfig&) {}
void accept_any_seq_len(const ModelConfig&, int64_t) {}

const std::array<ModelSpec, 2> kModels{{
    {"llama", build_llama, validate_llama, check_llama_seq_len, llama_flops, hf_llama_config_json,
     hf_config_differences, llama_activations},
    {"toy", build_toy, accept_any, accept_any_seq_len, toy_flops, nullptr, nullptr, toy_activations},
}};

}  // namespace

std::span<const ModelSpec> model_table() { return kModels; }

std::span<const std::string_view> model_names() {
  static const std::vector<std::string_view> kNames = [] {
    std::vector<std::string_view> out;
    for (const ModelSpec& spec : kModels) out.push_back(spec.name);
    return out;
  }();
  return kNames;
}

const ModelSpec& model_spec(std::string_view name) {
  for (const ModelSpec& spec : kModels)
    if (spec.name == name) return spec;
  ST_FAIL("model.name: unknown model '{}'; known models: {}", name, join(model_names(), ", "));
}

std::unique_ptr<Model> build_model(const ModelConfig& config) {
  config.validate();
  return model_spec(config.name).build(config);
}

ModelFlops model_flops(const ModelConfig& config, int64_t seq_len) {
  ST_CHECK(seq_len > 0, "train.seq_len must be positive to count FLOPs, got {}", seq_len);
  config.validate();
  return model_spec(config.name).flops(config, seq_len);
}

}  // namespace st::models
