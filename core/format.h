#pragma once
// Minimal std::format stand-in (libstdc++ 12 has no <format>). Each "{}" is
// replaced by the next argument written with operator<<. A spec after ':'
// may give alignment '<' or '>', a width and ".N" precision with 'f' or 'e'
// ("{:<20}", "{:>8.3f}", "{:.2e}"). "{{" and "}}" are literal braces.
// Arguments left over are appended; placeholders left over stay as "{}".
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace st {
namespace detail {

struct FormatSpec {
  char align = 0;  // '<', '>' or 0 (stream default: right)
  int width = 0;
  int precision = -1;  // -1: stream default
  char type = 0;       // 'f', 'e' or 0
};

inline FormatSpec parse_format_spec(std::string_view s) {
  FormatSpec spec;
  size_t i = 0;
  if (i < s.size() && (s[i] == '<' || s[i] == '>')) spec.align = s[i++];
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') spec.width = spec.width * 10 + (s[i++] - '0');
  if (i < s.size() && s[i] == '.') {
    spec.precision = 0;
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') spec.precision = spec.precision * 10 + (s[i++] - '0');
  }
  if (i < s.size() && (s[i] == 'f' || s[i] == 'e')) spec.type = s[i];
  return spec;
}

template <class T>
void write_formatted(std::ostringstream& os, const FormatSpec& spec, T&& value) {
  std::ostringstream item;
  if (spec.type == 'f') item << std::fixed;
  if (spec.type == 'e') item << std::scientific;
  if (spec.precision >= 0) item << std::setprecision(spec.precision);
  item << std::forward<T>(value);
  std::string text = item.str();
  if (static_cast<int>(text.size()) < spec.width) {
    std::string pad(static_cast<size_t>(spec.width) - text.size(), ' ');
    text = spec.align == '<' ? text + pad : pad + text;
  }
  os << text;
}

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
    } else if (fmt[i] == '{' && i + 1 < fmt.size() && (fmt[i + 1] == '}' || fmt[i + 1] == ':')) {
      size_t close = fmt.find('}', i + 1);
      if (close == std::string_view::npos) break;
      FormatSpec spec = fmt[i + 1] == ':' ? parse_format_spec(fmt.substr(i + 2, close - i - 2)) : FormatSpec{};
      write_formatted(os, spec, std::forward<T>(value));
      format_rest(os, fmt.substr(close + 1), std::forward<Rest>(rest)...);
      return;
    } else {
      os << fmt[i];
    }
  }
  os << ' ' << std::forward<T>(value);
  ((os << ' ' << std::forward<Rest>(rest)), ...);
}

}  // namespace detail

/// Formats `fmt`, replacing each "{}" (or "{:spec}") with the next argument.
template <class... Args>
std::string format(std::string_view fmt, Args&&... args) {
  std::ostringstream os;
  detail::format_rest(os, fmt, std::forward<Args>(args)...);
  return os.str();
}

/// The same for a literal format. A call with an argument from namespace std
/// (a std::string, a path) also finds std::format by argument-dependent
/// lookup once <format> is in (GCC 13 and later); a literal binds to this
/// overload exactly, so the call is not ambiguous.
template <class... Args>
std::string format(const char* fmt, Args&&... args) {
  return ::st::format(std::string_view(fmt), std::forward<Args>(args)...);
}

/// A byte count for people, in powers of 1000: "812 B", "45.3 kB", "12.3 MB", "1.25 GB", "3.10 TB".
inline std::string human_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1000) return format("{} B", bytes);
  if (bytes < 1000 * 1000) return format("{:.1f} kB", b / 1e3);
  if (bytes < int64_t{1000} * 1000 * 1000) return format("{:.1f} MB", b / 1e6);
  if (bytes < int64_t{1000} * 1000 * 1000 * 1000) return format("{:.2f} GB", b / 1e9);
  return format("{:.2f} TB", b / 1e12);
}

/// An integer with its thousands grouped for people: "1,234,567", "-12,345", "999".
inline std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v);
  const size_t first = v < 0 ? 1 : 0;  // the sign stays in front of the groups
  std::string out = digits.substr(0, first);
  for (size_t i = first; i < digits.size(); ++i) {
    if (i > first && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace st
