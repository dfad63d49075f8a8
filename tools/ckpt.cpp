// ckpt: look inside, verify and convert checkpoints (issue 5). This file is
// the program: its command line and what it prints; the work is in
// checkpoint/tool.h.
//
//   ckpt inspect DIR [--json]
//   ckpt verify DIR [--threads N]
//   ckpt convert DIR --to unified|sharded OUT
//   scripts/launch -np 4 build/ckpt convert DIR --to sharded OUT
//
// Exit codes: 0 success, 1 an error or a failed verification (one line per
// problem on stderr), 2 a usage or internal error (run_main, core/cli.h), or
// no arguments at all (the usage on stderr).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/tool.h"
#include "core/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "models/hf_config.h"

namespace {

using st::checkpoint::Layout;

enum class CkptCommand : uint8_t { Inspect, Verify, Convert };

/// Command line of `ckpt`.
struct CkptArgs {
  bool help = false;                           // --help / -h / help
  CkptCommand command = CkptCommand::Inspect;  // the first argument
  std::string dir;                             // the checkpoint to read
  std::vector<std::string> parts;              // verify: every directory given (hosts' parts of one checkpoint)
  bool json = false;                           // inspect --json
  Layout to = Layout::Unified;                 // convert --to
  std::string out;                             // convert's output directory
  int threads = 4;                             // verify --threads N: files checked at once
};

/// What a command's flags and arguments fill in; `have_to` says whether --to was given.
struct CommandLine {
  CkptArgs& args;
  std::vector<std::string> positional;
  bool have_to = false;
};

/// The flags of one command.
st::cli::Parser command_parser(CkptCommand command, CommandLine& line) {
  CkptArgs& args = line.args;
  switch (command) {
    case CkptCommand::Inspect:
      return std::move(st::cli::Parser("ckpt", "ckpt inspect DIR [--json]")
                           .flag("--json", &args.json, "the same as one JSON object")
                           .positionals("DIR", &line.positional));
    case CkptCommand::Verify:
      return std::move(st::cli::Parser("ckpt", "ckpt verify DIR [DIR2 ...] [--threads N]")
                           .option("--threads", "N", &args.threads, "files checked at once (default 4)", 1, 999)
                           .positionals("DIR", &line.positional));
    case CkptCommand::Convert: break;
  }
  auto to = [&line](const std::string& value) {
    const std::optional<Layout> layout = st::checkpoint::parse_layout(value);
    ST_USAGE_CHECK(layout.has_value(), "--to {}: expected unified or sharded", value);
    line.args.to = *layout;
    line.have_to = true;
  };
  return std::move(st::cli::Parser("ckpt", "ckpt convert DIR --to unified|sharded OUT")
                       .option("--to", "unified|sharded", to, "the layout to write")
                       .positionals("DIR OUT", &line.positional));
}

std::string ckpt_usage() {
  CkptArgs unused;
  CommandLine line{unused, {}, false};
  return "usage: ckpt inspect DIR [--json]\n"
         "       ckpt verify DIR [DIR2 ...] [--threads N]\n"
         "       ckpt convert DIR --to unified|sharded OUT\n"
         "       scripts/launch -np K ckpt convert DIR --to unified|sharded OUT\n\n"
         "  DIR is a checkpoint directory (root/step-NNNNNN) or a checkpoint root (then the checkpoint\n"
         "  `trainer --resume auto` would load: the one `latest` names, or the newest complete one).\n\n"
         "  inspect     format, step, world size at save, and every tensor's kind, shape, dtype and bytes\n" +
         command_parser(CkptCommand::Inspect, line).options_help(2) +
         "  verify      every file the COMPLETE marker lists is present with its size, the index covers\n"
         "              every tensor, and every stored chunk matches its CRC32C; exit 1 naming each problem\n"
         "              several DIRs: the hosts' parts of one checkpoint saved to node-local disks,\n"
         "              each checked against its own COMPLETE marker and all together as one\n" +
         command_parser(CkptCommand::Verify, line).options_help(2) +
         "  convert     rewrite the checkpoint in the other layout into OUT (which must not exist), with\n"
         "              any number of processes; OUT is complete (COMPLETE marker) or absent\n" +
         command_parser(CkptCommand::Convert, line).options_help(2);
}

CkptCommand parse_command(const std::string& word) {
  if (word == "inspect") return CkptCommand::Inspect;
  if (word == "verify") return CkptCommand::Verify;
  if (word == "convert") return CkptCommand::Convert;
  st::cli::usage_error(st::format("unknown command '{}': expected inspect, verify or convert (see --help)", word));
}

/// Parses argv (without the program name; not empty); throws st::cli::UsageError naming the bad argument.
CkptArgs parse_ckpt_args(const std::vector<std::string>& argv) {
  CkptArgs args;
  if (argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
    args.help = true;
    return args;
  }
  const std::string& command = argv[0];
  args.command = parse_command(command);
  CommandLine line{args, {}, false};
  args.help = command_parser(args.command, line).parse({argv.begin() + 1, argv.end()});
  if (args.help) return args;
  const std::vector<std::string>& positional = line.positional;
  if (args.command == CkptCommand::Convert) {
    ST_USAGE_CHECK(line.have_to, "ckpt convert needs --to unified|sharded");
    ST_USAGE_CHECK(positional.size() == 2, "ckpt convert needs DIR and OUT: ckpt convert DIR --to unified|sharded OUT");
    args.dir = positional[0];
    args.out = positional[1];
  } else if (args.command == CkptCommand::Verify) {
    ST_USAGE_CHECK(!positional.empty(),
                   "ckpt verify needs a checkpoint directory (or several: the hosts' parts of one)");
    args.dir = positional[0];
    args.parts = positional;
  } else {
    ST_USAGE_CHECK(positional.size() == 1, "ckpt {} needs exactly one checkpoint directory, got {}", command,
                   positional.size());
    args.dir = positional[0];
  }
  return args;
}

/// convert's rewrite of config.json: its torch_dtype by models/hf_config.h's rule.
st::checkpoint::ConvertOptions convert_options() {
  st::checkpoint::ConvertOptions options;
  options.hf_config_name = std::string(st::models::kHfConfigName);
  options.rewrite_hf_config = [](const std::string& text, st::DType model_dtype, const std::string& path) {
    return st::models::hf_config_with_torch_dtype(text, st::models::hf_torch_dtype(model_dtype), path);
  };
  return options;
}

/// `rank` is set once the process knows it: errors of a multi-process
/// convert are agreed by all ranks, so only rank 0 prints them.
int run(const std::vector<std::string>& argv, int& rank) {
  namespace ckpt = st::checkpoint;
  if (argv.empty()) {
    // No command is a mistake, not a request for help: the usage on stderr, exit 2, as for any usage error.
    std::fputs(ckpt_usage().c_str(), stderr);
    return 2;
  }
  const CkptArgs args = parse_ckpt_args(argv);
  if (args.help) {
    std::fputs(ckpt_usage().c_str(), stdout);
    return 0;
  }
  switch (args.command) {
    case CkptCommand::Inspect: {
      const ckpt::Inspection inspection = ckpt::inspect_checkpoint(args.dir);
      if (!inspection.note.empty()) std::fprintf(stderr, "ckpt: %s\n", inspection.note.c_str());
      const std::string text = args.json ? ckpt::inspection_json(inspection) : ckpt::inspection_text(inspection);
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    case CkptCommand::Verify: {
      const ckpt::VerifyReport report = ckpt::verify_checkpoint_parts(args.parts, args.threads);
      if (!report.note.empty()) std::fprintf(stderr, "ckpt: %s\n", report.note.c_str());
      if (!report.unchecked.empty()) std::fprintf(stderr, "ckpt: note: %s\n", report.unchecked.c_str());
      for (const std::string& problem : report.problems) std::fprintf(stderr, "ckpt: %s\n", problem.c_str());
      std::fprintf(report.ok() ? stdout : stderr, "%s\n", report.summary().c_str());
      return report.ok() ? 0 : 1;
    }
    case CkptCommand::Convert: {
      st::CommRuntime comm;
      rank = comm.world().rank();
      const std::string summary =
          ckpt::convert_checkpoint(args.dir, args.to, args.out, comm.world(), convert_options());
      if (rank == 0) std::printf("%s\n", summary.c_str());
      return 0;
    }
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  int rank = 0;
  // Errors of a multi-process convert are agreed by all ranks: rank 0 reports
  // them and fails the job; another rank exiting non-zero first would make
  // mpirun kill rank 0 before its line got out.
  st::AgreedErrors agreed;
  agreed.reporter = [&rank] { return rank == 0; };
  return st::run_main(
      "ckpt", [&] { return run(args, rank); }, agreed);
}
