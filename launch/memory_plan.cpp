#include "launch/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include <sys/resource.h>

#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "models/toy.h"

namespace st::launch {

namespace {

constexpr int64_t kUnknown = -1;

// A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent.
int64_t proc_kb(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(key + ":")) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kb = 0;
    if (fields >> kb) return kb * 1024;
  }
  return kUnknown;
}

// A limit less what is already used, or -1 when unlimited or unknown.
int64_t room(int resource, int64_t used) {
  rlimit limit{};
  if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || used < 0) return kUnknown;
  return std::max<int64_t>(0, static_cast<int64_t>(limit.rlim_cur) - used);
}

// The cgroup (v2) memory.max less memory.current, or -1.
int64_t cgroup_room() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line))
    if (line.starts_with("0::")) path = "/sys/fs/cgroup" + line.substr(3);
  if (path.empty()) return kUnknown;
  int64_t max = 0, current = 0;
  std::ifstream max_file(path + "/memory.max"), current_file(path + "/memory.current");
  if (!(max_file >> max) || !(current_file >> current)) return kUnknown;  // "max": no limit
  return std::max<int64_t>(0, max - current);
}

int64_t least_known(std::initializer_list<int64_t> values) {
  int64_t out = kUnknown;
  for (int64_t v : values)
    if (v >= 0 && (out < 0 || v < out)) out = v;
  return out;
}

std::string tokens_of(const Config& config, int64_t samples) {
  return config.model.name == "toy" ? format("{} samples", samples)
                                    : format("{} x {} tokens", samples, config.train.seq_len);
}

// Bytes of one sample's input and target in the batch buffers (token ids, or the toy model's features).
int64_t sample_bytes(const Config& config) {
  return config.model.name == "toy" ? (models::Toy::kIn + models::Toy::kOut) * 4 : 2 * config.train.seq_len * 4;
}

// The micro-batch sizes that keep train.global_batch_size divisible at this world size, largest first.
std::vector<int64_t> micro_batch_choices(const Config& config, int world) {
  std::vector<int64_t> out;
  const int64_t per_rank = config.train.global_batch_size / world;
  for (int64_t m = per_rank; m >= 1; --m)
    if (per_rank % m == 0) out.push_back(m);
  return out;
}

// The largest scratch the CPU GEMM takes in a LLaMA step at micro-batch
// train.micro_batch_size: the products of the LM head (the widest) and of
// the MLP, forward and both backward products (the scratch depends on the
// tokens only through its blocks, so the micro-batch barely moves it).
int64_t gemm_scratch(const Config& config) {
  if (config.train.device == DeviceKind::Cuda || config.model.name != "llama") return 0;
  const DType dt = config.fsdp.mixed_precision.param_dtype;
  const int64_t tokens = config.train.micro_batch_size * config.train.seq_len;
  const ModelConfig& m = config.model;
  int64_t most = 0;
  for (const int64_t width : {m.vocab_size, m.intermediate_size}) {
    const int64_t d = m.hidden_size;
    for (const auto& [rows, cols, depth] : {std::tuple{tokens, width, d}, {tokens, d, width}, {width, d, tokens}})
      most = std::max(most, cpu::gemm_scratch_bytes(rows, cols, depth, dt, dt, dt));
  }
  return most;
}

// Estimates are summed in double and kept below 1e18 bytes (an exabyte,
// absurd already), so that a few of them added up stay inside int64 whatever
// sizes the config names.
constexpr double kMaxEstimate = 1e18;
int64_t clamped(double bytes) { return static_cast<int64_t>(std::min(bytes, kMaxEstimate)); }

// The least room of any rank (-1 when no rank knows its limit), so that every rank decides alike.
int64_t least_available(ProcessGroup& world, int64_t available) {
  Tensor least = Tensor::full({1}, available < 0 ? -std::numeric_limits<float>::max() : -static_cast<double>(available),
                              DType::F32);
  world.all_reduce(least, {ReduceOp::Max}).wait();
  const double room = -static_cast<double>(least.data<float>()[0]);
  return room >= std::numeric_limits<float>::max() / 2 ? kUnknown : static_cast<int64_t>(room);
}

}  // namespace

int64_t MemoryPlan::activation_bytes(int64_t samples, int64_t recomputed) const {
  const models::ModelActivations& a = per_sample;
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const int64_t kept = a.layers - recomputed;
  // A recomputed layer keeps its input; during backward one layer at a time holds all of its activations again.
  const double compute =
      d(kept) * d(a.layer_elements) + d(recomputed) * d(a.layer_input) + (recomputed > 0 ? d(a.layer_elements) : 0.0);
  return clamped(d(samples) * (compute * d(compute_bytes) + (d(a.layers) * d(a.layer_f32) + d(a.outside_f32)) * 4));
}

int64_t MemoryPlan::step_bytes(int64_t samples) const {
  return activation_bytes(samples, recomputed_layers) + gathered_bytes + gemm_scratch_bytes;
}

MemoryPlan plan_memory(const Config& config, const fsdp::MemoryReport& report, int64_t recomputed_layers) {
  MemoryPlan plan;
  plan.per_sample = models::model_spec(config.model.name).activations(config.model, config.train.seq_len);
  plan.compute_bytes = static_cast<int64_t>(dtype_size(config.fsdp.mixed_precision.param_dtype));
  plan.gathered_bytes = 3 * report.largest_gathered_bytes;
  plan.recomputed_layers = recomputed_layers;
  plan.gemm_scratch_bytes = gemm_scratch(config);
  return plan;
}

int64_t available_bytes(int local_ranks) {
  const int64_t share = std::max(1, local_ranks);
  const int64_t host = proc_kb("/proc/meminfo", "MemAvailable");
  const int64_t cgroup = cgroup_room();
  return least_known({room(RLIMIT_AS, proc_kb("/proc/self/status", "VmSize")),
                      room(RLIMIT_DATA, proc_kb("/proc/self/status", "VmData")), cgroup < 0 ? cgroup : cgroup / share,
                      host < 0 ? host : host / share});
}

std::string memory_line(const Config& config, const MemoryPlan& plan, int64_t available) {
  const int64_t mb = config.train.micro_batch_size;
  const int64_t layers = plan.per_sample.layers;
  std::string line = format("activations per micro-batch of {}: {} without recomputation", tokens_of(config, mb),
                            human_bytes(plan.activation_bytes(mb, 0)));
  if (layers > 0) line += format(", {} with every layer recomputed", human_bytes(plan.activation_bytes(mb, layers)));
  line += format("; a step adds about {} per rank ({} of {} layers recomputed)", human_bytes(plan.step_bytes(mb)),
                 plan.recomputed_layers, layers);
  return line + (available < 0 ? "" : format(", {} available", human_bytes(available)));
}

void check_memory_fits(const Config& config, const MemoryPlan& plan, ProcessGroup& world, int64_t available) {
  // Test hook: tests/e2e/check_faults.py's memory check lets a step run out
  // of memory for real, to see the error it ends with. Runs never set it.
  if (std::getenv("ST_TEST_SKIP_MEMORY_CHECK") != nullptr) return;
  const int64_t room = least_available(world, available);
  const int64_t mb = config.train.micro_batch_size;
  if (room < 0 || plan.step_bytes(mb) <= room) return;
  std::string fix = "no micro-batch fits: lower train.seq_len or use more ranks (FULL_SHARD spreads the state)";
  for (int64_t m : micro_batch_choices(config, world.size())) {
    if (plan.step_bytes(m) > room) continue;
    fix = format("train.micro_batch_size {} fits (about {})", m, human_bytes(plan.step_bytes(m)));
    break;
  }
  const int64_t layers = plan.per_sample.layers;
  if (plan.recomputed_layers < layers && plan.activation_bytes(mb, layers) + plan.gathered_bytes <= room)
    fix += "; or keep it and recompute every layer (fsdp.activation_checkpointing.mode: full)";
  const std::string recomputed =
      layers == 0 ? "" : format(", {} with every layer recomputed", human_bytes(plan.activation_bytes(mb, layers)));
  throw AgreedError(format("train.micro_batch_size {} does not fit: a step would add about {} per rank (activations "
                           "of {}: {} without recomputation{}), but a rank has {} available; {}",
                           mb, human_bytes(plan.step_bytes(mb)), tokens_of(config, mb),
                           human_bytes(plan.activation_bytes(mb, 0)), recomputed, human_bytes(room), fix),
                    __FILE__, __LINE__);
}

int64_t shard_ranks(const Config& config, int world_size, int local_size) {
  switch (config.fsdp.sharding_strategy) {
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp: return world_size;
    case ShardingStrategy::NoShard: return 1;
    case ShardingStrategy::HybridShard: break;
  }
  const int64_t g = config.fsdp.shard_group_size;
  if (g == 0) return std::max(1, local_size);  // per host: fsdp checks that every host has as many ranks
  // Every rank has the same config and world size, so every rank fails alike: one line for the job.
  if (world_size % g != 0)
    throw AgreedError(format("fsdp.shard_group_size ({}) must divide the world size ({})", g, world_size), __FILE__,
                      __LINE__);
  return g;
}

StatePlan plan_state(const Config& config, int world_size, int64_t shard_ranks) {
  StatePlan s;
  s.params = models::model_flops(config.model, config.train.seq_len).params;
  s.world_size = world_size;
  s.shard_ranks = shard_ranks;
  // Each unit is padded to a multiple of the shard group: less than one element per unit and rank, not counted.
  const double shard = static_cast<double>(s.params) / static_cast<double>(shard_ranks);
  s.master_bytes = clamped(4 * shard);
  s.grad_bytes = clamped(4 * shard);
  s.optimizer_bytes = clamped((config.optim.name == OptimizerKind::AdamW ? 8 : 4) * shard);
  const ShardingStrategy strategy = config.fsdp.sharding_strategy;
  if (strategy == ShardingStrategy::ShardGradOp || strategy == ShardingStrategy::NoShard) {
    const auto param_bytes = static_cast<double>(dtype_size(config.fsdp.mixed_precision.param_dtype));
    s.gathered_bytes = clamped(param_bytes * static_cast<double>(s.params));
  }
  const double samples = static_cast<double>(config.train.global_batch_size / std::max(1, world_size));
  s.batch_bytes = clamped(samples * static_cast<double>(sample_bytes(config)));
  return s;
}

namespace {

// The least a step adds at micro-batch `samples`: its activations with every layer recomputed.
int64_t least_step_bytes(const Config& config, int64_t samples) {
  const MemoryPlan plan = plan_memory(config, fsdp::MemoryReport{}, 0);
  return plan.activation_bytes(samples, plan.per_sample.layers);
}

int64_t startup_bytes(const Config& config, const StatePlan& state) {
  return state.total() + least_step_bytes(config, config.train.micro_batch_size);
}

// "1.1 B parameters on 1 rank: master weights 4.4 GB, ...; a step adds at least ...".
std::string state_parts(const Config& config, const StatePlan& s) {
  std::string out = format(
      "{} parameters sharded over {} rank(s): master weights {}, gradients {}, optimizer state {} "
      "({})",
      with_commas(s.params), s.shard_ranks, human_bytes(s.master_bytes), human_bytes(s.grad_bytes),
      human_bytes(s.optimizer_bytes), to_string(config.optim.name));
  if (s.gathered_bytes > 0)
    out += format(", parameters kept gathered {} ({})", human_bytes(s.gathered_bytes),
                  to_string(config.fsdp.sharding_strategy));
  const int64_t mb = config.train.micro_batch_size;
  return out + format(", batch buffers {}; a step adds at least {} (the activations of {}, every layer recomputed)",
                      human_bytes(s.batch_bytes), human_bytes(least_step_bytes(config, mb)), tokens_of(config, mb));
}

// The fewest ranks FULL_SHARD would need for the run to fit in `room`, or 0 when no number of ranks would.
int64_t ranks_that_fit(const Config& config, const StatePlan& s, int64_t room) {
  const double sharded = static_cast<double>(s.master_bytes + s.grad_bytes + s.optimizer_bytes) *
                         static_cast<double>(s.shard_ranks);  // on one rank
  const double fixed = static_cast<double>(s.batch_bytes + least_step_bytes(config, config.train.micro_batch_size));
  constexpr double kMaxRanks = 65536;
  if (fixed >= static_cast<double>(room)) return 0;
  const double ranks = std::ceil(sharded / (static_cast<double>(room) - fixed));
  return ranks > kMaxRanks ? 0 : std::max<int64_t>(1, static_cast<int64_t>(ranks));
}

// The largest model.num_hidden_layers below the configured one that fits in `room` (0: none).
int64_t layers_that_fit(Config config, const StatePlan& s, int64_t room) {
  int64_t lo = 0, hi = config.model.num_hidden_layers - 1;  // the answer is in [lo, hi]
  while (lo < hi) {
    config.model.num_hidden_layers = (lo + hi + 1) / 2;
    if (startup_bytes(config, plan_state(config, static_cast<int>(s.world_size), s.shard_ranks)) <= room)
      lo = config.model.num_hidden_layers;
    else
      hi = config.model.num_hidden_layers - 1;
  }
  return lo;
}

// The largest micro-batch below the configured one that fits in `room` (0: none).
int64_t micro_batch_that_fits(const Config& config, const StatePlan& s, int64_t room) {
  for (int64_t m : micro_batch_choices(config, static_cast<int>(s.world_size)))
    if (m < config.train.micro_batch_size && s.total() + least_step_bytes(config, m) <= room) return m;
  return 0;
}

// What would fit in `room`, each a change of one setting, e.g. "FULL_SHARD over 4 or more ranks".
std::vector<std::string> state_fixes(const Config& config, const StatePlan& state, int64_t available) {
  // The refusal is certain, but what it offers must really fit: the process
  // also holds what no estimate counts (thread stacks, the libraries' own
  // buffers: about 60 MB for llama-tiny at 2 threads), so the advice keeps a
  // tenth of the room free (20000 layers of llama-tiny under 1200 MiB: 1545
  // offered; 1640 trained there, 1680 did not).
  const auto room = static_cast<int64_t>(0.9 * static_cast<double>(available));
  std::vector<std::string> fits;
  if (const int64_t ranks = ranks_that_fit(config, state, room); ranks > state.shard_ranks)
    fits.push_back(format("FULL_SHARD over {} or more ranks", ranks));
  if (config.model.name != "toy") {
    if (const int64_t layers = layers_that_fit(config, state, room); layers > 0)
      fits.push_back(format("model.num_hidden_layers {} (now {})", layers, config.model.num_hidden_layers));
  }
  if (const int64_t mb = micro_batch_that_fits(config, state, room); mb > 0)
    fits.push_back(format("train.micro_batch_size {} (now {})", mb, config.train.micro_batch_size));
  return fits;
}

}  // namespace

void check_state_fits(const Config& config, const StatePlan& state, ProcessGroup& world, int64_t available) {
  const int64_t room = least_available(world, available);
  const int64_t need = startup_bytes(config, state);
  if (room < 0 || need <= room) return;
  const std::vector<std::string> fits = state_fixes(config, state, room);
  std::string fix = "no single change fits: lower the model's sizes (model.*) or give each rank more memory";
  for (size_t i = 0; i < fits.size(); ++i) fix = (i == 0 ? "what would fit: " : fix + ", or ") + fits[i];
  throw AgreedError(format("the run does not fit in memory: before its first step a rank would hold about {} ({}), "
                           "but a rank has {} available; {}",
                           human_bytes(need), state_parts(config, state), human_bytes(room), fix),
                    __FILE__, __LINE__);
}

void check_startup_memory(const Config& config, Device device, ProcessGroup& world, int local_size) {
  const int64_t g = shard_ranks(config, world.size(), local_size);
  // See check_memory_fits: the fault test lets a run go on to fail for real.
  if (std::getenv("ST_TEST_SKIP_MEMORY_CHECK") != nullptr) return;
  // Every rank takes part in the reduction, a rank on a GPU with "unknown" (its memory is not counted here).
  const int64_t available = device.is_cuda() ? kUnknown : available_bytes(local_size);
  check_state_fits(config, plan_state(config, world.size(), g), world, available);
}

std::string out_of_memory_advice(const Config& config, const MemoryPlan& plan, const std::string& phase, int64_t step) {
  const int64_t mb = config.train.micro_batch_size;
  std::string advice = format(
      "in step {} ({}), with a step estimated at {} per rank; lower train.micro_batch_size "
      "(now {}) or train.seq_len (now {})",
      step, phase, human_bytes(plan.step_bytes(mb)), mb, config.train.seq_len);
  if (plan.recomputed_layers < plan.per_sample.layers)
    advice += ", or recompute every layer (fsdp.activation_checkpointing.mode: full)";
  return advice;
}

}  // namespace st::launch
