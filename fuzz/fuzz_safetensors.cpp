// Fuzzes the safetensors reader (checkpoint/safetensors.h): the input is a
// whole file. Every header the reader accepts must describe tensors that lie
// inside the file, so reading each of them back must succeed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/safetensors.h"
#include "core/text.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace st;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)find_invalid_utf8(bytes);

  const std::filesystem::path path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_file(path, bytes);
  fuzz::expect_only_st_errors([&] {
    const checkpoint::SafetensorsFile file(path.string());
    for (const std::string& name : file.names()) {
      const checkpoint::TensorInfo& info = file.info(name);
      fuzz::require(info.data_begin + info.nbytes <= file.file_size(), "a tensor ends past the end of the file");
      const Tensor t = file.read_tensor(name);
      fuzz::require(static_cast<uint64_t>(t.nbytes()) == info.nbytes, "read_tensor's bytes differ from the header's");
    }
  });
  return 0;
}
