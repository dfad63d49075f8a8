// Fuzzes the tokens reader (dataset/dataset.h, data.kind tokens): llm.c shard
// headers (magic, version, token count) and headerless token files. The
// input is one file, read as data.token_dtype uint16 and uint32; whatever opens
// must serve its first and last samples and its vocabulary scan.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dataset/dataset.h"
#include "fuzz/fuzz_util.h"
#include "launch/config.h"

namespace {

using namespace st;

constexpr int64_t kSeqLen = 8;

// A tiny byte-level LLaMA reading `path`; only data.* and the sizes matter here.
Config tokens_config(const std::string& path, std::string_view token_dtype) {
  const std::string yaml = R"(
model: {name: llama, vocab_size: 256, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 8}
train: {steps: 1, global_batch_size: 1, micro_batch_size: 1, seq_len: 8, device: cpu}
data: {kind: tokens}
)";
  const std::string overrides[] = {"data.path=" + path, "data.token_dtype=" + std::string(token_dtype)};
  return load_config_from_string(yaml, "fuzz_token_shard.yaml", overrides);
}

void read_all(const Config& config) {
  const std::unique_ptr<dataset::Dataset> ds = dataset::make_dataset(dataset_spec(config));
  (void)ds->describe();
  (void)ds->find_bad_token(0, 1);
  (void)ds->find_bad_token(1, 3);
  fuzz::require(ds->size() >= 0, "a negative sample count");
  if (ds->size() == 0) return;
  const Tensor in = Tensor::empty({kSeqLen}, DType::I32);
  const Tensor target = Tensor::empty({kSeqLen}, DType::I32);
  ds->get(0, in, target);
  ds->get(ds->size() - 1, in, target);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path path = fuzz::scratch_dir() / "shard.bin";
  // The configs are ours and must load; loaded once (a load costs more than a read).
  static const Config configs[] = {tokens_config(path.string(), "uint16"), tokens_config(path.string(), "uint32")};
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  for (const Config& config : configs) fuzz::expect_only_st_errors([&] { read_all(config); });
  return 0;
}
