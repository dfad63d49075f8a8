// The recomputation wrapper and the choice of the modules it wraps.
#include "fsdp/recompute.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "fsdp/fsdp.h"

namespace st::fsdp {

namespace {

using models::ModuleBody;

constexpr const char* kTypesKey = "fsdp.activation_checkpointing.module_types";

class Recompute final : public models::ModuleWrapper {
 public:
  Tensor forward(ModuleBody& body, const Tensor& x) override {
    Tensor y = body.forward(x);
    // Everything below is rebuilt from x in backward; keeping only a handle
    // to x (no copy) is the whole memory saving. Releasing first: it also
    // clears this wrapper's input (and any nested recomputed module's).
    body.release_saved();
    input_ = x;
    return y;
  }

  Tensor backward(ModuleBody& body, const Tensor& dy) override {
    ST_CHECK(input_.defined(),
             "{}: backward with recomputation on, but no forward input was kept (backward without forward, or called "
             "twice)",
             body.type_name());
    // The output is not needed: the re-run is for the state it saves.
    body.forward(input_);
    Tensor dx = body.backward(dy);
    input_ = Tensor();
    return dx;
  }

  void release_saved() override { input_ = Tensor(); }

 private:
  Tensor input_;  // the only thing kept between forward and backward
};

}  // namespace

int apply_activation_checkpointing(models::Module& root, const RecomputeConfig& config) {
  if (config.mode == RecomputeMode::None) return 0;
  const int64_t every = config.mode == RecomputeMode::EveryN ? config.n : 1;  // n >= 1: FsdpConfig::validate
  // Chosen and checked before any is wrapped, so a refused config leaves the model as it was.
  std::vector<std::pair<std::string, models::Module*>> chosen;
  int64_t index = 0;  // modules of the listed types in order of appearance (pre-order)
  for (auto& entry : modules_of_types(root, config.module_types, kTypesKey)) {
    if (index % every == 0) chosen.push_back(std::move(entry));
    ++index;
  }
  for (const auto& [fqn, m] : chosen) {
    ST_CHECK(m->wrapper() == nullptr,
             "{}: module '{}' ({}) already has a wrapper (activation checkpointing applied twice?)", kTypesKey,
             fqn.empty() ? "(root)" : fqn, m->type_name());
  }
  for (const auto& entry : chosen) wrap_recompute(*entry.second);
  return static_cast<int>(chosen.size());
}

void wrap_recompute(models::Module& module) { module.set_wrapper(std::make_unique<Recompute>()); }

bool is_recomputed(const models::Module& module) { return dynamic_cast<const Recompute*>(module.wrapper()) != nullptr; }

}  // namespace st::fsdp
