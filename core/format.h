#pragma once
// Minimal "{}" formatting (libstdc++ 12 has no std::format). Each "{}" is
// replaced by the next argument written with operator<<; "{{" and "}}" are
// literal braces. Extra arguments are appended, missing ones leave "{}".
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace st {
namespace detail {

inline void format_rest(std::ostringstream& os, std::string_view fmt) {
  for (size_t i = 0; i < fmt.size(); ++i) {
    if ((fmt[i] == '{' || fmt[i] == '}') && i + 1 < fmt.size() && fmt[i + 1] == fmt[i]) ++i;
    os << fmt[i];
  }
}

template <class T, class... Rest>
void format_rest(std::ostringstream& os, std::string_view fmt, T&& value, Rest&&... rest) {
  for (size_t i = 0; i < fmt.size(); ++i) {
    if ((fmt[i] == '{' || fmt[i] == '}') && i + 1 < fmt.size() && fmt[i + 1] == fmt[i]) {
      os << fmt[i++];
    } else if (fmt[i] == '{' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      os << std::forward<T>(value);
      format_rest(os, fmt.substr(i + 2), std::forward<Rest>(rest)...);
      return;
    } else {
      os << fmt[i];
    }
  }
  os << ' ' << std::forward<T>(value);
  ((os << ' ' << std::forward<Rest>(rest)), ...);
}

}  // namespace detail

/// Formats `fmt`, replacing each "{}" with the next argument.
template <class... Args>
std::string format(std::string_view fmt, Args&&... args) {
  std::ostringstream os;
  detail::format_rest(os, fmt, std::forward<Args>(args)...);
  return os.str();
}

}  // namespace st
