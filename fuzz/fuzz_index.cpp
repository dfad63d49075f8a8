// Fuzzes the checkpoint index readers (checkpoint/index.h: read_catalog):
// model/master_weights/optimizer.safetensors.index.json and
// sharded.index.json. Input: one selector byte (its value mod 4 picks the
// index file: 0 model, 1 master_weights, 2 optimizer, 3 sharded), then the
// index's JSON text. The directory also holds small, valid safetensors files
// with the names and keys a real checkpoint of a two-tensor model would use,
// so an index that names them gets past the file checks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/index.h"
#include "checkpoint/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace fs = std::filesystem;
using namespace st;

// model-*, optimizer-* and shard-* files for tensors "w" (F32 [2, 3]) and "b" (F32 [3]).
void write_shards(const fs::path& dir) {
  const Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Tensor::from_vector(std::vector<float>{7, 8, 9}, {3});
  const Tensor flat_w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
  checkpoint::SafetensorsWriter model, master, optimizer, shard;
  model.add("w", w);
  model.add("b", b);
  model.set_metadata("format", "pt");
  master.add("w", w);
  master.add("b", b);
  optimizer.add("w.exp_avg", w);
  optimizer.add("b.exp_avg", b);
  shard.add("w|master|0", flat_w);
  shard.add("b|master|0", b);
  model.write((dir / "model-00001-of-00001.safetensors").string());
  master.write((dir / "master_weights-00001-of-00001.safetensors").string());
  optimizer.write((dir / "optimizer-00001-of-00001.safetensors").string());
  shard.write((dir / "shard-00000-of-00001.safetensors").string());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string_view names[] = {checkpoint::kModelIndexName, checkpoint::kMasterIndexName,
                                           checkpoint::kOptimizerIndexName, checkpoint::kShardedIndexName};
  const fs::path dir = fuzz::scratch_dir() / "ckpt";
  static const bool shards_written = (fuzz::reset_dir(dir), write_shards(dir), true);
  (void)shards_written;
  for (std::string_view name : names) fs::remove(dir / name);

  const std::string_view json(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::write_file(dir / names[data[0] % 4], json);
  fuzz::expect_only_st_errors([&] {
    const checkpoint::Catalog cat = checkpoint::read_catalog(dir.string());
    (void)cat.total_bytes();
    for (const auto& [key, tensor] : cat.tensors)
      for (const checkpoint::ChunkRecord& c : tensor.chunks)
        fuzz::require(!c.file.empty() && c.file.find('/') == std::string::npos && c.file != "..",
                      "the catalog names a file outside the checkpoint directory");
  });
  return 0;
}
