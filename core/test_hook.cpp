#include "core/test_hook.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

namespace st {

void test_pause_point(std::string_view point, int64_t step) {
  const char* raw = std::getenv("ST_TEST_PAUSE_AT");
  if (raw == nullptr) return;
  const std::string_view want(raw);
  const size_t at = want.find('@');
  if (want.substr(0, at) != point) return;
  if (at != std::string_view::npos && want.substr(at + 1) != std::to_string(step)) return;
  std::fprintf(stderr, "test hook: paused at %.*s of step %lld (pid %d)\n", static_cast<int>(point.size()),
               point.data(), static_cast<long long>(step), static_cast<int>(::getpid()));
  std::fflush(stderr);
  // Not SIGSTOP: mpirun continues a stopped rank. Waiting in pause() ends only
  // with a signal that kills; handled ones (SIGTERM asks for a save) return here.
  for (;;) ::pause();
}

}  // namespace st
