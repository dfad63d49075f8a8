// Fuzzes the configuration loader (launch/config.h, core/config.h): YAML
// through load_config_from_string and `--set key=value` through
// apply_override. Input: the YAML text; after a 0 byte, one override per
// line. What loads must load again from its own to_yaml() to an equal Config.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "launch/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace st;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view yaml = input.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string_view::npos) {
    std::string_view rest = input.substr(split + 1);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }

  fuzz::expect_only_st_errors([&] {
    Config plain;
    for (const std::string& o : overrides) apply_override(plain, o);
  });
  fuzz::expect_only_st_errors([&] {
    const Config config = load_config_from_string(yaml, "fuzz.yaml", overrides);
    const std::string text = to_yaml(config);
    const Config again = load_config_from_string(text, "fuzz.yaml (rewritten)");
    fuzz::require(again == config, "a loaded config does not load back from its own to_yaml()");
  });
  return 0;
}
