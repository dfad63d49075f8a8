// models/: parameter names and counts as Hugging Face has them, the
// counter-based init, finite-difference gradient checks of every layer and
// of both models, hooks and wrappers (fsdp/recompute.h's recomputation:
// bit-identical, and a type chosen by config), and accumulation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/format.h"
#include "core/ops.h"
#include "fsdp/recompute.h"
#include "models/hf_config.h"
#include "models/layers.h"
#include "models/llama.h"
#include "models/model.h"
#include "models/toy.h"
#include "test_util.h"

namespace st::models {
namespace {

// --- helpers -------------------------------------------------------------------

ModelConfig tiny_llama(int64_t layers = 2, bool tied = false) {
  ModelConfig c;
  c.name = "llama";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

// Smaller still, for finite differences (every element costs two forwards).
ModelConfig grad_check_llama(bool tied = false) {
  ModelConfig c = tiny_llama(2, tied);
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 16;
  return c;
}

std::vector<std::string> fqns(Module& m) {
  std::vector<std::string> out;
  for (const auto& entry : m.named_parameters()) out.push_back(entry.first);
  return out;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f, DType dtype = DType::F32) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(v, shape, dtype);
}

Tensor random_tokens(const Shape& shape, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> v(static_cast<size_t>(shape_numel(shape)));
  for (int32_t& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

// Parameters away from their init (norm weights not all ones, biases not
// zero) so that every gradient path is exercised by the checks.
void randomize_parameters(Module& m, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (auto& [fqn, p] : m.named_parameters()) {
    float* v = p->value.data<float>();
    for (int64_t i = 0; i < p->value.numel(); ++i) v[i] = (p->init.kind == Init::Kind::Ones ? 1.0f : 0.0f) + dist(rng);
  }
}

void zero_grads(Module& m) {
  for (auto& entry : m.named_parameters()) entry.second->grad.zero_();
}

double dot(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_floats(), y = b.to_floats();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

// A loss of the module output; fills `dout` with dL/dout when given.
using LossFn = std::function<double(const Tensor& out, Tensor* dout)>;

// L = sum(out * R): dL/dout = R, so every output element weighs in.
LossFn weighted_sum_loss(const Shape& out_shape, uint64_t seed) {
  Tensor r = random_tensor(out_shape, seed);
  return [r](const Tensor& out, Tensor* dout) {
    if (dout != nullptr) *dout = r.clone();
    return dot(out, r);
  };
}

struct GradError {
  std::string name;
  double rel = 0;  // ||numeric - analytic|| / ||analytic||
};

// Relative error of the analytic gradient `analytic` against central
// differences of `loss_at` with respect to the F32 elements `values`.
GradError numeric_check(const std::string& name, float* values, int64_t n, const std::vector<float>& analytic,
                        const std::function<double()>& loss_at, float eps) {
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float saved = values[i];
    values[i] = saved + eps;
    const double up = loss_at();
    values[i] = saved - eps;
    const double down = loss_at();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    const double a = analytic[static_cast<size_t>(i)];
    diff2 += (numeric - a) * (numeric - a);
    ref2 += a * a;
  }
  return {name, std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-12)};
}

// Checks every parameter gradient and (for float inputs) the input gradient
// of `m` at input `x` under `loss`, against central differences.
void check_gradients(Module& m, const Tensor& x, const LossFn& loss, float eps = 1e-2f, double tol = 2e-3) {
  zero_grads(m);
  Tensor dout;
  loss(m.forward(x), &dout);
  Tensor dx = m.backward(dout);
  auto loss_at = [&] { return loss(m.forward(x), nullptr); };

  std::vector<GradError> errors;
  for (auto& [fqn, p] : m.named_parameters()) {
    errors.push_back(numeric_check(fqn, p->value.data<float>(), p->value.numel(), p->grad.to_floats(), loss_at, eps));
  }
  if (x.dtype() == DType::F32) {
    ASSERT_TRUE(dx.defined());
    ASSERT_EQ(dx.shape(), x.shape());
    errors.push_back(numeric_check("input", x.data<float>(), x.numel(), dx.to_floats(), loss_at, eps));
  } else {
    EXPECT_FALSE(dx.defined()) << "tokens have no gradient";
  }
  m.release_saved_recursive();
  ASSERT_FALSE(errors.empty());
  for (const GradError& e : errors) EXPECT_LT(e.rel, tol) << m.type_name() << " gradient of " << e.name;
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " differs";
}

// --- names, counts, types ----------------------------------------------------------

std::vector<std::string> expected_layer_fqns(int i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  return {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
          p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight",    p + "mlp.up_proj.weight",
          p + "mlp.down_proj.weight",    p + "input_layernorm.weight",  p + "post_attention_layernorm.weight"};
}

TEST(LlamaNames, FqnsAreHuggingFaceNamesInOrder) {
  Llama model(tiny_llama());
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int i = 0; i < 2; ++i) {
    for (auto& name : expected_layer_fqns(i)) expected.push_back(name);
  }
  expected.push_back("model.norm.weight");
  expected.push_back("lm_head.weight");
  EXPECT_EQ(fqns(model), expected);
  // The constructor already gave every parameter its name for error messages.
  for (auto& [fqn, p] : model.named_parameters()) EXPECT_EQ(p->fqn, fqn);
}

TEST(LlamaNames, TiedEmbeddingsHaveNoLmHeadWeight) {
  Llama model(tiny_llama(2, /*tied=*/true));
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int i = 0; i < 2; ++i) {
    for (auto& name : expected_layer_fqns(i)) expected.push_back(name);
  }
  expected.push_back("model.norm.weight");
  EXPECT_EQ(fqns(model), expected);
  ASSERT_EQ(model.lm_head().shared_parameters().size(), 1u);
  EXPECT_EQ(model.lm_head().shared_parameters()[0], &model.model().embed_tokens().weight());
  EXPECT_TRUE(model.lm_head().own_parameters().empty());
}

TEST(LlamaNames, ParameterCountsPerSubtree) {
  const ModelConfig c = tiny_llama();
  const int64_t v = c.vocab_size, d = c.hidden_size, f = c.intermediate_size, l = c.num_hidden_layers;
  const int64_t kv = d / c.num_attention_heads * c.num_key_value_heads;
  const int64_t attn = 2 * d * d + 2 * d * kv;
  const int64_t mlp = 3 * d * f;
  const int64_t layer = attn + mlp + 2 * d;
  const int64_t body = v * d + l * layer + d;

  Llama model(c);
  EXPECT_EQ(model.model().layer(0).self_attn().num_parameters(), attn);
  EXPECT_EQ(model.model().layer(1).mlp().num_parameters(), mlp);
  EXPECT_EQ(model.model().layer(0).num_parameters(), layer);
  EXPECT_EQ(model.model().layers().num_parameters(), l * layer);
  EXPECT_EQ(model.model().num_parameters(), body);
  EXPECT_EQ(model.lm_head().num_parameters(), v * d);
  EXPECT_EQ(model.num_parameters(), body + v * d);

  // Tied: lm_head alone still uses V*D weights, the whole model counts them once.
  Llama tied(tiny_llama(2, true));
  EXPECT_EQ(tied.lm_head().num_parameters(), v * d);
  EXPECT_EQ(tied.num_parameters(), body);
}

TEST(LlamaNames, ModuleTreeAndTypeNames) {
  Llama model(tiny_llama(1));
  std::vector<std::pair<std::string, std::string>> got;
  for (auto& [fqn, m] : model.named_modules()) got.emplace_back(fqn, std::string(m->type_name()));
  std::vector<std::pair<std::string, std::string>> expected = {
      {"", "LlamaForCausalLM"},
      {"model", "LlamaModel"},
      {"model.embed_tokens", "Embedding"},
      {"model.layers", "ModuleList"},
      {"model.layers.0", "DecoderLayer"},
      {"model.layers.0.self_attn", "Attention"},
      {"model.layers.0.self_attn.q_proj", "Linear"},
      {"model.layers.0.self_attn.k_proj", "Linear"},
      {"model.layers.0.self_attn.v_proj", "Linear"},
      {"model.layers.0.self_attn.o_proj", "Linear"},
      {"model.layers.0.mlp", "MLP"},
      {"model.layers.0.mlp.gate_proj", "Linear"},
      {"model.layers.0.mlp.up_proj", "Linear"},
      {"model.layers.0.mlp.down_proj", "Linear"},
      {"model.layers.0.input_layernorm", "RMSNorm"},
      {"model.layers.0.post_attention_layernorm", "RMSNorm"},
      {"model.norm", "RMSNorm"},
      {"lm_head", "Linear"},
  };
  EXPECT_EQ(got, expected);
}

TEST(LlamaNames, ShapesAndWeightDecay) {
  Llama model(tiny_llama());
  for (auto& [fqn, p] : model.named_parameters()) {
    EXPECT_EQ(p->weight_decay, p->shape.size() >= 2) << fqn;
    EXPECT_EQ(p->weight_decay, fqn.find("norm") == std::string::npos) << fqn;
  }
  auto named = model.named_parameters();
  EXPECT_EQ(named[0].second->shape, (Shape{64, 32}));      // embed_tokens [V, D]
  EXPECT_EQ(named[1].second->shape, (Shape{32, 32}));      // q_proj [H*hd, D]
  EXPECT_EQ(named[2].second->shape, (Shape{16, 32}));      // k_proj [KV*hd, D]
  EXPECT_EQ(named[5].second->shape, (Shape{48, 32}));      // gate_proj [F, D]
  EXPECT_EQ(named[7].second->shape, (Shape{32, 48}));      // down_proj [D, F]
  EXPECT_EQ(named.back().second->shape, (Shape{64, 32}));  // lm_head [V, D]
}

TEST(ModelRegistry, BuildsKnownModelsAndNamesTheOthers) {
  ModelConfig c = tiny_llama();
  auto llama = build_model(c);
  EXPECT_EQ(llama->type_name(), "LlamaForCausalLM");
  EXPECT_EQ(llama->loss_kind(), LossKind::CrossEntropy);
  EXPECT_EQ(llama->sample_input_shape(8), (Shape{8}));
  EXPECT_EQ(llama->sample_target_shape(8), (Shape{8}));

  c.name = "toy";
  auto toy = build_model(c);
  EXPECT_EQ(toy->type_name(), "ToyModel");
  EXPECT_EQ(toy->loss_kind(), LossKind::Mse);
  EXPECT_EQ(fqns(*toy), (std::vector<std::string>{"net1.weight", "net1.bias", "net2.weight", "net2.bias"}));
  EXPECT_EQ(toy->num_parameters(), 16 * 16 + 16 + 16 * 8 + 8);
  EXPECT_EQ(toy->sample_input_shape(99), (Shape{16}));
  EXPECT_EQ(toy->sample_target_shape(99), (Shape{8}));

  c.name = "gpt2";
  std::string msg = test::error_of([&] { build_model(c); });
  EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
  EXPECT_NE(msg.find("toy"), std::string::npos) << msg;
}

TEST(ModelRegistry, BadDimensionsNameTheKey) {
  ModelConfig c = tiny_llama();
  c.num_key_value_heads = 3;
  std::string msg = test::error_of([&] { build_model(c); });
  EXPECT_NE(msg.find("model.num_key_value_heads"), std::string::npos) << msg;
  c = tiny_llama();
  c.num_attention_heads = 5;
  msg = test::error_of([&] { build_model(c); });
  EXPECT_NE(msg.find("model.num_attention_heads"), std::string::npos) << msg;
}

// --- binding and init ----------------------------------------------------------------

TEST(Binding, FlatBuffersFollowNamedParameterOrder) {
  Llama model(tiny_llama());
  const int64_t n = model.num_parameters();
  Tensor flat = Tensor::zeros({n}, DType::F32);
  Tensor grad = Tensor::zeros({n}, DType::F32);
  auto layout = bind_parameters_flat(model, flat, grad);
  auto named = model.named_parameters();
  ASSERT_EQ(layout.size(), named.size());
  int64_t offset = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(layout[i].first, named[i].first);
    EXPECT_EQ(layout[i].second.first, offset);
    EXPECT_EQ(layout[i].second.second, shape_numel(named[i].second->shape));
    EXPECT_TRUE(named[i].second->value.shares_storage_with(flat));
    EXPECT_EQ(named[i].second->value.storage_offset(), offset);
    EXPECT_EQ(named[i].second->grad.storage_offset(), offset);
    EXPECT_EQ(named[i].second->value.shape(), named[i].second->shape);
    offset += layout[i].second.second;
  }
  EXPECT_EQ(offset, n);
  // Initialising through the views fills the flat buffer.
  init_parameters(model, 7);
  EXPECT_EQ(flat.data<float>()[layout.back().second.first - 1], 1.0f);  // last element of model.norm.weight

  Tensor small = Tensor::zeros({n - 1}, DType::F32);
  std::string msg = test::error_of([&] { bind_parameters_flat(model, small, grad); });
  EXPECT_NE(msg.find(std::to_string(n)), std::string::npos) << msg;
}

TEST(Binding, UnboundParameterErrorNamesItsFqn) {
  Llama model(tiny_llama());
  Tensor tokens = random_tokens({1, 4}, 64, 1);
  std::string msg = test::error_of([&] { model.forward(tokens); });
  EXPECT_NE(msg.find("model.embed_tokens.weight"), std::string::npos) << msg;
}

TEST(Init, SliceIndependence) {
  Llama model(tiny_llama());
  allocate_parameters(model, DType::F32);
  init_parameters(model, 1234);
  for (auto& [fqn, p] : model.named_parameters()) {
    const int64_t n = p->value.numel();
    const std::vector<std::pair<int64_t, int64_t>> slices = {{0, n}, {0, 1}, {n - 1, 1}, {n / 3, n / 2}, {5, 17}};
    for (auto [begin, len] : slices) {
      Tensor out = Tensor::empty({len}, DType::F32);
      init_parameter_slice(*p, fqn, 1234, begin, out);
      EXPECT_EQ(std::memcmp(out.raw_data(), p->value.data<float>() + begin, static_cast<size_t>(len) * 4), 0)
          << fqn << " slice [" << begin << ", " << begin + len << ")";
    }
  }
  // BF16 values are the F32 values rounded once.
  Parameter& q = model.model().layer(1).self_attn().q_proj().weight();
  Tensor bf = Tensor::empty({10}, DType::BF16);
  init_parameter_slice(q, q.fqn, 1234, 100, bf);
  for (int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(bf.data<BFloat16>()[i].bits, BFloat16(q.value.data<float>()[100 + i]).bits);

  Tensor bad = Tensor::empty({10}, DType::F32);
  std::string msg = test::error_of([&] { init_parameter_slice(q, q.fqn, 1234, q.value.numel() - 5, bad); });
  EXPECT_NE(msg.find(q.fqn), std::string::npos) << msg;
}

TEST(Init, SeedsAndNamesGiveDifferentValues) {
  Llama a(tiny_llama()), b(tiny_llama()), c(tiny_llama());
  for (Module* m : {static_cast<Module*>(&a), static_cast<Module*>(&b), static_cast<Module*>(&c)}) {
    allocate_parameters(*m, DType::F32);
  }
  init_parameters(a, 1);
  init_parameters(b, 2);
  init_parameters(c, 1);
  auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor& va = pa[i].second->value;
    EXPECT_EQ(std::memcmp(va.raw_data(), pc[i].second->value.raw_data(), va.nbytes()), 0) << pa[i].first;
    if (pa[i].second->init.kind == Init::Kind::Normal) {
      EXPECT_NE(std::memcmp(va.raw_data(), pb[i].second->value.raw_data(), va.nbytes()), 0) << pa[i].first;
    }
  }
  // Same shape, different FQN: different values.
  const Tensor& k0 = a.model().layer(0).self_attn().k_proj().weight().value;
  const Tensor& k1 = a.model().layer(1).self_attn().k_proj().weight().value;
  EXPECT_NE(std::memcmp(k0.raw_data(), k1.raw_data(), k0.nbytes()), 0);
}

TEST(Init, NormalStatisticsAndOnes) {
  ModelConfig cfg = tiny_llama(1);
  cfg.vocab_size = 4096;
  cfg.hidden_size = 64;
  Llama model(cfg);
  allocate_parameters(model, DType::F32);
  init_parameters(model, 99);
  std::vector<float> v = model.model().embed_tokens().weight().value.to_floats();  // 262144 normals
  double sum = 0, sq = 0;
  for (float x : v) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size());
  const double mean = sum / n;
  const double std = std::sqrt(sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 5 * 0.02 / std::sqrt(n));
  EXPECT_NEAR(std, 0.02, 0.02 * 0.01);
  // Roughly normal: about 68.3% within one std.
  int64_t within = 0;
  for (float x : v) within += std::abs(x) < 0.02f;
  EXPECT_NEAR(static_cast<double>(within) / n, 0.6827, 0.005);

  for (auto& [fqn, p] : model.named_parameters()) {
    if (fqn.find("norm") == std::string::npos) continue;
    for (float x : p->value.to_floats()) ASSERT_EQ(x, 1.0f) << fqn;
  }
}

TEST(Init, ToyUniformBounds) {
  Toy toy;
  allocate_parameters(toy, DType::F32);
  init_parameters(toy, 5);
  for (auto& [fqn, p] : toy.named_parameters()) {
    const double bound = 1.0 / std::sqrt(16.0);  // fan_in is 16 for both layers
    double sq = 0;
    for (float x : p->value.to_floats()) {
      ASSERT_GE(x, -bound) << fqn;
      ASSERT_LE(x, bound) << fqn;
      sq += static_cast<double>(x) * x;
    }
    if (p->value.numel() >= 128) {
      // Uniform(-a, a) has std a/sqrt(3); loose for 128..256 samples.
      EXPECT_NEAR(std::sqrt(sq / static_cast<double>(p->value.numel())), bound / std::sqrt(3.0), 0.25 * bound) << fqn;
    }
  }
}

// --- gradient checks -----------------------------------------------------------------

TEST(GradCheck, Linear) {
  for (Linear::Bias bias : {Linear::Bias::No, Linear::Bias::Yes}) {
    Linear lin(5, 3, bias, Init::normal(0.1));
    allocate_parameters(lin, DType::F32);
    randomize_parameters(lin, 1, 0.5f);
    Tensor x = random_tensor({2, 4, 5}, 2);
    check_gradients(lin, x, weighted_sum_loss({2, 4, 3}, 3));
  }
}

TEST(GradCheck, Embedding) {
  Embedding emb(7, 4, Init::normal(0.1));
  allocate_parameters(emb, DType::F32);
  randomize_parameters(emb, 1, 0.5f);
  Tensor tokens = Tensor::from_vector(std::vector<int32_t>{0, 3, 3, 6, 1, 3}, {2, 3});  // repeats accumulate
  Tensor out = emb.forward(tokens);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 4}));
  check_gradients(emb, tokens, weighted_sum_loss({2, 3, 4}, 3));
}

TEST(GradCheck, RMSNorm) {
  RMSNorm norm(6, 1e-5);
  allocate_parameters(norm, DType::F32);
  randomize_parameters(norm, 1, 0.5f);
  check_gradients(norm, random_tensor({2, 3, 6}, 2), weighted_sum_loss({2, 3, 6}, 3));
}

TEST(GradCheck, AttentionGqa) {
  ModelConfig c = grad_check_llama();
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // two query heads per KV head
  Attention attn(c);
  allocate_parameters(attn, DType::F32);
  randomize_parameters(attn, 1, 0.6f);
  check_gradients(attn, random_tensor({2, 5, 8}, 2), weighted_sum_loss({2, 5, 8}, 3));
}

TEST(GradCheck, Mlp) {
  MLP mlp(grad_check_llama());
  allocate_parameters(mlp, DType::F32);
  randomize_parameters(mlp, 1, 0.6f);
  check_gradients(mlp, random_tensor({2, 3, 8}, 2), weighted_sum_loss({2, 3, 8}, 3));
}

TEST(GradCheck, DecoderLayer) {
  DecoderLayer layer(grad_check_llama());
  allocate_parameters(layer, DType::F32);
  randomize_parameters(layer, 1, 0.6f);
  check_gradients(layer, random_tensor({2, 5, 8}, 2), weighted_sum_loss({2, 5, 8}, 3));
}

// Summed (not mean) cross-entropy keeps the gradients large against F32 noise.
LossFn cross_entropy_loss(const Tensor& targets) {
  return [targets](const Tensor& logits, Tensor* dlogits) {
    const int64_t v = logits.size(-1);
    Tensor d = Tensor::empty(logits.shape(), DType::F32);
    ops::LossSum ls = ops::cross_entropy(logits.view({-1, v}), targets.view({-1}), -100, 1.0f, d.view({-1, v}));
    if (dlogits != nullptr) *dlogits = d;
    return ls.sum;
  };
}

TEST(GradCheck, LlamaCrossEntropy) {
  for (bool tied : {false, true}) {
    Llama model(grad_check_llama(tied));
    allocate_parameters(model, DType::F32);
    randomize_parameters(model, 1, 0.5f);
    Tensor tokens = random_tokens({2, 5}, 16, 2);
    Tensor targets = random_tokens({2, 5}, 16, 3);
    EXPECT_EQ(model.forward(tokens).shape(), (Shape{2, 5, 16}));
    SCOPED_TRACE(tied ? "tied" : "untied");
    // Two layers of F32 noise under the differences: measured <= 1.5e-3 (a bug is O(1)).
    check_gradients(model, tokens, cross_entropy_loss(targets), 1e-2f, 5e-3);
  }
}

TEST(GradCheck, ToyMse) {
  Toy toy;
  allocate_parameters(toy, DType::F32);
  init_parameters(toy, 3);
  Tensor target = random_tensor({4, 8}, 4);
  LossFn mse = [target](const Tensor& out, Tensor* dout) {
    Tensor d = Tensor::empty(out.shape(), DType::F32);
    ops::LossSum ls = ops::mse(out, target, 1.0f, d);
    if (dout != nullptr) *dout = d;
    return ls.sum;
  };
  // A small step keeps ReLU inputs on their side of the kink.
  check_gradients(toy, random_tensor({4, 16}, 2), mse, 1e-3f, 5e-3);
}

// --- recomputation, hooks, accumulation ---------------------------------------------

struct GradSnapshot {
  Tensor out, dx;
  std::vector<Tensor> grads;
};

GradSnapshot run_once(Module& m, const Tensor& x, const Tensor& dy) {
  GradSnapshot s;
  zero_grads(m);
  s.out = m.forward(x).clone();
  Tensor dx = m.backward(dy);
  if (dx.defined()) s.dx = dx.clone();
  for (auto& entry : m.named_parameters()) s.grads.push_back(entry.second->grad.clone());
  return s;
}

void expect_same_run(const GradSnapshot& a, const GradSnapshot& b, Module& m) {
  expect_bitwise_equal(a.out, b.out, "output");
  ASSERT_EQ(a.dx.defined(), b.dx.defined());
  if (a.dx.defined()) expect_bitwise_equal(a.dx, b.dx, "input gradient");
  auto named = m.named_parameters();
  for (size_t i = 0; i < a.grads.size(); ++i) expect_bitwise_equal(a.grads[i], b.grads[i], named[i].first);
}

TEST(Recompute, DecoderLayerIsBitIdentical) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    DecoderLayer stored(tiny_llama()), recomputed(tiny_llama());
    for (DecoderLayer* l : {&stored, &recomputed}) {
      allocate_parameters(*l, dtype);
      init_parameters(*l, 11);
    }
    fsdp::wrap_recompute(recomputed);
    Tensor x = random_tensor({2, 8, 32}, 1, -1, 1, dtype);
    Tensor dy = random_tensor({2, 8, 32}, 2, -1, 1, dtype);
    GradSnapshot a = run_once(stored, x, dy);
    GradSnapshot b = run_once(recomputed, x, dy);
    expect_same_run(a, b, stored);
  }
}

TEST(Recompute, LlamaWithEveryLayerRecomputedIsBitIdentical) {
  Llama stored(tiny_llama(3)), recomputed(tiny_llama(3));
  for (Llama* m : {&stored, &recomputed}) {
    allocate_parameters(*m, DType::F32);
    init_parameters(*m, 21);
  }
  for (size_t i = 0; i < recomputed.model().layers().size(); ++i) fsdp::wrap_recompute(recomputed.model().layer(i));
  Tensor tokens = random_tokens({2, 8}, 64, 1);
  Tensor dlogits = random_tensor({2, 8, 64}, 2);
  GradSnapshot a = run_once(stored, tokens, dlogits);
  GradSnapshot b = run_once(recomputed, tokens, dlogits);
  expect_same_run(a, b, stored);
}

// A type other than DecoderLayer, chosen as the trainer chooses it
// (fsdp.activation_checkpointing.module_types): the same outputs and gradients
// bit for bit as a stored run, for single linears, for blocks inside layers
// that are not recomputed, and for a recomputed module inside another.
TEST(Recompute, ModulesOfAConfiguredTypeGiveTheSameGradients) {
  {
    Toy stored, recomputed;
    for (Toy* m : {&stored, &recomputed}) {
      allocate_parameters(*m, DType::F32);
      init_parameters(*m, 31);
    }
    RecomputeConfig rc;
    rc.mode = RecomputeMode::Full;
    rc.module_types = {"Linear"};
    EXPECT_EQ(fsdp::apply_activation_checkpointing(recomputed, rc), 2);
    Tensor x = random_tensor({4, Toy::kIn}, 1);
    Tensor dy = random_tensor({4, Toy::kOut}, 2);
    GradSnapshot a = run_once(stored, x, dy);
    GradSnapshot b = run_once(recomputed, x, dy);
    expect_same_run(a, b, stored);
  }
  struct Case {
    RecomputeMode mode;
    std::vector<std::string> types;
    int wrapped;
  };
  for (const Case& c :
       {Case{RecomputeMode::EveryN, {"MLP", "Attention"}, 2}, Case{RecomputeMode::Full, {"DecoderLayer", "MLP"}, 6}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      Llama stored(tiny_llama(3)), recomputed(tiny_llama(3));
      for (Llama* m : {&stored, &recomputed}) {
        allocate_parameters(*m, dtype);
        init_parameters(*m, 41);
      }
      RecomputeConfig rc;
      rc.mode = c.mode;
      rc.n = 3;  // every_n: attention 0 and MLP 1 of the six blocks
      rc.module_types = c.types;
      EXPECT_EQ(fsdp::apply_activation_checkpointing(recomputed, rc), c.wrapped);
      Tensor tokens = random_tokens({2, 8}, 64, 1);
      Tensor dlogits = random_tensor({2, 8, 64}, 2, -1, 1, dtype);
      GradSnapshot a = run_once(stored, tokens, dlogits);
      GradSnapshot b = run_once(recomputed, tokens, dlogits);
      expect_same_run(a, b, stored);
    }
  }
}

TEST(Recompute, BackwardWithoutForwardIsAnError) {
  DecoderLayer layer(tiny_llama());
  allocate_parameters(layer, DType::F32);
  init_parameters(layer, 1);
  fsdp::wrap_recompute(layer);
  Tensor dy = random_tensor({1, 4, 32}, 2);
  std::string msg = test::error_of([&] { layer.backward(dy); });
  EXPECT_NE(msg.find("DecoderLayer"), std::string::npos) << msg;
}

class RecordingHooks : public ModuleHooks {
 public:
  explicit RecordingHooks(std::vector<std::string>& log) : log_(log) {}
  void name(Module& m, std::string n) { names_.emplace_back(&m, std::move(n)); }
  void pre_forward(Module& m) override { log_.push_back("pre_forward " + lookup(m)); }
  void post_forward(Module& m) override { log_.push_back("post_forward " + lookup(m)); }
  void pre_backward(Module& m) override { log_.push_back("pre_backward " + lookup(m)); }
  void post_backward(Module& m) override { log_.push_back("post_backward " + lookup(m)); }

 private:
  std::string lookup(Module& m) const {
    for (const auto& [p, n] : names_) {
      if (p == &m) return n;
    }
    return "?";
  }
  std::vector<std::string>& log_;
  std::vector<std::pair<Module*, std::string>> names_;
};

// A DecoderLayer whose norms and projections have hooks runs the unfused
// chain (RMSNorm::forward_add and backward_add, Linear::backward_add fall
// back to forward/backward and ops::add); one without runs the fused ops.
// F32: the two are bit-identical. BF16: the forward and the norms' residual
// sums are too; the projections' input-gradient sums are rounded once
// instead of twice, so dx and the gradients behind it agree to BF16 accuracy.
TEST(Fusion, DecoderLayerFusedMatchesTheUnfusedChain) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    DecoderLayer fused(tiny_llama()), chained(tiny_llama());
    for (DecoderLayer* l : {&fused, &chained}) {
      allocate_parameters(*l, dtype);
      init_parameters(*l, 13);
    }
    ModuleHooks no_op;
    for (auto& [fqn, m] : chained.named_modules()) {
      if (!fqn.empty()) m->set_hooks(&no_op);
    }
    Tensor x = random_tensor({2, 8, 32}, 1, -1, 1, dtype);
    Tensor dy = random_tensor({2, 8, 32}, 2, -1, 1, dtype);
    GradSnapshot a = run_once(fused, x, dy);
    GradSnapshot b = run_once(chained, x, dy);
    if (dtype == DType::F32) {
      expect_same_run(a, b, fused);
      continue;
    }
    expect_bitwise_equal(a.out, b.out, "BF16 output");
    auto close = [](const Tensor& got, const Tensor& want, const std::string& what) {
      const auto g = got.to_floats(), w = want.to_floats();
      double err = 0, norm = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        err += (g[i] - w[i]) * static_cast<double>(g[i] - w[i]);
        norm += static_cast<double>(w[i]) * w[i];
      }
      EXPECT_LE(std::sqrt(err), 0x1p-7 * std::sqrt(norm) + 1e-30) << what;
    };
    close(a.dx, b.dx, "BF16 input gradient");
    auto named = fused.named_parameters();
    for (size_t i = 0; i < a.grads.size(); ++i) close(a.grads[i], b.grads[i], "BF16 " + named[i].first);
  }
}

TEST(Hooks, FireAroundForwardAndBackwardInOrder) {
  MLP mlp(tiny_llama());
  allocate_parameters(mlp, DType::F32);
  init_parameters(mlp, 1);
  std::vector<std::string> log;
  RecordingHooks hooks(log);
  for (auto& [fqn, m] : mlp.named_modules()) {
    hooks.name(*m, fqn.empty() ? "mlp" : fqn);
    m->set_hooks(&hooks);
  }
  Tensor x = random_tensor({1, 3, 32}, 1);
  Tensor dy = random_tensor({1, 3, 32}, 2);
  mlp.forward(x);
  mlp.backward(dy);
  const std::vector<std::string> forward = {"pre_forward mlp",        "pre_forward gate_proj", "post_forward gate_proj",
                                            "pre_forward up_proj",    "post_forward up_proj",  "pre_forward down_proj",
                                            "post_forward down_proj", "post_forward mlp"};
  const std::vector<std::string> backward = {
      "pre_backward mlp",        "pre_backward down_proj", "post_backward down_proj", "pre_backward gate_proj",
      "post_backward gate_proj", "pre_backward up_proj",   "post_backward up_proj",   "post_backward mlp"};
  std::vector<std::string> expected = forward;
  expected.insert(expected.end(), backward.begin(), backward.end());
  EXPECT_EQ(log, expected);

  // With recomputation the children's forward runs again inside the
  // module's backward (so their hooks, e.g. FSDP gathers, fire again) and the
  // module's own forward hooks do not.
  log.clear();
  fsdp::wrap_recompute(mlp);
  mlp.forward(x);
  mlp.backward(dy);
  expected = forward;
  expected.push_back("pre_backward mlp");
  expected.insert(expected.end(), forward.begin() + 1, forward.end() - 1);
  expected.insert(expected.end(), backward.begin() + 1, backward.end());
  EXPECT_EQ(log, expected);
}

TEST(Hooks, DecoderLayerChildrenOrder) {
  DecoderLayer layer(tiny_llama());
  allocate_parameters(layer, DType::F32);
  init_parameters(layer, 1);
  std::vector<std::string> log;
  RecordingHooks hooks(log);
  for (auto& [name, child] : layer.children()) {
    hooks.name(*child, name);
    child->set_hooks(&hooks);
  }
  layer.forward(random_tensor({1, 3, 32}, 1));
  layer.backward(random_tensor({1, 3, 32}, 2));
  const std::vector<std::string> expected = {"pre_forward input_layernorm",
                                             "post_forward input_layernorm",
                                             "pre_forward self_attn",
                                             "post_forward self_attn",
                                             "pre_forward post_attention_layernorm",
                                             "post_forward post_attention_layernorm",
                                             "pre_forward mlp",
                                             "post_forward mlp",
                                             "pre_backward mlp",
                                             "post_backward mlp",
                                             "pre_backward post_attention_layernorm",
                                             "post_backward post_attention_layernorm",
                                             "pre_backward self_attn",
                                             "post_backward self_attn",
                                             "pre_backward input_layernorm",
                                             "post_backward input_layernorm"};
  EXPECT_EQ(log, expected);
}

TEST(Accumulation, BackwardTwiceAddsGradients) {
  for (bool tied : {false, true}) {
    Llama model(tiny_llama(2, tied));
    allocate_parameters(model, DType::F32);
    init_parameters(model, 5);
    Tensor tokens = random_tokens({2, 8}, 64, 1);
    Tensor dlogits = random_tensor({2, 8, 64}, 2);
    GradSnapshot once = run_once(model, tokens, dlogits);
    model.forward(tokens);
    model.backward(dlogits);  // on top of the first: grads must double
    auto named = model.named_parameters();
    for (size_t i = 0; i < named.size(); ++i) {
      std::vector<float> g1 = once.grads[i].to_floats(), g2 = named[i].second->grad.to_floats();
      double diff = 0, ref = 0;
      for (size_t j = 0; j < g1.size(); ++j) {
        diff += std::pow(g2[j] - 2.0 * g1[j], 2);
        ref += std::pow(2.0 * g1[j], 2);
      }
      EXPECT_GT(ref, 0) << named[i].first;
      EXPECT_LT(std::sqrt(diff), 1e-6 * std::sqrt(ref)) << named[i].first;
    }
  }
}

TEST(Precision, Bf16ParametersGiveBf16Activations) {
  Llama model(tiny_llama());
  allocate_parameters(model, DType::BF16);
  init_parameters(model, 3);
  Tensor tokens = random_tokens({2, 8}, 64, 1);
  Tensor logits = model.forward(tokens);
  EXPECT_EQ(logits.dtype(), DType::BF16);
  EXPECT_EQ(logits.shape(), (Shape{2, 8, 64}));
  for (float x : logits.to_floats()) ASSERT_TRUE(std::isfinite(x));
  // The BF16 logits stay close to an F32 run from the same (rounded) weights.
  Llama ref(tiny_llama());
  allocate_parameters(ref, DType::F32);
  auto src = model.named_parameters(), dst = ref.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) ops::cast(src[i].second->value, dst[i].second->value);
  std::vector<float> a = logits.to_floats(), b = ref.forward(tokens).to_floats();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += std::pow(a[i] - b[i], 2);
    norm += std::pow(b[i], 2);
  }
  EXPECT_LT(std::sqrt(diff / norm), 0.05);
  model.backward(logits);
  for (auto& [fqn, p] : model.named_parameters()) EXPECT_EQ(p->grad.dtype(), DType::BF16) << fqn;
}

TEST(Saved, BackwardReleasesSavedState) {
  Linear lin(4, 3, Linear::Bias::Yes, Init::normal(0.1));
  allocate_parameters(lin, DType::F32);
  init_parameters(lin, 1);
  Tensor x = random_tensor({2, 4}, 1);
  Tensor dy = random_tensor({2, 3}, 2);
  lin.forward(x);
  lin.backward(dy);
  std::string msg = test::error_of([&] { lin.backward(dy); });
  EXPECT_NE(msg.find("Linear"), std::string::npos) << msg;
  lin.forward(x);
  lin.release_saved_recursive();
  msg = test::error_of([&] { lin.backward(dy); });
  EXPECT_NE(msg.find("without a saved forward"), std::string::npos) << msg;
}

TEST(HfConfig, WrittenConfigAgreesWithItsModelAndNamesEachDifference) {
  const ModelConfig m = tiny_llama(2);
  const std::string text = hf_llama_config_json(m, hf_torch_dtype(DType::BF16));
  EXPECT_NE(text.find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
  EXPECT_NE(text.find("\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]"), std::string::npos);
  EXPECT_TRUE(hf_config_differences(text, m, "config.json").empty());
  ModelConfig other = m;
  other.num_hidden_layers = 1;
  other.rope_theta = 500000.0;
  EXPECT_EQ(hf_config_differences(text, other, "config.json"),
            (std::vector<std::string>{"num_hidden_layers 2 (model.num_hidden_layers 1)",
                                      "rope_theta 10000.0 (model.rope_theta 500000.0)"}));
  // Hugging Face's defaults stand in for absent keys: kv heads = heads, untied, rope_theta 1e4.
  const std::string minimal = format(
      R"({{"vocab_size": {}, "hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {},
          "num_attention_heads": {}}})",
      m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers, m.num_attention_heads);
  // tiny_llama has 4 heads sharing 2 kv heads; the default (absent key) is one kv head per head.
  EXPECT_EQ(hf_config_differences(minimal, m, "c"),
            (std::vector<std::string>{"num_key_value_heads 4 (model.num_key_value_heads 2)"}));
  ModelConfig mha = m;
  mha.num_key_value_heads = m.num_attention_heads;
  EXPECT_TRUE(hf_config_differences(minimal, mha, "c").empty());
  EXPECT_EQ(test::error_of([&] { hf_config_differences("[]", m, "dir/config.json"); }),
            "dir/config.json is not a JSON object");
}

TEST(HfConfig, TorchDtypeIsReplacedAndEverythingElseKept) {
  const std::string foreign = R"({"zeta": 1, "torch_dtype": "bfloat16", "alpha": [2, 3]})";
  EXPECT_EQ(hf_config_with_torch_dtype(foreign, hf_torch_dtype(DType::F32), "c"),
            "{\n  \"zeta\": 1,\n  \"torch_dtype\": \"float32\",\n  \"alpha\": [\n    2,\n    3\n  ]\n}\n");
  EXPECT_EQ(hf_config_with_torch_dtype(R"({"a": 1})", "bfloat16", "c"), "{\n  \"a\": 1\n}\n");
}

}  // namespace
}  // namespace st::models
