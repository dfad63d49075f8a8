// Fuzzes trainer_state.json's reader (checkpoint/state.h): the input is the
// file's text. What it accepts must survive its own writer: text -> state ->
// text -> state gives the same text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/state.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace st;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_st_errors([&] {
    const checkpoint::TrainerState state = checkpoint::parse_trainer_state(text, "trainer_state.json");
    fuzz::require(state.step >= 0 && state.consumed_samples >= 0 && state.optimizer_steps >= 0,
                  "a negative count was accepted");
    const std::string written = checkpoint::trainer_state_text(state);
    const checkpoint::TrainerState again = checkpoint::parse_trainer_state(written, "trainer_state.json (rewritten)");
    fuzz::require(checkpoint::trainer_state_text(again) == written, "trainer_state.json does not round-trip");
  });
  return 0;
}
