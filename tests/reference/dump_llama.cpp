// torch_ref_dump OUT_DIR [SEED]
//
// Writes what check_llama.py needs to replay a tiny LLaMA in PyTorch: for
// two cases (untied and tied embeddings), the initial parameters (Hugging
// Face names), tokens and targets, logits, the mean cross-entropy, every
// parameter gradient, then the losses of 5 AdamW steps (torch semantics,
// written out here in plain loops so this check depends on models/ only)
// and the final parameters. Tensors are raw little-endian .bin files (F32,
// tokens I32); OUT_DIR/manifest.json lists them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ops.h"
#include "models/llama.h"

namespace {

using nlohmann::json;
using st::DType;
using st::Tensor;
namespace fs = std::filesystem;
namespace models = st::models;

constexpr int64_t kBatch = 2;
constexpr int64_t kSeq = 8;
constexpr int64_t kIgnore = -100;
constexpr int kSteps = 5;

struct AdamW {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

st::ModelConfig tiny_config(bool tied) {
  st::ModelConfig c;
  c.name = "llama";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.init_std = 0.02;
  return c;
}

json config_json(const st::ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"tie_word_embeddings", c.tie_word_embeddings}};
}

void write_bin(const fs::path& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  ST_CHECK(f.good(), "cannot write {}", path.string());
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  ST_CHECK(f.good(), "short write to {}", path.string());
}

// Writes `t` (F32 or I32, CPU) as OUT/<rel> and returns its manifest entry.
json dump(const fs::path& dir, const std::string& rel, const Tensor& t) {
  ST_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::I32, "dump {}: F32/I32 only, got {}", rel, t.dtype());
  fs::create_directories((dir / rel).parent_path());
  write_bin(dir / rel, t.raw_data(), t.nbytes());
  return {{"file", rel}, {"shape", t.shape()}, {"dtype", t.dtype() == DType::F32 ? "F32" : "I32"}};
}

// Mean cross-entropy over the counted targets; dlogits receives its gradient.
double mean_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& dlogits) {
  int64_t count = 0;
  for (int32_t t : targets.span<int32_t>()) count += t != kIgnore;
  const int64_t v = logits.size(-1);
  st::ops::LossSum ls = st::ops::cross_entropy(logits.view({-1, v}), targets.view({-1}), kIgnore,
                                               1.0f / static_cast<float>(count), dlogits.view({-1, v}));
  return ls.sum / static_cast<double>(ls.count);
}

// torch.optim.AdamW (amsgrad off), element by element in F32 as torch does.
void adamw_step(models::Module& model, std::vector<std::vector<float>>& m, std::vector<std::vector<float>>& v, int step,
                const AdamW& h) {
  const auto bc1 = static_cast<float>(1.0 - std::pow(h.beta1, step));
  const auto bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, step)));
  const auto lr = static_cast<float>(h.lr);
  const auto b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2), eps = static_cast<float>(h.eps);
  const float step_size = lr / bc1;
  auto named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    models::Parameter& p = *named[i].second;
    float* w = p.value.data<float>();
    const float* g = p.grad.data<float>();
    const float decay = p.weight_decay ? 1.0f - lr * static_cast<float>(h.weight_decay) : 1.0f;
    for (int64_t j = 0; j < p.value.numel(); ++j) {
      w[j] *= decay;
      float& mj = m[i][static_cast<size_t>(j)];
      float& vj = v[i][static_cast<size_t>(j)];
      mj = mj * b1 + g[j] * (1.0f - b1);
      vj = vj * b2 + g[j] * g[j] * (1.0f - b2);
      const float denom = std::sqrt(vj) / bc2_sqrt + eps;
      w[j] += -step_size * (mj / denom);
    }
  }
}

json run_case(const fs::path& dir, const std::string& name, bool tied, uint64_t seed) {
  const st::ModelConfig config = tiny_config(tied);
  models::Llama model(config);
  models::allocate_parameters(model, DType::F32);
  models::init_parameters(model, seed);

  // Deterministic tokens; targets are the next token, with one ignored position.
  std::vector<int32_t> tok(kBatch * kSeq), tgt(kBatch * kSeq);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : tok) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(config.vocab_size));
  }
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t < kSeq; ++t) {
      const int64_t i = b * kSeq + t;
      tgt[static_cast<size_t>(i)] = t + 1 < kSeq ? tok[static_cast<size_t>(i + 1)] : tok[static_cast<size_t>(b * kSeq)];
    }
  }
  tgt[3] = static_cast<int32_t>(kIgnore);
  Tensor tokens = Tensor::from_vector(tok, {kBatch, kSeq});
  Tensor targets = Tensor::from_vector(tgt, {kBatch, kSeq});

  json c;
  c["name"] = name;
  c["config"] = config_json(config);
  c["ignore_index"] = kIgnore;
  c["tokens"] = dump(dir, name + "/tokens.bin", tokens);
  c["targets"] = dump(dir, name + "/targets.bin", targets);
  json params = json::array();
  for (auto& [fqn, p] : model.named_parameters()) {
    json e = dump(dir, name + "/params/" + fqn + ".bin", p->value);
    e["name"] = fqn;
    e["weight_decay"] = p->weight_decay;
    params.push_back(e);
  }

  // Forward, loss, backward from the initial weights.
  Tensor logits = model.forward(tokens);  // (B,T,V)
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const double loss = mean_cross_entropy(logits, targets, dlogits);
  model.backward(dlogits);
  c["logits"] = dump(dir, name + "/logits.bin", logits);
  c["loss"] = loss;
  size_t k = 0;
  for (auto& [fqn, p] : model.named_parameters()) {
    params[k++]["grad"] = dump(dir, name + "/grads/" + fqn + ".bin", p->grad)["file"];
  }

  // AdamW: the loss before each step, then the weights after the last.
  const AdamW h;
  std::vector<std::vector<float>> m, v;
  for (auto& entry : model.named_parameters()) {
    m.emplace_back(static_cast<size_t>(entry.second->value.numel()), 0.0f);
    v.emplace_back(static_cast<size_t>(entry.second->value.numel()), 0.0f);
  }
  json losses = json::array();
  for (int step = 1; step <= kSteps; ++step) {
    for (auto& entry : model.named_parameters()) entry.second->grad.zero_();
    Tensor out = model.forward(tokens);
    losses.push_back(mean_cross_entropy(out, targets, out));  // dlogits overwrite the logits
    model.backward(out);
    adamw_step(model, m, v, step, h);
  }
  k = 0;
  for (auto& [fqn, p] : model.named_parameters()) {
    params[k++]["final"] = dump(dir, name + "/final/" + fqn + ".bin", p->value)["file"];
  }
  c["params"] = params;
  c["adamw"] = {{"lr", h.lr},      {"betas", {h.beta1, h.beta2}},
                {"eps", h.eps},    {"weight_decay", h.weight_decay},
                {"steps", kSteps}, {"losses", losses}};
  std::cout << name << ": loss " << loss << ", AdamW losses " << losses.dump() << "\n";
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ST_CHECK(argc == 2 || argc == 3, "usage: {} OUT_DIR [SEED]", argc > 0 ? argv[0] : "torch_ref_dump");
    const fs::path dir = argv[1];
    const uint64_t seed = argc == 3 ? std::stoull(argv[2]) : 1234;
    fs::create_directories(dir);
    json manifest;
    manifest["seed"] = seed;
    manifest["batch"] = kBatch;
    manifest["seq_len"] = kSeq;
    manifest["cases"] = {run_case(dir, "untied", false, seed), run_case(dir, "tied", true, seed)};
    std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "torch_ref_dump: error: " << e.what() << "\n";
    return 1;
  }
}
