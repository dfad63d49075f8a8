// ckpt: look inside, verify and convert checkpoints (issue 5).
//
//   ckpt inspect DIR [--json]
//   ckpt verify DIR
//   ckpt convert DIR --to unified|sharded OUT
//   scripts/launch -np 4 build/ckpt convert DIR --to sharded OUT
//
// Exit codes: 0 success, 1 an error or a failed verification (one line per
// problem on stderr), 2 an internal error. Only main() catches st::Error.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/error.h"
#include "launch/ckpt_tool.h"

namespace {

/// `rank` is set once the process knows it: errors of a multi-process
/// convert are agreed by all ranks, so only rank 0 prints them.
int run(const std::vector<std::string>& argv, int& rank) {
  using st::launch::CkptCommand;
  st::launch::CkptArgs args = st::launch::parse_ckpt_args(argv);
  if (args.help) {
    std::fputs(st::launch::ckpt_usage().c_str(), stdout);
    return 0;
  }
  switch (args.command) {
    case CkptCommand::Inspect: {
      st::launch::Inspection inspection = st::launch::inspect_checkpoint(args.dir);
      if (!inspection.note.empty()) std::fprintf(stderr, "ckpt: %s\n", inspection.note.c_str());
      const std::string text =
          args.json ? st::launch::inspection_json(inspection) : st::launch::inspection_text(inspection);
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    case CkptCommand::Verify: {
      st::launch::VerifyReport report = st::launch::verify_checkpoint(args.dir, args.threads);
      if (!report.note.empty()) std::fprintf(stderr, "ckpt: %s\n", report.note.c_str());
      for (const std::string& problem : report.problems) std::fprintf(stderr, "ckpt: %s\n", problem.c_str());
      std::fprintf(report.ok() ? stdout : stderr, "%s\n", report.summary().c_str());
      return report.ok() ? 0 : 1;
    }
    case CkptCommand::Convert: {
      st::CommRuntime comm;
      rank = comm.world().rank();
      const std::string summary = st::launch::convert_checkpoint(args.dir, args.to, args.out, comm.world());
      if (rank == 0) std::printf("%s\n", summary.c_str());
      return 0;
    }
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int rank = 0;
  try {
    return run(args, rank);
  } catch (const st::AgreedError& e) {
    // Every rank failed alike: rank 0 reports it and fails the job. Another rank
    // exiting non-zero first would make mpirun kill rank 0 before its line got out.
    if (rank != 0) return 0;
    std::fprintf(stderr, "ckpt: error: %s\n", e.message().c_str());
    return 1;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "ckpt: error: %s\n", e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt: internal error: %s\n", e.what());
    return 2;
  }
}
