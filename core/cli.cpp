#include "core/cli.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>

#include "core/config.h"

namespace st {

namespace cli {

void usage_error(const std::string& message) { throw UsageError(message, __FILE__, __LINE__); }

namespace {

/// "-o, --output" -> {"-o", "--output"}.
std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  std::string name;
  std::istringstream in(names);
  while (std::getline(in, name, ',')) {
    const size_t first = name.find_first_not_of(' ');
    const size_t last = name.find_last_not_of(' ');
    ST_CHECK(first != std::string::npos && name[first] == '-', "flag name '{}' must start with '-'", name);
    out.push_back(name.substr(first, last - first + 1));
  }
  return out;
}

std::string integer_expectation(int64_t min, int64_t max) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (min == 1 && max == kMax) return "a positive integer";
  if (max == kMax) return format("an integer >= {}", min);
  if (min == std::numeric_limits<int64_t>::min()) return format("an integer <= {}", max);
  return format("an integer in [{}, {}]", min, max);
}

}  // namespace

int64_t to_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  // A whole number past int64's range reads as out of range: too large (or
  // too small), not malformed.
  const bool whole = !text.empty() && ptr == end;
  const bool too_large =
      whole && (ec == std::errc::result_out_of_range ? text[0] != '-' : ec == std::errc() && value > max);
  if (too_large) usage_error(format("{} {}: too large (at most {})", flag, text, max));
  if (!whole || ec != std::errc() || value < min || value > max)
    usage_error(format("{} {}: expected {}", flag, text, integer_expectation(min, max)));
  return value;
}

namespace {

double parse_double(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno == ERANGE || end != text.c_str() + text.size())
    usage_error(format("{} {}: expected a number", flag, text));
  return value;
}

/// Appends `doc` to `out` starting at column `column`, its continuation lines
/// indented to the same column.
void append_doc(std::string& out, const std::string& doc, size_t column) {
  for (size_t start = 0; start <= doc.size();) {
    const size_t nl = doc.find('\n', start);
    const size_t stop = nl == std::string::npos ? doc.size() : nl;
    if (start > 0) {
      out += '\n';
      out.append(column, ' ');
    }
    out += doc.substr(start, stop - start);
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  out += "\n";
}

}  // namespace

Parser::Parser(std::string program, std::string synopsis)
    : program_(std::move(program)), synopsis_(std::move(synopsis)) {}

Parser& Parser::add(const std::string& names, const std::string& metavar, const std::string& doc,
                    std::function<void(const std::string&, const std::string&)> set) {
  entries_.push_back({split_names(names), metavar, doc, std::move(set)});
  return *this;
}

Parser& Parser::flag(const std::string& names, bool* out, const std::string& doc) {
  return add(names, "", doc, [out](const std::string&, const std::string&) { *out = true; });
}

Parser& Parser::flag(const std::string& names, std::function<void()> then, const std::string& doc) {
  return add(names, "", doc, [then = std::move(then)](const std::string&, const std::string&) { then(); });
}

Parser& Parser::option(const std::string& names, const std::string& metavar, std::string* out, const std::string& doc) {
  return add(names, metavar, doc, [out](const std::string&, const std::string& v) { *out = v; });
}

Parser& Parser::option(const std::string& names, const std::string& metavar, std::optional<std::string>* out,
                       const std::string& doc) {
  return add(names, metavar, doc, [out](const std::string&, const std::string& v) { *out = v; });
}

Parser& Parser::option(const std::string& names, const std::string& metavar, int64_t* out, const std::string& doc,
                       int64_t min, int64_t max) {
  return add(names, metavar, doc,
             [=](const std::string& flag, const std::string& v) { *out = to_int(flag, v, min, max); });
}

Parser& Parser::option(const std::string& names, const std::string& metavar, int* out, const std::string& doc, int min,
                       int max) {
  return add(names, metavar, doc, [=](const std::string& flag, const std::string& v) {
    *out = static_cast<int>(to_int(flag, v, min, max));
  });
}

Parser& Parser::option(const std::string& names, const std::string& metavar, double* out, const std::string& doc) {
  return add(names, metavar, doc, [=](const std::string& flag, const std::string& v) { *out = parse_double(flag, v); });
}

Parser& Parser::repeated(const std::string& names, const std::string& metavar, std::vector<std::string>* out,
                         const std::string& doc) {
  return add(names, metavar, doc, [out](const std::string&, const std::string& v) { out->push_back(v); });
}

Parser& Parser::option(const std::string& names, const std::string& metavar,
                       std::function<void(const std::string&)> then, const std::string& doc) {
  return add(names, metavar, doc, [then = std::move(then)](const std::string&, const std::string& v) { then(v); });
}

Parser& Parser::positionals(const std::string& metavar, std::vector<std::string>* out) {
  positionals_ = out;
  positional_metavar_ = metavar;
  return *this;
}

Parser& Parser::text(const std::string& paragraph) {
  entries_.push_back({{}, "", paragraph, nullptr});
  return *this;
}

std::string Parser::closest_flag(const std::string& name) const {
  std::vector<std::string_view> names{"--help"};
  for (const Entry& e : entries_)
    for (const std::string& n : e.names)
      if (n.starts_with("--")) names.push_back(n);
  return did_you_mean(name, names);
}

const Parser::Entry* Parser::find(const std::string& name) const {
  for (const Entry& e : entries_)
    for (const std::string& n : e.names)
      if (n == name) return &e;
  return nullptr;
}

Parser& Parser::usage_without_arguments() {
  usage_without_arguments_ = true;
  return *this;
}

bool Parser::parse_or_help(const std::vector<std::string>& argv) const {
  if (!parse(argv)) return false;
  std::fputs(help().c_str(), stdout);
  return true;
}

bool Parser::parse(const std::vector<std::string>& argv) const {
  if (argv.empty() && usage_without_arguments_) throw NoArguments(help());
  bool help = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help = true;
      continue;
    }
    if (!arg.starts_with("-") || arg == "-") {
      if (positionals_ == nullptr) usage_error(format("unexpected argument '{}' (see --help)", arg));
      positionals_->push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const Entry* entry = find(name);
    if (entry == nullptr) usage_error(format("unknown argument '{}'{} (see --help)", arg, closest_flag(name)));
    if (entry->metavar.empty()) {
      if (eq != std::string::npos) usage_error(format("{} takes no value (see --help)", name));
      entry->set(name, "");
      continue;
    }
    if (eq != std::string::npos) {
      entry->set(name, arg.substr(eq + 1));
    } else {
      if (i + 1 >= argv.size()) usage_error(format("{} needs a value (see --help)", name));
      entry->set(name, argv[++i]);
    }
  }
  return help;
}

std::string Parser::options_help(int indent) const {
  // The docs start in one column, past the longest "--flag VALUE" (within reason).
  constexpr size_t kMaxHead = 24;
  auto head_of = [](const Entry& e) {
    std::string head;
    for (const std::string& n : e.names) head += (head.empty() ? "" : ", ") + n;
    return e.metavar.empty() ? head : head + " " + e.metavar;
  };
  size_t width = 0;
  for (const Entry& e : entries_)
    if (!e.names.empty()) width = std::max(width, std::min(head_of(e).size(), kMaxHead));
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  std::string out;
  for (const Entry& e : entries_) {
    if (e.names.empty()) {
      append_doc(out, e.doc, 0);
      continue;
    }
    std::string line = pad + head_of(e);
    const size_t column = pad.size() + width + 2;
    line += std::string(line.size() < column ? column - line.size() : 2, ' ');
    out += line;
    append_doc(out, e.doc, column);
  }
  return out;
}

std::string Parser::help() const { return "usage: " + synopsis_ + "\n\n" + options_help(); }

}  // namespace cli

int run_main(const char* program, const std::function<int()>& body, const AgreedErrors& agreed) {
  try {
    return body();
  } catch (const AgreedError& e) {
    if (agreed.reporter && !agreed.reporter()) {
      if (agreed.quiet_exit) agreed.quiet_exit();
      return 0;
    }
    std::fprintf(stderr, "%s: error: %s\n", program, e.message().c_str());
    return 1;
  } catch (const cli::NoArguments& e) {
    std::fputs(e.usage().c_str(), stderr);
    return 2;
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.message().c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.message().c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    // An allocation no caller could attribute (a library's buffer, a
    // container during set-up): still the user's to fix, not a bug.
    std::fprintf(stderr,
                 "%s: error: out of host memory (an allocation failed outside any tensor); give the process more "
                 "memory or lower the sizes the run needs (model, micro-batch, sequence length)\n",
                 program);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return 2;
  }
}

}  // namespace st
