#pragma once
// Command lines and main() bodies of every shardtrain program (trainer, ckpt,
// generate, prepare, plot and the benchmarks): one parser, one error style.
//
// A program declares its flags on a cli::Parser, each with a one-line doc,
// and the parser writes the values into the program's own args struct:
//
//   cli::Parser p("plot", "plot METRICS.jsonl... -o OUT.svg [--label NAME]...");
//   p.option("-o, --output", "OUT.svg", &args.out, "the file to write");
//   p.positionals("METRICS.jsonl", &args.files);
//   if (p.parse_or_help(argv)) return 0;  // --help / -h printed the help
//
// Rules shared by every program: "--flag value" and "--flag=value" are the
// same; a value is the next argument even when it starts with '-'; "-" alone
// is a positional argument. A mistake on the command line throws
// cli::UsageError ("unknown argument '--step'; did you mean '--steps'? (see
// --help)"), which run_main prints as "PROGRAM: error: ..." and turns into
// exit code 2. Every program answers alike: --help or -h prints the usage on
// stdout and exits 0; no arguments at all (for a program that needs some)
// prints the usage on stderr and exits 2.
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace st {

namespace cli {

/// A mistake on the command line (unknown flag, missing or malformed value,
/// a required argument left out): exit code 2 instead of 1.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// No arguments given to a program that needs some: run_main prints the
/// usage it carries on stderr (instead of an error line) and exits 2.
class NoArguments : public UsageError {
 public:
  explicit NoArguments(std::string usage)
      : UsageError("no arguments (see --help)", __FILE__, __LINE__), usage_(std::move(usage)) {}
  const std::string& usage() const { return usage_; }

 private:
  std::string usage_;
};

/// A declarative parser for one program (or one subcommand); see the top of
/// this file. Targets passed by pointer must outlive parse().
class Parser {
 public:
  /// `program` names the help; `synopsis` is what follows "usage: " (several
  /// lines allowed, each after the first starting with its own indent).
  Parser(std::string program, std::string synopsis);

  /// A switch without a value ("--json"); `names` is "--long" or "-s, --long".
  Parser& flag(const std::string& names, bool* out, const std::string& doc);
  /// A switch that runs `then` each time it is given (sugar such as --profile).
  Parser& flag(const std::string& names, std::function<void()> then, const std::string& doc);
  /// A string value; the last one given wins.
  Parser& option(const std::string& names, const std::string& metavar, std::string* out, const std::string& doc);
  /// A string value that may be given empty (the program tells "absent" from "").
  Parser& option(const std::string& names, const std::string& metavar, std::optional<std::string>* out,
                 const std::string& doc);
  /// An integer in [min, max]; anything else is a usage error naming the flag.
  Parser& option(const std::string& names, const std::string& metavar, int64_t* out, const std::string& doc,
                 int64_t min = std::numeric_limits<int64_t>::min(), int64_t max = std::numeric_limits<int64_t>::max());
  /// An int in [min, max].
  Parser& option(const std::string& names, const std::string& metavar, int* out, const std::string& doc, int min,
                 int max);
  /// A finite or infinite double written in full (no trailing text).
  Parser& option(const std::string& names, const std::string& metavar, double* out, const std::string& doc);
  /// Every value given, in order (e.g. --set key=value, repeatable).
  Parser& repeated(const std::string& names, const std::string& metavar, std::vector<std::string>* out,
                   const std::string& doc);
  /// A value handed to `then`, which converts it and throws UsageError (see
  /// usage_error) when it is bad.
  Parser& option(const std::string& names, const std::string& metavar, std::function<void(const std::string&)> then,
                 const std::string& doc);
  /// Accepts positional arguments into `out`; without this, one is an error.
  Parser& positionals(const std::string& metavar, std::vector<std::string>* out);
  /// Free text placed in the help at this point (a paragraph, a heading).
  Parser& text(const std::string& paragraph);

  /// Makes a command line without arguments a usage error that prints the
  /// help on stderr (NoArguments, exit 2): for a program that cannot do
  /// anything without one.
  Parser& usage_without_arguments();

  /// Parses argv (without the program name) into the targets. Returns true
  /// when --help or -h was given (the caller prints help() and exits 0).
  bool parse(const std::vector<std::string>& argv) const;
  /// parse(), and on --help or -h prints help() on stdout: true then, and the
  /// caller exits 0.
  bool parse_or_help(const std::vector<std::string>& argv) const;

  /// "usage: SYNOPSIS", then every flag with its doc and the text blocks, in
  /// declaration order.
  std::string help() const;
  /// Only the flag lines and text blocks, each indented by `indent` more
  /// spaces (for a program that lists its subcommands' flags).
  std::string options_help(int indent = 0) const;

 private:
  struct Entry {
    std::vector<std::string> names;  // empty for a text block
    std::string metavar;             // empty for a switch
    std::string doc;                 // the doc, or the text block
    std::function<void(const std::string& flag, const std::string& value)> set;
  };
  const Entry* find(const std::string& name) const;
  /// "; did you mean '--steps'?" for the long flag closest to `name`, or "".
  std::string closest_flag(const std::string& name) const;
  Parser& add(const std::string& names, const std::string& metavar, const std::string& doc,
              std::function<void(const std::string&, const std::string&)> set);

  std::string program_;
  std::string synopsis_;
  std::vector<Entry> entries_;
  std::vector<std::string>* positionals_ = nullptr;
  std::string positional_metavar_;
  bool usage_without_arguments_ = false;
};

/// `text` as an integer in [min, max]; otherwise a UsageError "FLAG TEXT:
/// expected a positive integer" (or "an integer >= MIN", "in [MIN, MAX]"),
/// or for a number past max (int64's range included) "FLAG TEXT: too large
/// (at most MAX)".
int64_t to_int(const std::string& flag, const std::string& text, int64_t min = std::numeric_limits<int64_t>::min(),
               int64_t max = std::numeric_limits<int64_t>::max());

/// Throws UsageError with a formatted message (a check of a combination of
/// flags that the parser cannot see, e.g. "--out DIR is required").
[[noreturn]] void usage_error(const std::string& message);

}  // namespace cli

/// Throws cli::UsageError (exit code 2) with a formatted message when `cond`
/// is false: for command-line checks after parsing.
#define ST_USAGE_CHECK(cond, ...)                        \
  do {                                                   \
    if (!(cond)) [[unlikely]]                            \
      ::st::cli::usage_error(::st::format(__VA_ARGS__)); \
  } while (0)

/// How run_main reports an st::AgreedError, an error every process of a job
/// raised alike (a bad config file, a failure the ranks agreed on). Without
/// it, an AgreedError is reported like any st::Error.
struct AgreedErrors {
  /// Whether this process prints the error and fails (rank 0 of the job).
  std::function<bool()> reporter;
  /// What the other processes do before they exit 0 (may be empty). They
  /// exit 0 so that mpirun does not kill the reporter before its line is out.
  std::function<void()> quiet_exit;
};

/// The body of every program's main(): returns what `body` returns. An
/// st::Error prints "PROGRAM: error: MESSAGE" on stderr and returns 1 (2 for
/// a cli::UsageError; cli::NoArguments prints the usage instead); any other exception prints "PROGRAM: internal error:
/// WHAT" and returns 2. With `agreed` set, an st::AgreedError is printed by
/// the reporter only and the others return 0.
int run_main(const char* program, const std::function<int()>& body, const AgreedErrors& agreed = {});

}  // namespace st
