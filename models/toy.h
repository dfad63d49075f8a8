#pragma once
// The PyTorch DCP tutorial's ToyModel: net1 = Linear(16, 16), relu, net2 =
// Linear(16, 8), both with bias, trained with MSE. Parameters net1.weight,
// net1.bias, net2.weight, net2.bias, initialised like torch.nn.Linear (in
// distribution): uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
#include "models/layers.h"
#include "models/model.h"

namespace st::models {

/// forward(x F32 [B, 16]) -> [B, 8]; backward(dy [B, 8]) -> dx [B, 16].
class Toy : public Model {
 public:
  static constexpr int64_t kIn = 16;
  static constexpr int64_t kHidden = 16;
  static constexpr int64_t kOut = 8;

  Toy();
  std::string_view type_name() const override { return "ToyModel"; }
  LossKind loss_kind() const override { return LossKind::Mse; }
  Shape sample_input_shape(int64_t) const override { return {kIn}; }
  Shape sample_target_shape(int64_t) const override { return {kOut}; }

  Linear& net1() { return net1_; }
  Linear& net2() { return net2_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Linear& net1_;
  ReLU& relu_;
  Linear& net2_;
};

/// model.name "toy" in the model table: 6 FLOPs per weight per sample, no attention.
ModelFlops toy_flops(const ModelConfig& config, int64_t seq_len);
/// What one sample keeps for its backward (the model table's activations).
ModelActivations toy_activations(const ModelConfig& config, int64_t seq_len);

}  // namespace st::models
