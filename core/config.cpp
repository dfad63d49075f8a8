#include "core/config.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <concepts>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "core/error.h"

// One schema, visit_schema(), lists every key once: its dotted name, its
// C++ field and its doc. Loading, --set, to_yaml(), config_keys() and the
// section structure (which names are maps, which are leaves) are all derived
// from it, so adding a field means adding one line here and one in config.h.

namespace st {

namespace {

// ---------------------------------------------------------------------------
// Enum spellings: the single place each YAML spelling is written.

template <class E>
struct Named {
  E value;
  std::string_view name;
};

constexpr Named<DeviceKind> kDeviceNames[] = {
    {DeviceKind::Cpu, "cpu"}, {DeviceKind::Cuda, "cuda"}, {DeviceKind::Auto, "auto"}};
constexpr Named<DataKind> kDataNames[] = {
    {DataKind::Synthetic, "synthetic"}, {DataKind::Text, "text"}, {DataKind::Tokens, "tokens"}};
constexpr Named<TokenDType> kTokenDTypeNames[] = {{TokenDType::U16, "uint16"}, {TokenDType::U32, "uint32"}};
constexpr Named<OptimizerKind> kOptimizerNames[] = {{OptimizerKind::AdamW, "adamw"}, {OptimizerKind::Sgd, "sgd"}};
constexpr Named<ScheduleKind> kScheduleNames[] = {
    {ScheduleKind::Constant, "constant"}, {ScheduleKind::Cosine, "cosine"}, {ScheduleKind::Linear, "linear"}};
constexpr Named<ShardingStrategy> kShardingNames[] = {{ShardingStrategy::FullShard, "FULL_SHARD"},
                                                      {ShardingStrategy::ShardGradOp, "SHARD_GRAD_OP"},
                                                      {ShardingStrategy::NoShard, "NO_SHARD"},
                                                      {ShardingStrategy::HybridShard, "HYBRID_SHARD"}};
constexpr Named<WrapPolicy> kWrapNames[] = {
    {WrapPolicy::SizeBased, "size_based"}, {WrapPolicy::Transformer, "transformer"}, {WrapPolicy::None, "none"}};
constexpr Named<PrecisionKind> kPrecisionNames[] = {{PrecisionKind::F32, "f32"}, {PrecisionKind::BF16, "bf16"}};
constexpr Named<RecomputeMode> kRecomputeNames[] = {
    {RecomputeMode::None, "none"}, {RecomputeMode::Full, "full"}, {RecomputeMode::EveryN, "every_n"}};
constexpr Named<CheckpointFormat> kCheckpointFormatNames[] = {{CheckpointFormat::Unified, "unified"},
                                                              {CheckpointFormat::Sharded, "sharded"}};

// Overloads picked by the enum type, so templates below can ask any enum for its names.
std::span<const Named<DeviceKind>> names_of(DeviceKind) { return kDeviceNames; }
std::span<const Named<DataKind>> names_of(DataKind) { return kDataNames; }
std::span<const Named<TokenDType>> names_of(TokenDType) { return kTokenDTypeNames; }
std::span<const Named<OptimizerKind>> names_of(OptimizerKind) { return kOptimizerNames; }
std::span<const Named<ScheduleKind>> names_of(ScheduleKind) { return kScheduleNames; }
std::span<const Named<ShardingStrategy>> names_of(ShardingStrategy) { return kShardingNames; }
std::span<const Named<WrapPolicy>> names_of(WrapPolicy) { return kWrapNames; }
std::span<const Named<PrecisionKind>> names_of(PrecisionKind) { return kPrecisionNames; }
std::span<const Named<RecomputeMode>> names_of(RecomputeMode) { return kRecomputeNames; }
std::span<const Named<CheckpointFormat>> names_of(CheckpointFormat) { return kCheckpointFormatNames; }

template <class E>
concept ConfigEnum = std::is_enum_v<E> && requires(E e) {
  names_of(e);
};

template <ConfigEnum E>
std::string_view enum_name(E v) {
  for (const auto& n : names_of(v))
    if (n.value == v) return n.name;
  return "?";  // unreachable for values built by this file; kept total for casts from bad data
}

// ---------------------------------------------------------------------------
// The schema.

/// Choices for string fields whose values are a fixed set (kept as strings in config.h).
constexpr std::string_view kModelNames[] = {"llama", "toy"};
constexpr std::string_view kLogLevels[] = {"debug", "info", "warn", "error"};
constexpr std::string_view kUnifiedOptions[] = {"skip_save_model_weight", "master_weight_compatible",
                                                "enable_all_options"};

struct Key {
  constexpr Key(std::string_view k, std::string_view d, std::span<const std::string_view> c = {})
      : key(k), doc(d), choices(c) {}
  std::string_view key;                       // dotted path, "fsdp.mixed_precision.param_dtype"
  std::string_view doc;                       // identical to the field's comment in config.h (a test checks)
  std::span<const std::string_view> choices;  // allowed strings (or list elements); empty: any
};

// `C` is Config or const Config; `v(Key, field&)` is called once per key, in
// the order to_yaml() writes them. Keys of one section must stay contiguous.
template <class C, class V>
void visit_schema(C& c, V&& v) {
  auto& m = c.model;
  v(Key("model.name", R"("llama" or "toy" (the DCP tutorial's Linear(16,16)-ReLU-Linear(16,8)))", kModelNames), m.name);
  v(Key("model.vocab_size", "tokens in the vocabulary (256 for byte-level text)"), m.vocab_size);
  v(Key("model.hidden_size", "model width"), m.hidden_size);
  v(Key("model.intermediate_size", "SwiGLU hidden width"), m.intermediate_size);
  v(Key("model.num_hidden_layers", "decoder layers"), m.num_hidden_layers);
  v(Key("model.num_attention_heads", "query heads; divides hidden_size"), m.num_attention_heads);
  v(Key("model.num_key_value_heads", "key/value heads (GQA); divides num_attention_heads"), m.num_key_value_heads);
  v(Key("model.max_position_embeddings", "longest sequence the rotary tables cover"), m.max_position_embeddings);
  v(Key("model.rope_theta", "rotary base"), m.rope_theta);
  v(Key("model.rms_norm_eps", "RMSNorm epsilon"), m.rms_norm_eps);
  v(Key("model.tie_word_embeddings", "lm_head shares model.embed_tokens.weight"), m.tie_word_embeddings);
  v(Key("model.init_std", "std of the normal init of linears and embeddings"), m.init_std);

  auto& t = c.train;
  v(Key("train.steps", "optimizer steps in the run (the LR schedule follows it)"), t.steps);
  v(Key("train.global_batch_size", "sequences per optimizer step, over all ranks"), t.global_batch_size);
  v(Key("train.micro_batch_size", "sequences per forward/backward on one rank"), t.micro_batch_size);
  v(Key("train.seq_len", "tokens per sequence"), t.seq_len);
  v(Key("train.seed", "seeds init, data order and synthetic data"), t.seed);
  v(Key("train.device", "cpu | cuda | auto (cuda when a GPU is visible)"), t.device);
  v(Key("train.threads", "CPU threads per rank; 0 = the cores this rank may use"), t.threads);

  auto& d = c.data;
  v(Key("data.kind",
        "synthetic (seeded learnable Markov-chain tokens) | text (UTF-8 bytes) | tokens (uint16/uint32 .bin)"),
    d.kind);
  v(Key("data.path", "file or directory for text/tokens; unused for synthetic"), d.path);
  v(Key("data.token_dtype", "token width of headerless tokens files (llm.c shards give their own)"), d.token_dtype);

  auto& o = c.optim;
  v(Key("optim.name", "adamw | sgd"), o.name);
  v(Key("optim.lr", "peak learning rate"), o.lr);
  v(Key("optim.weight_decay", "on parameters with >= 2 dims only (AdamW: decoupled; SGD: L2, as torch)"),
    o.weight_decay);
  v(Key("optim.beta1", "AdamW first-moment decay"), o.beta1);
  v(Key("optim.beta2", "AdamW second-moment decay"), o.beta2);
  v(Key("optim.eps", "AdamW denominator epsilon"), o.eps);
  v(Key("optim.momentum", "SGD momentum"), o.momentum);
  v(Key("optim.grad_clip", "max global gradient norm; 0 disables clipping"), o.grad_clip);
  v(Key("optim.schedule.kind", "constant | cosine | linear (decay after warmup)"), o.schedule.kind);
  v(Key("optim.schedule.warmup_steps", "linear warmup: step s < warmup uses lr*(s+1)/warmup"), o.schedule.warmup_steps);
  v(Key("optim.schedule.min_lr", "LR at the end of the decay"), o.schedule.min_lr);

  auto& f = c.fsdp;
  v(Key("fsdp.sharding_strategy", "FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD"), f.sharding_strategy);
  v(Key("fsdp.shard_group_size", "HYBRID_SHARD: ranks per shard group (0 = ranks per host)"), f.shard_group_size);
  v(Key("fsdp.auto_wrap.policy", "size_based | transformer | none"), f.auto_wrap.policy);
  v(Key("fsdp.auto_wrap.min_num_params", "size_based: threshold for a subtree to become a unit"),
    f.auto_wrap.min_num_params);
  v(Key("fsdp.auto_wrap.module_types", "transformer: module type names that become units"), f.auto_wrap.module_types);
  v(Key("fsdp.mixed_precision.param_dtype", "dtype of gathered weights and activations"),
    f.mixed_precision.param_dtype);
  v(Key("fsdp.mixed_precision.reduce_dtype", "dtype gradients travel in"), f.mixed_precision.reduce_dtype);
  v(Key("fsdp.activation_checkpointing.mode", "none | full (every decoder layer) | every_n"),
    f.activation_checkpointing.mode);
  v(Key("fsdp.activation_checkpointing.n", "every_n: recompute every n-th decoder layer"),
    f.activation_checkpointing.n);
  v(Key("fsdp.activation_checkpointing.module_types",
        "module type names that are recomputed (full: all of them; every_n: every n-th)"),
    f.activation_checkpointing.module_types);
  v(Key("fsdp.forward_prefetch", "gather unit k+1 before unit k computes"), f.forward_prefetch);
  v(Key("fsdp.limit_all_gathers", "at most two gathered units in flight"), f.limit_all_gathers);

  auto& k = c.checkpoint;
  v(Key("checkpoint.dir", "where checkpoints go; empty disables saving"), k.dir);
  v(Key("checkpoint.interval", "save every N steps; 0 = only at the end of the run"), k.interval);
  v(Key("checkpoint.format", "unified (HF safetensors) | sharded (one file per rank)"), k.format);
  v(Key("checkpoint.async", "write in a background thread while training goes on"), k.async);
  v(Key("checkpoint.keep_last", "keep the newest N checkpoints; 0 keeps all"), k.keep_last);
  v(Key("checkpoint.verify", "verify checksums on load"), k.verify);
  v(Key("checkpoint.init_from", "start from these model weights (HF directory or checkpoint), fresh optimizer"),
    k.init_from);
  v(Key("checkpoint.unified_checkpoint_config",
        "skip_save_model_weight | master_weight_compatible | enable_all_options", kUnifiedOptions),
    k.unified_checkpoint_config);
  v(Key("checkpoint.strict",
        "refuse a checkpoint holding tensors the model lacks or whose config.json differs from model.*; false warns"),
    k.strict);

  v(Key("comm.timeout_s", "abort the job when a collective makes no progress for this long; 0 disables the watchdog"),
    c.comm.timeout_s);

  auto& l = c.logging;
  v(Key("logging.interval", "print a step line every N steps"), l.interval);
  v(Key("logging.metrics_file", "append one JSON object per logged step; empty disables"), l.metrics_file);
  v(Key("logging.level", "debug | info | warn | error", kLogLevels), l.level);
  v(Key("logging.profile",
        "print where each step's time went (phases, GEMM, ops, collective waits) and a summary table at the end; "
        "same as --profile"),
    l.profile);
}

std::vector<std::string_view> schema_keys() {
  std::vector<std::string_view> keys;
  const Config c;
  visit_schema(c, [&](const Key& k, const auto&) { keys.push_back(k.key); });
  return keys;
}

bool is_key(std::string_view path) {
  const auto keys = schema_keys();
  return std::find(keys.begin(), keys.end(), path) != keys.end();
}

/// Names one level below `prefix` ("" is the top level), in schema order.
std::vector<std::string> children_of(std::string_view prefix) {
  std::vector<std::string> out;
  for (std::string_view key : schema_keys()) {
    if (!prefix.empty()) {
      if (key.size() <= prefix.size() || !key.starts_with(prefix) || key[prefix.size()] != '.') continue;
      key.remove_prefix(prefix.size() + 1);
    }
    std::string name(key.substr(0, key.find('.')));
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(std::move(name));
  }
  return out;
}

bool is_section(std::string_view path) { return !is_key(path) && !children_of(path).empty(); }

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
std::string did_you_mean(std::string_view given, const Range& candidates) {
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
std::string join(const Range& items, std::string_view sep) {
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

// Each field type's YAML text; also the display form of values in errors.
std::string yaml_text(int64_t v) { return std::to_string(v); }
std::string yaml_text(uint64_t v) { return std::to_string(v); }
std::string yaml_text(double v) { return format_float(v); }
std::string yaml_text(bool v) { return v ? "true" : "false"; }
std::string yaml_text(const std::string& v) { return quote_string(v); }
std::string yaml_text(const std::vector<std::string>& v) {
  std::vector<std::string> quoted;
  for (const auto& s : v) quoted.push_back(quote_string(s));
  std::string out = "[";  // appended, not "[" + ...: GCC 12 raises a false -Wrestrict on the latter
  out += join(quoted, ", ");
  out += ']';
  return out;
}
template <ConfigEnum E>
std::string yaml_text(E v) {
  return std::string(enum_name(v));
}

// Each field type's name in config_keys().
std::string type_name(int64_t, const Key&) { return "int"; }
std::string type_name(uint64_t, const Key&) { return "int"; }
std::string type_name(double, const Key&) { return "float"; }
std::string type_name(bool, const Key&) { return "bool"; }
std::string type_name(const std::string&, const Key& k) {
  return k.choices.empty() ? "string" : join(k.choices, " | ");
}
std::string type_name(const std::vector<std::string>&, const Key&) { return "list of strings"; }
template <ConfigEnum E>
std::string type_name(E v, const Key&) {
  std::vector<std::string_view> names;
  for (const auto& n : names_of(v)) names.push_back(n.name);
  return join(names, " | ");
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

void assign(int64_t& field, const YAML::Node& n, const Key& k, const Where& w) {
  const auto v = is_plain(n) ? parse_integer<int64_t>(n.Scalar()) : std::nullopt;
  if (!v) bad_value(k, w, n, "an integer");
  field = *v;
}

void assign(uint64_t& field, const YAML::Node& n, const Key& k, const Where& w) {
  const auto v = is_plain(n) ? parse_integer<uint64_t>(n.Scalar()) : std::nullopt;
  if (!v) bad_value(k, w, n, "a non-negative integer");
  field = *v;
}

void assign(double& field, const YAML::Node& n, const Key& k, const Where& w) {
  const auto v = is_plain(n) ? parse_float(n.Scalar()) : std::nullopt;
  if (!v) bad_value(k, w, n, "a number");
  field = *v;
}

void assign(bool& field, const YAML::Node& n, const Key& k, const Where& w) {
  const auto v = is_plain(n) ? parse_bool(n.Scalar()) : std::nullopt;
  if (!v) bad_value(k, w, n, "true or false");
  field = *v;
}

void check_choice(const std::string& value, const YAML::Node& n, const Key& k, const Where& w) {
  if (k.choices.empty() || std::find(k.choices.begin(), k.choices.end(), value) != k.choices.end()) return;
  ST_FAIL("bad value for '{}' {}: got {}, expected one of {}{}", k.key, w.text, describe(n), join(k.choices, " | "),
          did_you_mean(value, k.choices));
}

void assign(std::string& field, const YAML::Node& n, const Key& k, const Where& w) {
  // An empty value is the empty string: "dir:" reads as "no directory".
  std::string v;
  if (n.IsScalar()) {
    v = n.Scalar();
  } else if (!n.IsNull()) {
    bad_value(k, w, n, "a string");
  }
  check_choice(v, n, k, w);
  field = std::move(v);
}

void assign(std::vector<std::string>& field, const YAML::Node& n, const Key& k, const Where& w) {
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
  field = std::move(v);
}

template <ConfigEnum E>
void assign(E& field, const YAML::Node& n, const Key& k, const Where& w) {
  std::vector<std::string_view> names;
  for (const auto& named : names_of(field)) {
    if (n.IsScalar() && n.Scalar() == named.name) {
      field = named.value;
      return;
    }
    names.push_back(named.name);
  }
  ST_FAIL("bad value for '{}' {}: got {}, expected one of {}{}", k.key, w.text, describe(n), join(names, " | "),
          n.IsScalar() ? did_you_mean(n.Scalar(), names) : std::string());
}

/// Assigns `n` to the field named `key`; false when no field has that name.
bool set_field(Config& c, std::string_view key, const YAML::Node& n, const Where& w) {
  bool found = false;
  visit_schema(c, [&](const Key& k, auto& field) {
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

void load_map(Config& c, const YAML::Node& map, const std::string& prefix, std::string_view source) {
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

    if (set_field(c, path, value, where)) continue;
    if (is_section(path)) {
      if (value.IsNull()) continue;  // "optim:" with nothing under it keeps the defaults
      ST_CHECK(value.IsMap(), "bad value for '{}' {}: got {}, expected a map of its keys ({})", path, where.text,
               describe(value), join(children_of(path), ", "));
      load_map(c, value, path, source);
      continue;
    }
    ST_FAIL("unknown key '{}' {}{}", path, where.text, did_you_mean(name, children_of(prefix)));
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

std::string_view to_string(DeviceKind v) { return enum_name(v); }
std::string_view to_string(DataKind v) { return enum_name(v); }
std::string_view to_string(TokenDType v) { return enum_name(v); }
std::string_view to_string(OptimizerKind v) { return enum_name(v); }
std::string_view to_string(ScheduleKind v) { return enum_name(v); }
std::string_view to_string(ShardingStrategy v) { return enum_name(v); }
std::string_view to_string(WrapPolicy v) { return enum_name(v); }
std::string_view to_string(PrecisionKind v) { return enum_name(v); }
std::string_view to_string(RecomputeMode v) { return enum_name(v); }
std::string_view to_string(CheckpointFormat v) { return enum_name(v); }

std::vector<ConfigKeyDoc> config_keys() {
  std::vector<ConfigKeyDoc> out;
  const Config defaults;
  visit_schema(defaults, [&](const Key& k, const auto& field) {
    out.push_back({std::string(k.key), type_name(field, k), yaml_text(field), std::string(k.doc)});
  });
  return out;
}

void apply_override(Config& config, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  ST_CHECK(eq != std::string_view::npos, "--set '{}' has no '='; expected key=value, e.g. --set train.steps=100",
           assignment);
  const std::string key(trim(assignment.substr(0, eq)));
  const std::string value(assignment.substr(eq + 1));
  ST_CHECK(!key.empty(), "--set '{}' has no key before '='; expected key=value, e.g. --set train.steps=100",
           assignment);
  if (!is_key(key)) {
    if (is_section(key)) {
      ST_FAIL("'{}' in --set is a section, not a key; set one of its keys ({}), e.g. --set {}.{}=...", key,
              join(children_of(key), ", "), key, children_of(key).front());
    }
    ST_FAIL("unknown key '{}' in --set{}", key, did_you_mean(key, schema_keys()));
  }
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    ST_FAIL("bad value for '{}' in --set: '{}' is not a YAML value ({})", key, value, e.msg);
  }
  set_field(config, key, node, Where{"in --set"});
}

Config load_config_from_string(std::string_view yaml, std::string_view source_name,
                               std::span<const std::string> overrides) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(std::string(yaml));
  } catch (const YAML::ParserException& e) {
    ST_FAIL("YAML syntax error at {}:{}:{}: {}", source_name, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  ST_CHECK(docs.size() <= 1, "{} holds {} YAML documents (separated by '---'); expected one", source_name, docs.size());

  Config config;
  if (!docs.empty() && !docs[0].IsNull()) {
    const YAML::Node& root = docs[0];
    ST_CHECK(root.IsMap(), "expected a map of sections ({}) at the top level of {}, got {}",
             join(children_of(""), ", "), source_name, describe(root));
    load_map(config, root, "", source_name);
  }
  for (const std::string& o : overrides) apply_override(config, o);
  config.validate();
  return config;
}

Config load_config(const std::string& path, std::span<const std::string> overrides) {
  // A directory opens as a stream on Linux and reads as empty, which would
  // silently train the defaults; so would a FIFO block. Only a regular file will do.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  ST_CHECK(!ec && std::filesystem::exists(status), "cannot open config file '{}'", path);
  ST_CHECK(!std::filesystem::is_directory(status),
           "config file '{}' is a directory; pass a YAML file, e.g. --config configs/llama-tiny.yaml", path);
  ST_CHECK(std::filesystem::is_regular_file(status), "config file '{}' is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  ST_CHECK(in.good(), "cannot open config file '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  ST_CHECK(!in.bad(), "cannot read config file '{}'", path);
  // A file with no settings is a mistake (a wrong path, a truncated copy), not a request for the defaults.
  bool has_content = false;
  std::istringstream lines(text.str());
  for (std::string line; !has_content && std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    has_content = first != std::string::npos && line[first] != '#' && line.compare(first, 3, "---") != 0;
  }
  ST_CHECK(has_content, "config file '{}' is empty (no settings, only blank lines or comments)", path);
  // Errors name the path as the user gave it, so it can be pasted back.
  return load_config_from_string(text.str(), path, overrides);
}

std::string to_yaml(const Config& config) {
  std::string out;
  std::vector<std::string_view> open;  // the section path of the previous key
  visit_schema(config, [&](const Key& k, const auto& field) {
    std::vector<std::string_view> parts;
    for (std::string_view rest = k.key;;) {
      const size_t dot = rest.find('.');
      parts.push_back(rest.substr(0, dot));
      if (dot == std::string_view::npos) break;
      rest.remove_prefix(dot + 1);
    }
    const std::string_view leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i < parts.size(); ++i) {
      out += std::string(2 * i, ' ') + std::string(parts[i]) + ":\n";
      open.push_back(parts[i]);
    }
    out += std::string(2 * parts.size(), ' ') + std::string(leaf) + ": " + yaml_text(field) + "\n";
  });
  return out;
}

// ---------------------------------------------------------------------------
// Validation: ranges and cross-field rules the per-field parsers cannot see.
// Every message reads "invalid value V for 'key': expected ...". Checks that
// need the world size (batch split over ranks, shard groups) live in the trainer.

namespace {

template <class T>
void require(bool ok, std::string_view key, const T& value, std::string_view expected) {
  ST_CHECK(ok, "invalid value {} for '{}': expected {}", yaml_text(value), key, expected);
}

// The model and the optimizer compute in F32, so a value that does not survive
// the cast to F32 (1e39 becomes Inf) is never meaningful.
bool fits_f32(double v) { return std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max(); }

bool in_choices(std::string_view v, std::span<const std::string_view> choices) {
  return std::find(choices.begin(), choices.end(), v) != choices.end();
}

}  // namespace

void Config::validate() const {
  const auto& m = model;
  require(in_choices(m.name, kModelNames), "model.name", m.name,
          format("one of {}{}", join(kModelNames, " | "), did_you_mean(m.name, kModelNames)));
  // The toy model has fixed shapes; the dimensions below only describe llama.
  if (m.name == "llama") {
    require(m.vocab_size > 0, "model.vocab_size", m.vocab_size, "a positive integer");
    require(m.hidden_size > 0, "model.hidden_size", m.hidden_size, "a positive integer");
    require(m.intermediate_size > 0, "model.intermediate_size", m.intermediate_size, "a positive integer");
    require(m.num_hidden_layers > 0, "model.num_hidden_layers", m.num_hidden_layers, "a positive integer");
    require(m.num_attention_heads > 0, "model.num_attention_heads", m.num_attention_heads, "a positive integer");
    require(m.num_key_value_heads > 0, "model.num_key_value_heads", m.num_key_value_heads, "a positive integer");
    require(m.hidden_size % m.num_attention_heads == 0, "model.hidden_size", m.hidden_size,
            format("a multiple of model.num_attention_heads ({})", m.num_attention_heads));
    require(m.num_attention_heads % m.num_key_value_heads == 0, "model.num_key_value_heads", m.num_key_value_heads,
            format("a divisor of model.num_attention_heads ({})", m.num_attention_heads));
    const int64_t head_dim = m.hidden_size / m.num_attention_heads;
    // Rotary embeddings rotate pairs of channels within a head.
    require(head_dim % 2 == 0, "model.hidden_size", m.hidden_size,
            format("an even head_dim = hidden_size / num_attention_heads for rotary embeddings (got {} / {} = {})",
                   m.hidden_size, m.num_attention_heads, head_dim));
    require(m.max_position_embeddings > 0, "model.max_position_embeddings", m.max_position_embeddings,
            "a positive integer");
    require(m.rope_theta > 0 && fits_f32(m.rope_theta), "model.rope_theta", m.rope_theta,
            "a positive number within F32 range");
    require(m.rms_norm_eps >= std::numeric_limits<float>::min() && m.rms_norm_eps < 1, "model.rms_norm_eps",
            m.rms_norm_eps, "a number in [1.2e-38, 1)");
    require(m.init_std > 0 && m.init_std <= 10, "model.init_std", m.init_std, "a number in (0, 10]");
    require(train.seq_len <= m.max_position_embeddings, "train.seq_len", train.seq_len,
            format("at most model.max_position_embeddings ({})", m.max_position_embeddings));
  }

  const auto& t = train;
  require(t.steps > 0, "train.steps", t.steps, "a positive integer");
  require(t.threads >= 0 && t.threads <= 4096, "train.threads", t.threads, "0 (automatic) or a thread count <= 4096");
  require(t.global_batch_size > 0, "train.global_batch_size", t.global_batch_size, "a positive integer");
  require(t.micro_batch_size > 0, "train.micro_batch_size", t.micro_batch_size, "a positive integer");
  require(t.global_batch_size % t.micro_batch_size == 0, "train.micro_batch_size", t.micro_batch_size,
          format("a divisor of train.global_batch_size ({})", t.global_batch_size));
  require(t.seq_len > 0, "train.seq_len", t.seq_len, "a positive integer");

  require(data.kind == DataKind::Synthetic || !data.path.empty(), "data.path", data.path,
          format("a file or directory (required when data.kind is {})", to_string(data.kind)));

  const auto& o = optim;
  // Above 10 every model diverges in its first steps; the bound catches a
  // mistyped exponent (3e4 for 3e-4) before it costs a run.
  require(o.lr > 0 && o.lr <= 10, "optim.lr", o.lr, "a number in (0, 10]");
  require(o.weight_decay >= 0 && o.weight_decay <= 10, "optim.weight_decay", o.weight_decay, "a number in [0, 10]");
  require(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1", o.beta1, "a number in [0, 1)");
  require(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2", o.beta2, "a number in [0, 1)");
  require(o.eps >= std::numeric_limits<float>::min() && o.eps < 1, "optim.eps", o.eps,
          "a number in [1.2e-38, 1) (smaller is 0 in F32)");
  require(o.momentum >= 0 && o.momentum < 1, "optim.momentum", o.momentum, "a number in [0, 1)");
  require(o.grad_clip >= 0 && fits_f32(o.grad_clip), "optim.grad_clip", o.grad_clip,
          "a non-negative number within F32 range (0 disables clipping)");
  // More warmup steps than train.steps is allowed here: `--steps 1` on a
  // shipped config must run; the trainer clamps the warmup and says so.
  require(o.schedule.warmup_steps >= 0, "optim.schedule.warmup_steps", o.schedule.warmup_steps,
          "a non-negative integer");
  require(o.schedule.min_lr >= 0 && o.schedule.min_lr <= o.lr, "optim.schedule.min_lr", o.schedule.min_lr,
          format("a number from 0 to optim.lr ({})", yaml_text(o.lr)));

  const auto& f = fsdp;
  require(f.shard_group_size >= 0, "fsdp.shard_group_size", f.shard_group_size,
          "a non-negative integer (0 = ranks per host)");
  require(f.auto_wrap.min_num_params >= 0, "fsdp.auto_wrap.min_num_params", f.auto_wrap.min_num_params,
          "a non-negative integer");
  require(f.auto_wrap.policy != WrapPolicy::Transformer || !f.auto_wrap.module_types.empty(),
          "fsdp.auto_wrap.module_types", f.auto_wrap.module_types,
          "at least one module type name when fsdp.auto_wrap.policy is transformer, e.g. [DecoderLayer]");
  require(f.activation_checkpointing.n >= 1, "fsdp.activation_checkpointing.n", f.activation_checkpointing.n,
          "a positive integer");

  const auto& k = checkpoint;
  require(k.interval >= 0, "checkpoint.interval", k.interval, "a non-negative integer (0 = only at the end)");
  require(k.keep_last >= 0, "checkpoint.keep_last", k.keep_last, "a non-negative integer (0 keeps all)");
  for (const std::string& option : k.unified_checkpoint_config) {
    require(in_choices(option, kUnifiedOptions), "checkpoint.unified_checkpoint_config", option,
            format("entries from {}{}", join(kUnifiedOptions, " | "), did_you_mean(option, kUnifiedOptions)));
    // The sharded layout writes no model weights at all, so skipping them means nothing there.
    require(option != "skip_save_model_weight" || k.format == CheckpointFormat::Unified,
            "checkpoint.unified_checkpoint_config", option,
            "no skip_save_model_weight with checkpoint.format: sharded (that layout stores only master weights "
            "and optimizer state already)");
  }

  require(comm.timeout_s >= 0 && comm.timeout_s <= 1e7, "comm.timeout_s", comm.timeout_s,
          "a number of seconds in [0, 1e7] (0 disables the watchdog)");

  require(logging.interval >= 1, "logging.interval", logging.interval, "a positive integer");
  require(in_choices(logging.level, kLogLevels), "logging.level", logging.level,
          format("one of {}{}", join(kLogLevels, " | "), did_you_mean(logging.level, kLogLevels)));
}

}  // namespace st
