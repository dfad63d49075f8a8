// Parameter counts, training FLOPs per token, the GPU peak table and MFU.
#include "launch/flops.h"

#include <array>
#include <string_view>

#include "core/error.h"
#include "models/layers.h"
#include "models/toy.h"

namespace st::launch {

namespace {

ModelFlops llama_flops(const ModelConfig& c, int64_t seq_len) {
  // The same checks the model's constructor makes, so a config that cannot be
  // built cannot be counted either (and head_dim below never divides by zero).
  models::check_llama_dims(c);
  const int64_t d = c.hidden_size;
  const int64_t head_dim = d / c.num_attention_heads;
  const int64_t kv_width = head_dim * c.num_key_value_heads;   // k_proj / v_proj output width
  const int64_t layer_matmul = 2 * d * d                       // q_proj, o_proj
                               + 2 * d * kv_width              // k_proj, v_proj
                               + 3 * d * c.intermediate_size;  // gate_proj, up_proj, down_proj
  const int64_t layer_norms = 2 * d;                           // input_layernorm, post_attention_layernorm
  const int64_t table = c.vocab_size * d;                      // embed_tokens; lm_head has the same shape

  ModelFlops f;
  f.matmul_params = c.num_hidden_layers * layer_matmul + table;      // + lm_head, tied or not
  f.params = c.num_hidden_layers * (layer_matmul + layer_norms) + d  // + final norm
             + table                                                 // embed_tokens
             + (c.tie_word_embeddings ? 0 : table);                  // lm_head's own matrix
  const auto attention = 12.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(seq_len) *
                         static_cast<double>(head_dim * c.num_attention_heads);
  f.flops_per_token = 6.0 * static_cast<double>(f.matmul_params) + attention;
  return f;
}

ModelFlops toy_flops() {
  using models::Toy;
  ModelFlops f;
  f.matmul_params = Toy::kIn * Toy::kHidden + Toy::kHidden * Toy::kOut;
  f.params = f.matmul_params + Toy::kHidden + Toy::kOut;  // + the two biases
  f.flops_per_token = 6.0 * static_cast<double>(f.matmul_params);
  return f;
}

// Dense tensor-core BF16 (FP32 accumulate) and plain FP32 peaks of one GPU,
// in FLOP/s, from NVIDIA's datasheets: "NVIDIA H100 Tensor Core GPU" (SXM,
// PCIe, NVL columns; BF16 there is quoted with 2:4 sparsity, halved here),
// "NVIDIA H200 Tensor Core GPU" (SXM, NVL), "NVIDIA A100 Tensor Core GPU",
// "NVIDIA L40S", and the "NVIDIA Ada GPU Architecture" whitepaper for the
// GeForce RTX 4090 (BF16 with FP32 accumulate, not the FP16-accumulate rate).
// Boost clocks; a card held at lower clocks by its power limit reaches less.
struct PeakEntry {
  std::string_view key;  // substring of cudaDeviceProp::name
  double bf16;
  double f32;
};
// First match wins, so a more specific key comes before the keys it contains
// ("H100 NVL" before "H100", "H200 NVL" before "H200"). GH200 matches "H200":
// its GPU has the H100 SXM rates.
constexpr std::array<PeakEntry, 10> kPeaks{{
    {"H100 NVL", 835e12, 60e12},
    {"H100 PCIe", 756e12, 51e12},
    {"H100 80GB HBM3", 989e12, 67e12},  // the SXM5 board's device name
    {"H100 SXM", 989e12, 67e12},
    {"H200 NVL", 835e12, 60e12},
    {"H200", 989e12, 67e12},
    {"A100", 312e12, 19.5e12},  // SXM4 and PCIe, 40 and 80 GB: the same rates
    {"L40S", 362e12, 91.6e12},
    {"RTX 4090", 165e12, 82.6e12},
    // Any other H100 name: the SXM rates, the usual board in training clusters.
    {"H100", 989e12, 67e12},
}};

}  // namespace

ModelFlops model_flops(const ModelConfig& config, int64_t seq_len) {
  ST_CHECK(seq_len > 0, "train.seq_len must be positive to count FLOPs, got {}", seq_len);
  if (config.name == "llama") return llama_flops(config, seq_len);
  if (config.name == "toy") return toy_flops();
  ST_FAIL("model.name: unknown model '{}'; known models: llama, toy", config.name);
}

double peak_flops(const std::string& device_name, DType dtype) {
  for (const PeakEntry& e : kPeaks) {
    if (device_name.find(e.key) == std::string::npos) continue;
    switch (dtype) {
      case DType::BF16: return e.bf16;
      case DType::F32: return e.f32;
      case DType::I32: return 0;
    }
  }
  return 0;
}

double mfu(double tokens_per_s, double flops_per_token, double peak) {
  if (peak <= 0) return 0;
  return tokens_per_s * flops_per_token / peak;
}

}  // namespace st::launch
