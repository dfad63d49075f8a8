// The DCP tutorial's ToyModel.
#include "models/toy.h"

#include <cmath>

namespace st::models {

namespace {

// torch.nn.Linear.reset_parameters: kaiming_uniform(a=sqrt(5)) on the weight
// and uniform(+-1/sqrt(fan_in)) on the bias, both bound 1/sqrt(fan_in).
std::unique_ptr<Linear> torch_default_linear(int64_t in, int64_t out) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  return std::make_unique<Linear>(in, out, Linear::Bias::Yes, Init::uniform(bound), Init::uniform(bound));
}

}  // namespace

Toy::Toy()
    : net1_(register_module("net1", torch_default_linear(kIn, kHidden))),
      relu_(register_module("relu", std::make_unique<ReLU>())),
      net2_(register_module("net2", torch_default_linear(kHidden, kOut))) {
  assign_fqns(*this);
}

Tensor Toy::forward_impl(const Tensor& x) {
  ST_CHECK(x.defined() && x.dim() == 2 && x.size(1) == kIn, "ToyModel: input must be [B, {}], got {}", kIn,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  Tensor h = net1_.forward(x);  // (B,16)
  h = relu_.forward(h);         // (B,16)
  return net2_.forward(h);      // (B,8)
}

Tensor Toy::backward_impl(const Tensor& dy) {
  Tensor d = net2_.backward(dy);  // (B,16)
  d = relu_.backward(d);          // (B,16)
  return net1_.backward(d);       // (B,16)
}

ModelFlops toy_flops(const ModelConfig&, int64_t) {
  ModelFlops f;
  f.matmul_params = Toy::kIn * Toy::kHidden + Toy::kHidden * Toy::kOut;
  f.params = f.matmul_params + Toy::kHidden + Toy::kOut;  // + the two biases
  f.flops_per_token = 6.0 * static_cast<double>(f.matmul_params);
  return f;
}

ModelActivations toy_activations(const ModelConfig&, int64_t) {
  ModelActivations a;  // no decoder layers: what net1, ReLU and net2 keep, in F32
  a.outside_f32 = Toy::kIn + 2 * Toy::kHidden + Toy::kOut;
  return a;
}

}  // namespace st::models
