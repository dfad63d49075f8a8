// The model registry: model.name -> a Model with unbound parameters.
#include "models/model.h"

#include "models/llama.h"
#include "models/toy.h"

namespace st::models {

std::unique_ptr<Model> build_model(const ModelConfig& config) {
  if (config.name == "llama") return std::make_unique<Llama>(config);
  if (config.name == "toy") return std::make_unique<Toy>();
  ST_FAIL("model.name: unknown model '{}'; known models: llama, toy", config.name);
}

}  // namespace st::models
