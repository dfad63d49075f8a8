#pragma once
// The configuration machinery: keys, typed fields, YAML loading, `--set`
// overrides, to_yaml() and the key reference.
//
// core/ knows YAML and the schema, never a domain: each layer owns its config
// struct, its enums with their YAML spellings, its visit_keys() (one line per
// key: name, doc, field) and its validate(), beside each other:
//   models/config.h     ModelConfig        model.*
//   optim/config.h      OptimConfig        optim.*
//   fsdp/config.h       FsdpConfig         fsdp.*
//   checkpoint/config.h CheckpointConfig   checkpoint.*
//   launch/config.h     TrainConfig, DataConfig, CommConfig, LoggingConfig and
//                       Config, the whole file (load_config, to_yaml, ...)
// Loading is strict: an unknown key, a wrong type or a value out of range is
// an st::Error naming the key, the file:line and what was expected (with the
// closest valid key for a typo). Values are converted to their real types
// (enums, DType, structs of bools) as they are read, once.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/format.h"

namespace st {

/// One YAML spelling of an enum value. A layer lists its enum's spellings in
/// one array and makes it findable as `names_of(E)` in the enum's namespace.
template <class E>
struct Named {
  E value;
  std::string_view name;
};

/// An enum with a `names_of(E)` overload: its config spellings.
template <class E>
concept ConfigEnum = std::is_enum_v<E> && requires(E e) {
  { names_of(e) } -> std::convertible_to<std::span<const Named<E>>>;
};

/// The spelling of `v` among `names` ("?" for a value not listed).
template <class E>
std::string_view name_in(E v, std::span<const Named<E>> names) {
  for (const auto& n : names)
    if (n.value == v) return n.name;
  return "?";
}
template <ConfigEnum E>
std::string_view enum_name(E v) {
  return name_in(v, std::span<const Named<E>>(names_of(v)));
}
/// The YAML spelling of a config enum ("FULL_SHARD", "cosine", ...).
template <ConfigEnum E>
std::string_view to_string(E v) {
  return enum_name(v);
}

/// One configuration key.
struct Key {
  std::string key;                                 // dotted path, "fsdp.mixed_precision.param_dtype"
  std::string_view doc;                            // the field's one-line doc (also its comment in the header)
  std::span<const std::string_view> choices = {};  // allowed strings (or list elements); empty: any
};

/// One name of a list-valued key read into bools: `[a, b]` sets a and b.
struct Flag {
  std::string_view name;
  bool* value;
};

/// A reference to one field of a config struct, of any type a key may have.
/// Built inside a visit and used at once (it points into the struct).
class Field {
 public:
  enum class Kind : uint8_t { Int, UInt, Float, Bool, String, StringList, Enum, Flags };

  Field(int64_t& v) : kind_(Kind::Int), ptr_(&v) {}                          // NOLINT: implicit on purpose
  Field(uint64_t& v) : kind_(Kind::UInt), ptr_(&v) {}                        // NOLINT
  Field(double& v) : kind_(Kind::Float), ptr_(&v) {}                         // NOLINT
  Field(bool& v) : kind_(Kind::Bool), ptr_(&v) {}                            // NOLINT
  Field(std::string& v) : kind_(Kind::String), ptr_(&v) {}                   // NOLINT
  Field(std::vector<std::string>& v) : kind_(Kind::StringList), ptr_(&v) {}  // NOLINT
  /// An enum field whose YAML spellings are `names` (e.g. a DType limited to f32 | bf16).
  template <class E>
  Field(E& v, std::span<const Named<E>> names) : kind_(Kind::Enum), ptr_(&v) {
    for (const auto& n : names) names_.push_back(n.name);
    enum_values_.reserve(names.size());
    for (const auto& n : names) enum_values_.push_back(static_cast<int64_t>(n.value));
    get_ = [](const void* p) { return static_cast<int64_t>(*static_cast<const E*>(p)); };
    set_ = [](void* p, int64_t x) { *static_cast<E*>(p) = static_cast<E>(x); };
  }
  template <ConfigEnum E>
  Field(E& v) : Field(v, std::span<const Named<E>>(names_of(v))) {}  // NOLINT
  /// A list of names, each setting one bool (a name not in the list clears its bool).
  static Field flags(std::vector<Flag> flags);

  Kind kind() const { return kind_; }
  template <class T>
  T& as() const {
    return *static_cast<T*>(ptr_);
  }
  /// Enum fields: the spellings, and the index of the current value (npos when unlisted).
  const std::vector<std::string_view>& names() const { return names_; }
  size_t index() const;
  void set_index(size_t i) const;
  /// Flags fields.
  const std::vector<Flag>& flag_list() const { return flags_; }

  /// The current value as YAML text (also how errors show values).
  std::string text() const;
  /// "int", "float", "bool", "string", "list of strings", "a | b | c", ...
  std::string type_name(std::span<const std::string_view> choices) const;

 private:
  explicit Field(Kind k) : kind_(k) {}
  Kind kind_;
  void* ptr_ = nullptr;
  std::vector<std::string_view> names_;
  std::vector<int64_t> enum_values_;
  int64_t (*get_)(const void*) = nullptr;
  void (*set_)(void*, int64_t) = nullptr;
  std::vector<Flag> flags_;
};

/// Called once per key of a config object, in to_yaml() order; the keys of
/// one section stay contiguous.
using KeyVisitor = std::function<void(const Key&, Field)>;
/// Visits every key of one config object (e.g. [&](auto& v) { visit_keys(config, v); }).
using Schema = std::function<void(const KeyVisitor&)>;

/// `v` with "section." put in front of every key name.
KeyVisitor in_section(std::string_view section, const KeyVisitor& v);

/// One configuration key, for help text and docs/configuration.md.
struct ConfigKeyDoc {
  std::string key;            // "fsdp.mixed_precision.param_dtype"
  std::string type;           // "int", "float", "bool", "string", "list of strings", or "a | b | c"
  std::string default_value;  // as it would be written in YAML
  std::string doc;            // the field's one-line comment
};
/// Every key of `schema` (visited on a default-built object) with its current value as default.
std::vector<ConfigKeyDoc> config_keys(const Schema& schema);

/// The largest config file (and YAML text) accepted: real configs are a few
/// KiB, while YAML parsing takes tens of bytes of memory per byte of text, so
/// a larger file is a wrong path (a data file, a checkpoint), refused before
/// it is read. A --set value is bounded by the OS (MAX_ARG_STRLEN, 128 KiB).
inline constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;

/// The text of config file `path`: an error unless it is a readable regular
/// file of at most kMaxConfigBytes with at least one setting. Errors name the
/// path as given.
std::string read_config_file(const std::string& path);
/// Assigns the keys of YAML `yaml` (one document, a map of sections, at most
/// kMaxConfigBytes) to the fields of `schema`; `source_name` stands in for
/// the file name in errors.
void load_yaml(const Schema& schema, std::string_view yaml, std::string_view source_name);
/// Applies one "key=value" override (value parsed as YAML).
void apply_override(const Schema& schema, std::string_view assignment);
/// The fields as YAML (loadable again by load_yaml).
std::string to_yaml(const Schema& schema);

// ---------------------------------------------------------------------------
// For validate(): every message reads "invalid value V for 'key': expected ...".

std::string yaml_text(int64_t v);
std::string yaml_text(uint64_t v);
std::string yaml_text(double v);
std::string yaml_text(bool v);
std::string yaml_text(const std::string& v);
std::string yaml_text(const std::vector<std::string>& v);

template <class T>
void require(bool ok, std::string_view key, const T& value, std::string_view expected) {
  ST_CHECK(ok, "invalid value {} for '{}': expected {}", yaml_text(value), key, expected);
}

/// "; did you mean 'x'?" for the closest of `candidates`, or "" when none is close.
std::string did_you_mean(std::string_view given, std::span<const std::string_view> candidates);
/// "a | b | c" for ", " or any other separator.
std::string join(std::span<const std::string_view> items, std::string_view sep);
bool in_choices(std::string_view v, std::span<const std::string_view> choices);
/// The model and the optimizer compute in F32, so a value that does not
/// survive the cast to F32 (1e39 becomes Inf) is never meaningful.
inline bool fits_f32(double v) { return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max(); }

}  // namespace st
