// Fuzzes the readers of a checkpoint root's commit files
// (checkpoint/commit.h, index.h): `latest` and the COMPLETE marker, through
// read_complete_marker, incomplete_reason, complete_steps, choose_resume
// and resolve_checkpoint_dir.
//
// Input: `latest`'s text, a 0 byte, then the COMPLETE marker of
// root/step-000010 (which also holds a 5-byte file "model.safetensors").
// When the marker's last line is "crc32c fix", the target replaces it with
// the right checksum, so mutations reach the parser behind the crc check.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "checkpoint/checksum.h"
#include "checkpoint/commit.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace fs = std::filesystem;
using namespace st;

std::string with_crc_fixed(std::string marker) {
  constexpr std::string_view fix = "crc32c fix";
  const size_t at = marker.rfind(fix);
  if (at == std::string::npos || (at > 0 && marker[at - 1] != '\n')) return marker;
  marker.resize(at);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", checkpoint::crc32c(std::as_bytes(std::span(marker.data(), marker.size()))));
  return marker + "crc32c " + hex + "\n";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view latest = input.substr(0, split);
  const std::string marker =
      with_crc_fixed(std::string(split == std::string_view::npos ? std::string_view() : input.substr(split + 1)));

  const fs::path root = fuzz::scratch_dir() / "root";
  const fs::path step = root / "step-000010";
  fuzz::reset_dir(step);
  fuzz::write_file(step / "model.safetensors", "12345");
  fuzz::write_file(root / checkpoint::kLatestFileName, latest);
  fuzz::write_file(step / checkpoint::kCompleteMarkerName, marker);

  fuzz::expect_only_st_errors([&] {
    const checkpoint::CompleteMarker m = checkpoint::read_complete_marker(step);
    if (m.problem.empty()) fuzz::require(m.step >= 0, "a marker with a negative step was accepted");
    (void)checkpoint::incomplete_reason(step, 10);
    (void)checkpoint::complete_steps(root);
    if (auto choice = checkpoint::choose_resume(root))
      fuzz::require(choice->step == 10, "choose_resume picked a step that does not exist");
    (void)checkpoint::resolve_checkpoint_dir(root.string());
  });
  return 0;
}
