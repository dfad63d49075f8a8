#include "launch/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <sys/resource.h>

#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"

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

}  // namespace

int64_t MemoryPlan::activation_bytes(int64_t samples, int64_t recomputed) const {
  const models::ModelActivations& a = per_sample;
  const int64_t kept = a.layers - recomputed;
  // A recomputed layer keeps its input; during backward one layer at a time holds all of its activations again.
  const int64_t compute =
      kept * a.layer_elements + recomputed * a.layer_input + (recomputed > 0 ? a.layer_elements : 0);
  return samples * (compute * compute_bytes + (a.layers * a.layer_f32 + a.outside_f32) * 4);
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
  // Every rank takes the least room of any rank, so all decide alike.
  Tensor least = Tensor::full({1}, available < 0 ? -std::numeric_limits<float>::max() : -static_cast<double>(available),
                              DType::F32);
  world.all_reduce(least, {ReduceOp::Max}).wait();
  const double least_available = -static_cast<double>(least.data<float>()[0]);
  const int64_t mb = config.train.micro_batch_size;
  if (least_available >= std::numeric_limits<float>::max() / 2 ||
      static_cast<double>(plan.step_bytes(mb)) <= least_available)
    return;
  const auto room = static_cast<int64_t>(least_available);
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
