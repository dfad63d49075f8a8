// trainer: the shardtrain entry point.
//
//   trainer --config FILE [--set key=value]... [--steps N] [--print-config]
//   mpirun -np 4 trainer --config configs/llama-tiny.yaml
//
// run_main (core/cli.h) catches what reaches main: one line naming the
// problem, a non-zero exit.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/cli.h"
#include "core/comm.h"
#include "core/cpu/parallel.h"
#include "core/cuda/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/watchdog.h"
#include "launch/cli.h"
#include "launch/config.h"
#include "launch/self_check.h"
#include "launch/trainer.h"

namespace {

// The run's first line: the config, its overrides, the world and the GPUs.
// A CPU run does not ask for GPUs: that would start the CUDA runtime and load
// the driver, which a CPU run never needs.
void log_start(const st::launch::TrainerArgs& args, const st::Config& config, st::ProcessGroup& world,
               st::Logger& log) {
  std::string overrides;
  for (const std::string& o : args.overrides) overrides += (overrides.empty() ? "" : ", ") + o;
  const std::string gpus = config.train.device == st::DeviceKind::Cpu
                               ? std::string("train.device: cpu")
                               : st::format("{} GPU(s) visible", st::cuda::device_count());
  log.info0("shardtrain: config {}{} | {} rank(s) ({} backend) | {}, CUDA {}", args.config_path,
            overrides.empty() ? std::string(" (no overrides)") : " with " + overrides, world.size(),
            world.backend_name(), gpus, st::cuda::compiled_with_cuda() ? "built in" : "not built");
}

// Prints `text` on stdout from rank 0 of the job only: mpirun gives every
// rank the same arguments, so --help and the like would print once per rank.
int print_once(const std::string& text, bool rank0) {
  if (rank0) std::fputs(text.c_str(), stdout);
  return 0;
}

int run(const std::vector<std::string>& argv) {
  // First of all: a stop signal at any later moment (here, in MPI's start,
  // while the model is built) asks for a clean stop instead of killing the rank.
  const st::launch::StopSignals stop_signals;
  // Rank 0 by the launcher's environment (no MPI yet): it alone prints what
  // every rank would print alike, a usage error included.
  const bool rank0 = st::agreed_errors_of_job().reporter();
  st::launch::TrainerArgs args;
  try {
    args = st::launch::parse_trainer_args(argv);
  } catch (const st::cli::UsageError&) {
    if (!rank0) return 0;
    throw;
  }
  if (args.help) return print_once(st::launch::trainer_usage(), rank0);
  if (args.list_keys) return print_once(st::launch::config_keys_markdown(), rank0);
  // A torchrun or plain Slurm environment of several processes without MPI
  // would split the job into independent runs: refused before anything else.
  st::detect_world();
  // Loading the config first means a bad file fails before MPI starts. Every
  // rank loads the same file, so every rank fails alike: rank 0 reports it.
  st::Config config;
  try {
    config = st::load_config(args.config_path, args.overrides);
  } catch (const st::Error& e) {
    throw st::AgreedError(e.message(), __FILE__, __LINE__);
  }
  if (args.print_config) return print_once(st::to_yaml(config), rank0);

  st::launch::hold_for_stop_for_test("start-up", 0);
  st::CommRuntime comm;
  st::ProcessGroup& world = comm.world();
  st::Logger log(world.rank(), world.size(),
                 st::parse_log_level(args.log_level.empty() ? config.logging.level : args.log_level));
  const st::WorldInfo& info = comm.info();
  log_start(args, config, world, log);
  log.debug("local rank {}/{}", info.local_rank, info.local_size);
  // No collective waits forever: a frozen or dead rank aborts the job after comm.timeout_s.
  std::optional<st::Watchdog> watchdog;
  if (world.size() > 1 && world.backend_name() == "mpi" && config.comm.timeout_s > 0) {
    watchdog.emplace(config.comm.timeout_s, log);
    world.set_watchdog(&*watchdog);
  }
  if (args.self_check) {
    st::launch::SelfCheckReport report = st::launch::run_self_check(world, log, int64_t{16} << 20);
    if (!report.passed()) {
      log.error("collective self-check FAILED (see the table above)");
      return 1;
    }
    log.info0("collective self-check passed: {} checks, 0 wrong elements", report.checks.size());
    return 0;
  }
  st::ScheduleConfig& schedule = config.optim.schedule;
  if (schedule.warmup_steps > config.train.steps) {
    log.warn0("optim.schedule.warmup_steps {} is longer than the run (train.steps {}); warming up over all {} steps",
              schedule.warmup_steps, config.train.steps, config.train.steps);
    schedule.warmup_steps = config.train.steps;
  }
  st::launch::train(config, world, log, info.local_size,
                    {args.stop_after, args.resume, info.local_rank, args.overwrite});
  return 0;
}

}  // namespace

// OpenMP threads spin only briefly while they wait (core/cpu/parallel.h).
ST_SHORT_OPENMP_SPIN();

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  // A bad config fails on every rank alike: rank 0 reports it (see agreed_errors_of_job).
  return st::run_main(
      "trainer", [&] { return run(args); }, st::agreed_errors_of_job());
}
