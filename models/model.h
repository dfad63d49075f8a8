#pragma once
// The models the trainer knows, built from `model.*` configuration.
#include <memory>

#include "core/config.h"
#include "models/module.h"

namespace st::models {

enum class LossKind : uint8_t { CrossEntropy, Mse };

/// A root module plus what the trainer needs to feed it.
class Model : public Module {
 public:
  /// Cross-entropy over tokens (LLaMA) or MSE on features (toy).
  virtual LossKind loss_kind() const = 0;
  /// Shape of one input sample: {seq_len} tokens (I32) or {16} features (F32).
  virtual Shape sample_input_shape(int64_t seq_len) const = 0;
  /// Shape of one target sample: {seq_len} tokens (I32) or {8} features (F32).
  virtual Shape sample_target_shape(int64_t seq_len) const = 0;
};

/// Builds `model.name` ("llama" or "toy") with unbound parameters; an
/// unknown name is an error listing the known ones.
std::unique_ptr<Model> build_model(const ModelConfig& config);

}  // namespace st::models
