#include "core/error.h"

namespace st {

namespace {
std::string basename_of(const char* path) {
  std::string p(path);
  // Keep "folder/file.cpp" so the location is unambiguous but short.
  auto last = p.rfind('/');
  if (last == std::string::npos || last == 0) return p;
  auto prev = p.rfind('/', last - 1);
  return prev == std::string::npos ? p : p.substr(prev + 1);
}
}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(message + " (" + basename_of(file) + ":" + std::to_string(line) + ")"),
      message_(message),
      location_(basename_of(file) + ":" + std::to_string(line)) {}

namespace detail {
void throw_error(const char* file, int line, const std::string& message) { throw Error(message, file, line); }
}  // namespace detail

}  // namespace st
