// The run configuration: the launcher's own sections and the whole file.
#include "launch/config.h"

#include <filesystem>

#include "models/model.h"

namespace st {

namespace {

constexpr Named<DeviceKind> kDeviceNames[] = {
    {DeviceKind::Cpu, "cpu"}, {DeviceKind::Cuda, "cuda"}, {DeviceKind::Auto, "auto"}};
constexpr std::string_view kLogLevels[] = {"debug", "info", "warn", "error"};

// Upper bounds on sizes no real run comes near (the largest published models
// have ~100 layers, widths of ~16k to ~50k, vocabularies of ~256k). They keep
// every size derived from the config (parameter counts, the memory plan,
// batch buffers) far inside int64, so an absurd value is an error naming its
// key at load time, never a start-up that allocates until memory runs out.
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 20;   // sequences per optimizer step
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;        // tokens per sequence (and rotary positions)
constexpr int64_t kMaxLayers = int64_t{1} << 16;        // model.num_hidden_layers
constexpr int64_t kMaxHidden = int64_t{1} << 20;        // model.hidden_size
constexpr int64_t kMaxIntermediate = int64_t{1} << 22;  // model.intermediate_size
constexpr int64_t kMaxVocab = int64_t{1} << 31;         // model.vocab_size: token ids are int32

// "a positive integer <= 1048576 (larger is not a real run)".
std::string at_most(int64_t max) { return format("a positive integer <= {} (larger is not a real run)", max); }

// The size keys of model.* against the bounds above (models/ checks their shapes and ratios).
void check_model_sizes(const ModelConfig& m) {
  require(m.num_hidden_layers <= kMaxLayers, "model.num_hidden_layers", m.num_hidden_layers, at_most(kMaxLayers));
  require(m.hidden_size <= kMaxHidden, "model.hidden_size", m.hidden_size, at_most(kMaxHidden));
  require(m.intermediate_size <= kMaxIntermediate, "model.intermediate_size", m.intermediate_size,
          at_most(kMaxIntermediate));
  require(m.vocab_size < kMaxVocab, "model.vocab_size", m.vocab_size, at_most(kMaxVocab - 1));
  require(m.max_position_embeddings <= kMaxSeqLen, "model.max_position_embeddings", m.max_position_embeddings,
          at_most(kMaxSeqLen));
}

void visit_train(TrainConfig& t, const KeyVisitor& v) {
  v({"steps", "optimizer steps in the run (the LR schedule follows it)"}, t.steps);
  v({"global_batch_size", "sequences per optimizer step, over all ranks"}, t.global_batch_size);
  v({"micro_batch_size", "sequences per forward/backward on one rank"}, t.micro_batch_size);
  v({"seq_len", "tokens per sequence"}, t.seq_len);
  v({"seed", "seeds init, data order and synthetic data"}, t.seed);
  v({"device", "cpu | cuda | auto (cuda when a GPU is visible)"}, t.device);
  v({"threads", "CPU threads per rank; 0 = the cores this rank may use"}, t.threads);
}

void visit_eval(EvalConfig& e, const KeyVisitor& v) {
  v({"interval", "evaluate every N steps and after the last step; 0 = never"}, e.interval);
  v({"batches", "global batches per evaluation: the first ones of the validation data, in order"}, e.batches);
  v({"sample_tokens", "print a sample of this many tokens generated from sample_prompt at each evaluation; 0 = none"},
    e.sample_tokens);
  v({"sample_prompt", "the sample's prompt, encoded with data.tokenizer (or as bytes)"}, e.sample_prompt);
  v({"sample_temperature", "the sample's temperature (0 = greedy); seeded by train.seed"}, e.sample_temperature);
}

void visit_comm(CommConfig& c, const KeyVisitor& v) {
  v({"timeout_s", "abort the job when a collective makes no progress for this long; 0 disables the watchdog"},
    c.timeout_s);
}

void visit_logging(LoggingConfig& l, const KeyVisitor& v) {
  v({"interval", "print a step line every N steps"}, l.interval);
  v({"metrics_file", "append one JSON object per step (and a line where each run begins); empty disables"},
    l.metrics_file);
  v({"run_name",
     "names the run in logging.plot's title and legend and in the metrics file; empty: checkpoint.dir's last "
     "component, else logging.metrics_file's name without extension"},
    l.run_name);
  v({"level", "debug | info | warn | error", kLogLevels}, l.level);
  v({"profile",
     "print where each step's time went (phases, GEMM, ops, collective waits) and a summary table at the end; "
     "same as --profile"},
    l.profile);
  v({"plot",
     "rank 0 redraws the plot program's four panels into logging.metrics_file + .svg at each evaluation, at the end of "
     "the run and, without evaluations, every checkpoint.interval steps (every 100 logged steps when that is 0)"},
    l.plot);
}

Schema schema_of(Config& c) {
  return [&c](const KeyVisitor& v) { visit_keys(c, v); };
}

}  // namespace

std::span<const Named<DeviceKind>> names_of(DeviceKind) { return kDeviceNames; }

DatasetSpec dataset_spec(const Config& config) {
  return {config.data,          config.model.name, config.model.vocab_size,
          config.train.seq_len, config.train.seed, config.train.global_batch_size};
}

void visit_keys(Config& c, const KeyVisitor& v) {
  visit_keys(c.model, in_section("model", v));
  visit_train(c.train, in_section("train", v));
  visit_keys(c.data, in_section("data", v));
  visit_eval(c.eval, in_section("eval", v));
  visit_keys(c.optim, in_section("optim", v));
  visit_keys(c.fsdp, in_section("fsdp", v));
  visit_keys(c.checkpoint, in_section("checkpoint", v));
  visit_comm(c.comm, in_section("comm", v));
  visit_logging(c.logging, in_section("logging", v));
}

void TrainConfig::validate() const {
  require(steps > 0, "train.steps", steps, "a positive integer");
  require(threads >= 0 && threads <= 4096, "train.threads", threads, "0 (automatic) or a thread count <= 4096");
  require(global_batch_size > 0 && global_batch_size <= kMaxGlobalBatch, "train.global_batch_size", global_batch_size,
          at_most(kMaxGlobalBatch));
  require(micro_batch_size > 0, "train.micro_batch_size", micro_batch_size, "a positive integer");
  require(global_batch_size % micro_batch_size == 0, "train.micro_batch_size", micro_batch_size,
          format("a divisor of train.global_batch_size ({})", global_batch_size));
  require(seq_len > 0 && seq_len <= kMaxSeqLen, "train.seq_len", seq_len, at_most(kMaxSeqLen));
}

void EvalConfig::validate() const {
  require(interval >= 0, "eval.interval", interval, "a number of steps >= 0 (0: never evaluate)");
  require(batches >= 1, "eval.batches", batches, "a positive integer");
  require(sample_tokens >= 0, "eval.sample_tokens", sample_tokens, "a number of tokens >= 0 (0: no sample)");
  require(sample_tokens == 0 || !sample_prompt.empty(), "eval.sample_prompt", sample_prompt,
          "at least one character when eval.sample_tokens is set");
  require(sample_temperature >= 0 && fits_f32(sample_temperature), "eval.sample_temperature", sample_temperature,
          "a number >= 0 (0: greedy)");
}

void CommConfig::validate() const {
  require(timeout_s >= 0 && timeout_s <= 1e7, "comm.timeout_s", timeout_s,
          "a number of seconds in [0, 1e7] (0 disables the watchdog)");
}

void LoggingConfig::validate() const {
  require(interval >= 1, "logging.interval", interval, "a positive integer");
  require(in_choices(level, kLogLevels), "logging.level", level,
          format("one of {}{}", join(kLogLevels, " | "), did_you_mean(level, kLogLevels)));
  require(run_name.find_first_of("\n\r") == std::string::npos, "logging.run_name", run_name, "a name on one line");
  require(!plot || !metrics_file.empty(), "logging.plot", plot,
          "false while logging.metrics_file is empty: the plot is drawn from the metrics file, so set "
          "logging.metrics_file too");
}

void Config::validate() const {
  check_model_sizes(model);
  model.validate();
  models::model_spec(model.name).check_seq_len(model, train.seq_len);
  train.validate();
  data.validate();
  eval.validate();
  ST_CHECK(eval.interval == 0 || data.kind == DataKind::Synthetic || !data.val_path.empty() || data.val_fraction > 0,
           "eval.interval is {} but there is no validation data: set data.val_path (a file or directory like "
           "data.path) or data.val_fraction (hold out the end of data.path), or eval.interval: 0",
           eval.interval);
  optim.validate();
  fsdp.validate();
  checkpoint.validate();
  comm.validate();
  logging.validate();
}

std::string run_name(const Config& config) {
  if (!config.logging.run_name.empty()) return config.logging.run_name;
  if (!config.checkpoint.dir.empty()) {
    // "runs/fortunes/" names "fortunes", as "runs/fortunes" does.
    const std::filesystem::path dir = std::filesystem::path(config.checkpoint.dir).lexically_normal();
    const std::string last = (dir.has_filename() ? dir : dir.parent_path()).filename().string();
    if (!last.empty() && last != "." && last != "..") return last;
  }
  return std::filesystem::path(config.logging.metrics_file).stem().string();
}

std::vector<ConfigKeyDoc> config_keys() {
  Config defaults;
  return config_keys(schema_of(defaults));
}

void apply_override(Config& config, std::string_view assignment) { apply_override(schema_of(config), assignment); }

Config load_config_from_string(std::string_view yaml, std::string_view source_name,
                               std::span<const std::string> overrides) {
  Config config;
  const Schema schema = schema_of(config);
  load_yaml(schema, yaml, source_name);
  for (const std::string& o : overrides) apply_override(schema, o);
  config.validate();
  return config;
}

Config load_config(const std::string& path, std::span<const std::string> overrides) {
  // Errors name the path as the user gave it, so it can be pasted back.
  return load_config_from_string(read_config_file(path), path, overrides);
}

std::string to_yaml(const Config& config) {
  Config copy = config;  // a visit hands out writable fields; to_yaml only reads them
  return to_yaml(schema_of(copy));
}

}  // namespace st
