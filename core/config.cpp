#include "core/config.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <concepts>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <type_traits>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "core/file.h"

// The generic half of the configuration: every layer's visit_keys() lists its
// keys once (dotted name, doc, field), and loading, --set, to_yaml(),
// config_keys() and the section structure (which names are maps, which are
// leaves) are all derived from that list.

namespace st {

namespace {

// ---------------------------------------------------------------------------
// The key list of a schema.

std::vector<std::string> schema_keys(const Schema& schema) {
  std::vector<std::string> keys;
  schema([&](const Key& k, Field) { keys.push_back(k.key); });
  return keys;
}

bool is_string_key(const Schema& schema, std::string_view path) {
  bool found = false;
  schema([&](const Key& k, Field f) { found = found || (k.key == path && f.kind() == Field::Kind::String); });
  return found;
}

bool is_key(const Schema& schema, std::string_view path) {
  const auto keys = schema_keys(schema);
  return std::find(keys.begin(), keys.end(), path) != keys.end();
}

/// Names one level below `prefix` ("" is the top level), in schema order.
std::vector<std::string> children_of(const Schema& schema, std::string_view prefix) {
  std::vector<std::string> out;
  for (const std::string& full : schema_keys(schema)) {
    std::string_view key = full;
    if (!prefix.empty()) {
      if (key.size() <= prefix.size() || !key.starts_with(prefix) || key[prefix.size()] != '.') continue;
      key.remove_prefix(prefix.size() + 1);
    }
    std::string name(key.substr(0, key.find('.')));
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(std::move(name));
  }
  return out;
}

bool is_section(const Schema& schema, std::string_view path) {
  return !is_key(schema, path) && !children_of(schema, path).empty();
}

std::vector<std::string_view> views(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// ---------------------------------------------------------------------------
// Suggestions.

// Optimal string alignment distance: a swapped pair of letters counts as one
// edit, since transpositions are the most common typo in key names.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

/// "; did you mean 'x'?" for the closest candidate, or "" when none is close.
/// Case is ignored so "full_shard" still points at FULL_SHARD.
template <class Range>
std::string closest_suggestion(std::string_view given, const Range& candidates) {
  const size_t limit = std::max<size_t>(2, given.size() / 3);
  const std::string g = lower(given);
  std::string best;
  size_t best_distance = limit + 1;
  for (const auto& candidate : candidates) {
    const size_t dist = edit_distance(g, lower(candidate));
    if (dist < best_distance) {
      best_distance = dist;
      best = std::string(candidate);
    }
  }
  return best.empty() ? std::string() : format("; did you mean '{}'?", best);
}

template <class Range>
std::string join_any(const Range& items, std::string_view sep) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

// ---------------------------------------------------------------------------
// YAML scalars (YAML 1.2 core schema: true/false only; no yes/no/on/off).

bool is_null_word(std::string_view s) { return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL"; }

std::optional<bool> parse_bool(std::string_view s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

// [-+]?[0-9]+ | 0x[0-9a-fA-F]+ | 0o[0-7]+
template <std::integral T>
std::optional<T> parse_integer(std::string_view s) {
  int base = 10;
  std::string_view digits = s;
  if (s.starts_with("0x") || s.starts_with("0o")) {
    base = s[1] == 'x' ? 16 : 8;
    digits.remove_prefix(2);
  } else if (s.starts_with('+')) {
    digits.remove_prefix(1);
  } else if (s.starts_with('-')) {
    digits.remove_prefix(1);
    if (std::is_unsigned_v<T>) return std::nullopt;
  }
  if (digits.empty() || !std::isxdigit(static_cast<unsigned char>(digits[0]))) return std::nullopt;
  if (s.starts_with('-')) digits = s;  // from_chars reads the minus sign itself
  T value{};
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, value, base);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::optional<double> parse_float(std::string_view s) {
  std::string_view body = s;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == ".inf" || body == ".Inf" || body == ".INF")
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  // [0-9]+(\.[0-9]*)? | \.[0-9]+, then an optional [eE][-+]?[0-9]+
  size_t i = 0, mantissa_digits = 0;
  auto digits = [&] {
    size_t n = 0;
    while (i < body.size() && std::isdigit(static_cast<unsigned char>(body[i]))) ++i, ++n;
    return n;
  };
  mantissa_digits += digits();
  if (i < body.size() && body[i] == '.') {
    ++i;
    mantissa_digits += digits();
  }
  if (mantissa_digits == 0) return std::nullopt;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  // from_chars takes no '+' sign and no '+' in front of the exponent is fine.
  const std::string_view text = s.starts_with('+') ? s.substr(1) : s;
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

/// Shortest text that reads back as the same double, always with a '.' so
/// YAML 1.1 readers (PyYAML) also see a float.
std::string format_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  // Plain decimals in the range people write by hand (0.0003, 500000.0), exponents outside it (1.0e-08).
  const double magnitude = std::fabs(v);
  const bool fixed = magnitude == 0 || (magnitude >= 1e-4 && magnitude < 1e16);
  std::array<char, 400> buf{};
  const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), v,
                                    fixed ? std::chars_format::fixed : std::chars_format::scientific);
  std::string s(buf.data(), result.ptr);
  const size_t e = s.find('e');
  const std::string_view mantissa = std::string_view(s).substr(0, e);
  if (mantissa.find('.') == std::string_view::npos) s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

/// True when `s` reads back from a plain (unquoted) YAML scalar as the same string.
bool plain_safe(std::string_view s) {
  if (s.empty() || s[0] == '-' || s[0] == '.') return false;
  for (char ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != '/' && ch != '-') return false;
  return !is_null_word(s) && !parse_bool(s) && !parse_integer<int64_t>(s) && !parse_float(s);
}

std::string quote_string(std::string_view s) {
  if (plain_safe(s)) return std::string(s);
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// ---------------------------------------------------------------------------
// Assigning a YAML node to a field.

/// "at llama.yaml:7" or "in --set": where the value came from, for messages.
struct Where {
  std::string text;
};

Where at(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null()) return {format("in {}", source)};
  return {format("at {}:{}", source, mark.line + 1)};
}

bool is_plain(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "?"; }

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "an empty value";
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  if (!is_plain(n)) return format("the quoted string \"{}\"", n.Scalar());
  return format("'{}'", n.Scalar());
}

[[noreturn]] void bad_value(const Key& k, const Where& w, const YAML::Node& n, std::string_view expected) {
  ST_FAIL("bad value for '{}' {}: got {}, expected {}", k.key, w.text, describe(n), expected);
}

void check_choice(const std::string& value, const YAML::Node& n, const Key& k, const Where& w) {
  if (k.choices.empty() || in_choices(value, k.choices)) return;
  ST_FAIL("bad value for '{}' {}: got {}, expected one of {}{}", k.key, w.text, describe(n), join(k.choices, " | "),
          did_you_mean(value, k.choices));
}

template <class T>
T parsed(const YAML::Node& n, const Key& k, const Where& w, std::string_view expected,
         std::optional<T> (*parse)(std::string_view)) {
  const std::optional<T> v = is_plain(n) ? parse(n.Scalar()) : std::nullopt;
  if (!v) bad_value(k, w, n, expected);
  return *v;
}

std::string assigned_string(const YAML::Node& n, const Key& k, const Where& w) {
  // YAML reads "~", "null" and nothing at all as null, never as a string:
  // "dir: ~" meant the home directory, not "no directory", and silently
  // turned checkpointing off. An empty string is written "".
  if (n.IsNull())
    bad_value(k, w, n,
              "a string (YAML reads ~, null and an empty value as null, and ~ is not the home directory here: "
              "write the path out, or \"\" for none)");
  if (!n.IsScalar()) bad_value(k, w, n, "a string");
  check_choice(n.Scalar(), n, k, w);
  return n.Scalar();
}

/// The items of a list-of-strings value, each checked against the key's choices.
std::vector<std::string> assigned_list(const YAML::Node& n, const Key& k, const Where& w) {
  std::vector<std::string> v;
  if (n.IsSequence()) {
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) bad_value(k, w, n, "a list of strings, e.g. [a, b]");
      check_choice(item.Scalar(), item, k, w);
      v.push_back(item.Scalar());
    }
  } else if (!n.IsNull()) {
    bad_value(k, w, n, "a list of strings, e.g. [a, b]");
  }
  return v;
}

void assign_enum(const Field& f, const YAML::Node& n, const Key& k, const Where& w) {
  const std::vector<std::string_view>& names = f.names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (n.IsScalar() && n.Scalar() == names[i]) {
      f.set_index(i);
      return;
    }
  }
  ST_FAIL("bad value for '{}' {}: got {}, expected one of {}{}", k.key, w.text, describe(n), join(names, " | "),
          n.IsScalar() ? did_you_mean(n.Scalar(), names) : std::string());
}

void assign_flags(const Field& f, const YAML::Node& n, const Key& k, const Where& w) {
  std::vector<std::string_view> names;
  for (const Flag& flag : f.flag_list()) names.push_back(flag.name);
  const Key checked{k.key, k.doc, names};
  const std::vector<std::string> items = assigned_list(n, checked, w);
  for (const Flag& flag : f.flag_list()) *flag.value = false;
  for (const std::string& item : items) {
    for (const Flag& flag : f.flag_list())
      if (item == flag.name) *flag.value = true;
  }
}

void assign(const Field& f, const YAML::Node& n, const Key& k, const Where& w) {
  using K = Field::Kind;
  switch (f.kind()) {
    case K::Int: f.as<int64_t>() = parsed<int64_t>(n, k, w, "an integer", parse_integer<int64_t>); return;
    case K::UInt:
      f.as<uint64_t>() = parsed<uint64_t>(n, k, w, "a non-negative integer", parse_integer<uint64_t>);
      return;
    case K::Float: f.as<double>() = parsed<double>(n, k, w, "a number", parse_float); return;
    case K::Bool: f.as<bool>() = parsed<bool>(n, k, w, "true or false", parse_bool); return;
    case K::String: f.as<std::string>() = assigned_string(n, k, w); return;
    case K::StringList: f.as<std::vector<std::string>>() = assigned_list(n, k, w); return;
    case K::Enum: assign_enum(f, n, k, w); return;
    case K::Flags: assign_flags(f, n, k, w); return;
  }
}

/// Assigns `n` to the field named `key`; false when no field has that name.
bool set_field(const Schema& schema, std::string_view key, const YAML::Node& n, const Where& w) {
  bool found = false;
  schema([&](const Key& k, Field field) {
    if (k.key != key) return;
    assign(field, n, k, w);
    found = true;
  });
  return found;
}

// ---------------------------------------------------------------------------
// Loading.

std::string join_path(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : format("{}.{}", prefix, name);
}

void load_map(const Schema& schema, const YAML::Node& map, const std::string& prefix, std::string_view source) {
  std::vector<std::pair<std::string, int>> seen;  // key, 1-based line: yaml-cpp keeps duplicate keys
  for (const auto& kv : map) {
    const YAML::Node& key_node = kv.first;
    const YAML::Node& value = kv.second;
    // The key's line, not the value's: a null or nested value starts elsewhere.
    const Where where = at(source, key_node.Mark());
    ST_CHECK(key_node.IsScalar(), "expected a key name {}{}, got {}", where.text,
             prefix.empty() ? std::string() : format(" inside '{}'", prefix), describe(key_node));
    const std::string& name = key_node.Scalar();
    const std::string path = join_path(prefix, name);

    const int line = key_node.Mark().line + 1;
    for (const auto& [seen_name, seen_line] : seen)
      ST_CHECK(seen_name != name, "duplicate key '{}' {} (first given on line {})", path, where.text, seen_line);
    seen.emplace_back(name, line);

    if (set_field(schema, path, value, where)) continue;
    if (is_section(schema, path)) {
      if (value.IsNull()) continue;  // "optim:" with nothing under it keeps the defaults
      ST_CHECK(value.IsMap(), "bad value for '{}' {}: got {}, expected a map of its keys ({})", path, where.text,
               describe(value), join(views(children_of(schema, path)), ", "));
      load_map(schema, value, path, source);
      continue;
    }
    const auto siblings = children_of(schema, prefix);
    ST_FAIL("unknown key '{}' {}{}", path, where.text, did_you_mean(name, views(siblings)));
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------
// Field.

size_t Field::index() const {
  const int64_t v = get_(ptr_);
  for (size_t i = 0; i < enum_values_.size(); ++i)
    if (enum_values_[i] == v) return i;
  return std::string_view::npos;
}

void Field::set_index(size_t i) const { set_(ptr_, enum_values_.at(i)); }

Field Field::flags(std::vector<Flag> flags) {
  Field f(Kind::Flags);
  f.flags_ = std::move(flags);
  return f;
}

std::string Field::text() const {
  switch (kind_) {
    case Kind::Int: return yaml_text(as<int64_t>());
    case Kind::UInt: return yaml_text(as<uint64_t>());
    case Kind::Float: return yaml_text(as<double>());
    case Kind::Bool: return yaml_text(as<bool>());
    case Kind::String: return yaml_text(as<std::string>());
    case Kind::StringList: return yaml_text(as<std::vector<std::string>>());
    case Kind::Enum: {
      const size_t i = index();
      return i < names_.size() ? std::string(names_[i]) : "?";  // "?" only for a value cast from bad data
    }
    case Kind::Flags: {
      std::vector<std::string> on;
      for (const Flag& flag : flags_)
        if (*flag.value) on.emplace_back(flag.name);
      return yaml_text(on);
    }
  }
  return "?";
}

std::string Field::type_name(std::span<const std::string_view> choices) const {
  switch (kind_) {
    case Kind::Int:
    case Kind::UInt: return "int";
    case Kind::Float: return "float";
    case Kind::Bool: return "bool";
    case Kind::String: return choices.empty() ? "string" : join(choices, " | ");
    case Kind::StringList:
    case Kind::Flags: return "list of strings";
    case Kind::Enum: return join(names_, " | ");
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Public API.

KeyVisitor in_section(std::string_view section, const KeyVisitor& v) {
  return [section, &v](const Key& k, Field f) { v(Key{join_path(section, k.key), k.doc, k.choices}, std::move(f)); };
}

std::string did_you_mean(std::string_view given, std::span<const std::string_view> candidates) {
  return closest_suggestion(given, candidates);
}

std::string join(std::span<const std::string_view> items, std::string_view sep) { return join_any(items, sep); }

bool in_choices(std::string_view v, std::span<const std::string_view> choices) {
  return std::find(choices.begin(), choices.end(), v) != choices.end();
}

std::string yaml_text(int64_t v) { return std::to_string(v); }
std::string yaml_text(uint64_t v) { return std::to_string(v); }
std::string yaml_text(double v) { return format_float(v); }
std::string yaml_text(bool v) { return v ? "true" : "false"; }
std::string yaml_text(const std::string& v) { return quote_string(v); }
std::string yaml_text(const std::vector<std::string>& v) {
  std::vector<std::string> quoted;
  for (const auto& s : v) quoted.push_back(quote_string(s));
  std::string out = "[";  // appended, not "[" + ...: GCC 12 raises a false -Wrestrict on the latter
  out += join_any(quoted, ", ");
  out += ']';
  return out;
}

std::vector<ConfigKeyDoc> config_keys(const Schema& schema) {
  std::vector<ConfigKeyDoc> out;
  schema([&](const Key& k, Field field) {
    out.push_back({k.key, field.type_name(k.choices), field.text(), std::string(k.doc)});
  });
  return out;
}

void apply_override(const Schema& schema, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  ST_CHECK(eq != std::string_view::npos, "--set '{}' has no '='; expected key=value, e.g. --set train.steps=100",
           assignment);
  const std::string key(trim(assignment.substr(0, eq)));
  const std::string value(assignment.substr(eq + 1));
  ST_CHECK(!key.empty(), "--set '{}' has no key before '='; expected key=value, e.g. --set train.steps=100",
           assignment);
  if (!is_key(schema, key)) {
    if (is_section(schema, key)) {
      const auto children = children_of(schema, key);
      ST_FAIL("'{}' in --set is a section, not a key; set one of its keys ({}), e.g. --set {}.{}=...", key,
              join(views(children), ", "), key, children.front());
    }
    const auto keys = schema_keys(schema);
    ST_FAIL("unknown key '{}' in --set{}", key, did_you_mean(key, views(keys)));
  }
  YAML::Node node;
  try {
    // "--set checkpoint.dir=" (nothing after '=') is the shell's way to write
    // an empty string; YAML would read it as null, which a string refuses.
    node = trim(value).empty() && is_string_key(schema, key) ? YAML::Load("\"\"") : YAML::Load(value);
  } catch (const YAML::Exception& e) {
    ST_FAIL("bad value for '{}' in --set: '{}' is not a YAML value ({})", key, value, e.msg);
  }
  set_field(schema, key, node, Where{"in --set"});
}

namespace {

/// Sees only where each YAML document starts; the nodes are built by YAML::Load.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

/// Checks that `text` holds at most one YAML document. yaml-cpp's LoadAll
/// never ends on some malformed input (a lone ',' yields empty documents
/// forever without moving on, until memory runs out), so the documents are
/// counted here, stopping at the second one or where the parser stands still.
void check_single_document(const std::string& text, std::string_view source_name) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts seen;
  while (parser.HandleNextDocument(seen) && seen.starts.size() < 2) {
  }
  if (seen.starts.size() < 2) return;
  const YAML::Mark& second = seen.starts[1];
  ST_CHECK(second.pos != seen.starts[0].pos,
           "YAML syntax error at {}:{}:{}: unexpected '{}' where a key or value should be", source_name,
           second.line + 1, second.column + 1, text.substr(static_cast<size_t>(second.pos), 1));
  ST_FAIL("{} holds more than one YAML document (a second one starts at line {}); expected one", source_name,
          second.line + 1);
}

}  // namespace

void load_yaml(const Schema& schema, std::string_view yaml, std::string_view source_name) {
  ST_CHECK(static_cast<int64_t>(yaml.size()) <= kMaxConfigBytes,
           "config {} is {} bytes, over the limit of {} bytes (1 MiB) for a config; is it a config file?", source_name,
           yaml.size(), kMaxConfigBytes);
  const std::string text(yaml);
  YAML::Node root;
  try {
    check_single_document(text, source_name);
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    ST_FAIL("YAML syntax error at {}:{}:{}: {}", source_name, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (root.IsNull()) return;
  ST_CHECK(root.IsMap(), "expected a map of sections ({}) at the top level of {}, got {}",
           join(views(children_of(schema, "")), ", "), source_name, describe(root));
  load_map(schema, root, "", source_name);
}

std::string read_config_file(const std::string& path) {
  // A directory opens as a stream on Linux and reads as empty, which would
  // silently train the defaults; so would a FIFO block. Only a regular file will do.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  ST_CHECK(!ec && std::filesystem::exists(status), "cannot open config file '{}'", path);
  ST_CHECK(!std::filesystem::is_directory(status),
           "config file '{}' is a directory; pass a YAML file, e.g. --config configs/llama-tiny.yaml", path);
  ST_CHECK(std::filesystem::is_regular_file(status), "config file '{}' is not a regular file", path);
  // Checked before reading: parsing a large file takes minutes and gigabytes.
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  ST_CHECK(!ec, "cannot read config file '{}': {}", path, ec.message());
  ST_CHECK(bytes <= kMaxConfigBytes,
           "config file '{}' is {} ({} bytes), over the limit of {} bytes (1 MiB) for a config file; is --config "
           "the right file?",
           path, human_bytes(bytes), bytes, kMaxConfigBytes);
  const std::string text = read_file(path, "config file");
  // A file with no settings is a mistake (a wrong path, a truncated copy), not a request for the defaults.
  bool has_content = false;
  std::istringstream lines(text);
  for (std::string line; !has_content && std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    has_content = first != std::string::npos && line[first] != '#' && line.compare(first, 3, "---") != 0;
  }
  ST_CHECK(has_content, "config file '{}' is empty (no settings, only blank lines or comments)", path);
  return text;
}

std::string to_yaml(const Schema& schema) {
  std::string out;
  std::vector<std::string> open;  // the section path of the previous key
  schema([&](const Key& k, Field field) {
    std::vector<std::string> parts;
    for (std::string_view rest = k.key;;) {
      const size_t dot = rest.find('.');
      parts.emplace_back(rest.substr(0, dot));
      if (dot == std::string_view::npos) break;
      rest.remove_prefix(dot + 1);
    }
    const std::string leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i < parts.size(); ++i) {
      out += std::string(2 * i, ' ') + parts[i] + ":\n";
      open.push_back(parts[i]);
    }
    out += std::string(2 * parts.size(), ' ') + leaf + ": " + field.text() + "\n";
  });
  return out;
}

}  // namespace st
