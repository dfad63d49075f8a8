// The model table's FLOP counts (models/model.h): parameter counts against
// the models as built, FLOPs per token against a hand count; metrics/flops.h:
// the GPU peak table and MFU; and (when CTest's
// flops_peer_python sets ST_FLOPS_PEER_JSON) the PyTorch peer's counts of
// the same config, which must agree exactly.
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "launch/config.h"
#include "metrics/flops.h"
#include "models/layers.h"
#include "models/model.h"
#include "test_util.h"

namespace st::metrics {
namespace {

using models::model_flops;
using models::ModelFlops;

struct Counted {
  int64_t params = 0;
  int64_t matmul_params = 0;
};

// The independent count: build the model through the registry and sum what
// it really holds. named_parameters() lists a tied matrix once (under its
// owner, the embedding); the matmul weights are the weights of every Linear
// module, where a tied lm_head's weight is the embedding's matrix.
Counted count_built(const ModelConfig& config) {
  auto model = models::build_model(config);
  Counted c;
  for (auto& [fqn, p] : model->named_parameters()) c.params += shape_numel(p->shape);
  for (auto& [fqn, m] : model->named_modules()) {
    if (m->type_name() != "Linear") continue;
    c.matmul_params += shape_numel(static_cast<models::Linear*>(m)->weight().shape);
  }
  return c;
}

TEST(Flops, LlamaTinyMatchesBuiltModel) {
  const Config config = load_config("configs/llama-tiny.yaml");
  const ModelFlops f = model_flops(config.model, config.train.seq_len);
  const Counted built = count_built(config.model);
  EXPECT_EQ(f.params, built.params);
  EXPECT_EQ(f.matmul_params, built.matmul_params);
  EXPECT_EQ(f.params, 123712);  // the derivation in configs/llama-tiny.yaml's header
  // Untied: everything but the embedding table (256 x 64) and the norms
  // (2 layers x 2 x 64 + 64) multiplies: 123,712 - 16,384 - 320 = 107,008.
  EXPECT_EQ(f.matmul_params, 107008);
}

TEST(Flops, LlamaYamlMatchesBuiltModelAndHeader) {
  const Config config = load_config("configs/llama.yaml");
  const ModelFlops f = model_flops(config.model, config.train.seq_len);
  const Counted built = count_built(config.model);
  EXPECT_EQ(f.params, built.params);
  EXPECT_EQ(f.matmul_params, built.matmul_params);
  EXPECT_EQ(f.params, 1104218112);  // the hand derivation in configs/llama.yaml's header
  // Minus the input table (32,000 x 2,048) and the norms (16 x 4,096 + 2,048).
  EXPECT_EQ(f.matmul_params, 1104218112 - 65536000 - 67584);
  // 6 N + 12 L T D with T = 2048, D = H * head_dim = 2048.
  EXPECT_DOUBLE_EQ(f.flops_per_token, 6.0 * 1038614528 + 12.0 * 16 * 2048 * 2048);
}

ModelConfig small_llama() {
  ModelConfig c;
  c.name = "llama";
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;  // head_dim 4
  c.num_key_value_heads = 1;  // kv width 4
  c.max_position_embeddings = 16;
  return c;
}

TEST(Flops, SmallLlamaByHand) {
  // V = 10, D = 8, F = 12, L = 2, H = 2, KV = 1, head_dim = 4, T = 4, untied.
  //   per layer: q, o 2 x 8 x 8 = 128; k, v 2 x 8 x 4 = 64; gate, up, down 3 x 8 x 12 = 288
  //              matmul 480, norms 2 x 8 = 16
  //   matmul_params = 2 x 480 + lm_head 10 x 8 = 1,040
  //   params        = 2 x (480 + 16) + final norm 8 + embed 80 + lm_head 80 = 1,160
  //   flops/token   = 6 x 1,040 + 12 x L 2 x T 4 x (H x head_dim) 8 = 6,240 + 768 = 7,008
  ModelConfig c = small_llama();
  ModelFlops f = model_flops(c, 4);
  EXPECT_EQ(f.matmul_params, 1040);
  EXPECT_EQ(f.params, 1160);
  EXPECT_DOUBLE_EQ(f.flops_per_token, 7008.0);
  EXPECT_EQ(f.params, count_built(c).params);
  EXPECT_EQ(f.matmul_params, count_built(c).matmul_params);

  // Tied: lm_head's matrix is the embedding's, counted once in params, and it
  // still multiplies once per token (as lm_head): params 1,160 - 80 = 1,080.
  c.tie_word_embeddings = true;
  f = model_flops(c, 4);
  EXPECT_EQ(f.params, 1080);
  EXPECT_EQ(f.matmul_params, 1040);
  EXPECT_DOUBLE_EQ(f.flops_per_token, 7008.0);
  EXPECT_EQ(f.params, count_built(c).params);
  EXPECT_EQ(f.matmul_params, count_built(c).matmul_params);

  // The attention term grows with T, the rest does not: T = 16 adds 12 x 2 x 12 x 8.
  EXPECT_DOUBLE_EQ(model_flops(c, 16).flops_per_token, 7008.0 + 12.0 * 2 * 12 * 8);
}

TEST(Flops, Toy) {
  // Linear(16,16) and Linear(16,8) with biases: 256 + 128 weights multiply,
  // 16 + 8 biases do not; one sample is one "token" and there is no attention.
  ModelConfig c;
  c.name = "toy";
  const ModelFlops f = model_flops(c, 1);
  EXPECT_EQ(f.matmul_params, 384);
  EXPECT_EQ(f.params, 408);
  EXPECT_DOUBLE_EQ(f.flops_per_token, 6.0 * 384);
  EXPECT_EQ(f.params, count_built(c).params);
  EXPECT_EQ(f.matmul_params, count_built(c).matmul_params);
}

TEST(Flops, Errors) {
  ModelConfig c = small_llama();
  c.name = "gpt";
  EXPECT_NE(test::error_of([&] { model_flops(c, 4); }).find("model.name"), std::string::npos);
  c = small_llama();
  c.num_attention_heads = 3;
  EXPECT_NE(test::error_of([&] { model_flops(c, 4); }).find("model.num_attention_heads"), std::string::npos);
  EXPECT_NE(test::error_of([&] { model_flops(small_llama(), 0); }).find("train.seq_len"), std::string::npos);
}

TEST(Flops, PeakTable) {
  EXPECT_EQ(peak_flops("NVIDIA H100 80GB HBM3", DType::BF16), 989e12);
  EXPECT_EQ(peak_flops("NVIDIA H100 80GB HBM3", DType::F32), 67e12);
  EXPECT_EQ(peak_flops("NVIDIA H100 PCIe", DType::BF16), 756e12);
  EXPECT_EQ(peak_flops("NVIDIA H100 NVL", DType::BF16), 835e12);
  EXPECT_EQ(peak_flops("NVIDIA H200", DType::BF16), 989e12);
  EXPECT_EQ(peak_flops("NVIDIA H200 NVL", DType::BF16), 835e12);
  EXPECT_EQ(peak_flops("NVIDIA A100-SXM4-80GB", DType::BF16), 312e12);
  EXPECT_EQ(peak_flops("NVIDIA L40S", DType::BF16), 362e12);
  EXPECT_EQ(peak_flops("NVIDIA GeForce RTX 4090", DType::BF16), 165e12);
  EXPECT_EQ(peak_flops("Tesla T4", DType::BF16), 0.0);
  EXPECT_EQ(peak_flops("", DType::BF16), 0.0);
  EXPECT_EQ(peak_flops("NVIDIA H100 80GB HBM3", DType::I32), 0.0);
}

TEST(Flops, Mfu) {
  // 10,000 tok/s x 7.2e9 FLOP/token = 7.2e13 FLOP/s of a 989e12 peak.
  EXPECT_DOUBLE_EQ(mfu(10000, 7.2e9, 989e12), 7.2e13 / 989e12);
  EXPECT_EQ(mfu(10000, 7.2e9, 0), 0.0);
}

// --- the PyTorch peer's counts ---------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value of a top-level "key": number or "key": "string" of the peer's one
// JSON object (flat, written by bench/torch_fsdp2.py --count-only).
std::string json_field(const std::string& json, const std::string& key) {
  std::smatch m;
  const std::regex re("\"" + key + "\":\\s*(\"([^\"]*)\"|[-+0-9.eE]+)");
  if (!std::regex_search(json, m, re)) {
    ADD_FAILURE() << "no \"" << key << "\" in the peer's JSON: " << json;
    return "0";
  }
  return m[2].matched ? m[2].str() : m[1].str();
}

TEST(FlopsPeer, TorchCountsAgree) {
  const char* path = std::getenv("ST_FLOPS_PEER_JSON");
  if (path == nullptr || *path == '\0')
    GTEST_SKIP() << "ST_FLOPS_PEER_JSON is unset (CTest's flops_peer_python sets it)";
  const std::string json = read_file(path);
  const Config config = load_config(json_field(json, "config"));
  const int64_t seq_len = std::stoll(json_field(json, "seq_len"));
  EXPECT_EQ(seq_len, config.train.seq_len);
  const ModelFlops f = model_flops(config.model, seq_len);
  EXPECT_EQ(std::stoll(json_field(json, "params")), f.params);
  EXPECT_EQ(std::stoll(json_field(json, "matmul_params")), f.matmul_params);
  EXPECT_DOUBLE_EQ(std::stod(json_field(json, "flops_per_token")), f.flops_per_token);

  // The peer's peak table, entry by entry: each key looked up here as a
  // device name must give the same two rates.
  std::map<std::string, std::pair<double, double>> peaks;
  const std::regex entry("\"([^\"]+)\":\\s*\\[([-+0-9.eE]+),\\s*([-+0-9.eE]+)\\]");
  for (std::sregex_iterator it(json.begin(), json.end(), entry), end; it != end; ++it)
    peaks[(*it)[1].str()] = {std::stod((*it)[2].str()), std::stod((*it)[3].str())};
  EXPECT_GE(peaks.size(), 9u) << json;
  for (const auto& [name, rates] : peaks) {
    EXPECT_EQ(peak_flops(name, DType::BF16), rates.first) << name;
    EXPECT_EQ(peak_flops(name, DType::F32), rates.second) << name;
  }
}

}  // namespace
}  // namespace st::metrics
