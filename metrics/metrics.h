#pragma once
// Step metrics: the line rank 0 prints every logging.interval steps (means
// over the interval) and the JSON object it appends to `logging.metrics_file`
// for every step, with a line marking where each run began.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace st::metrics {

struct StepMetrics {
  int64_t step = 0;  // 1-based step just completed
  int64_t total_steps = 0;
  double loss = 0;                 // mean over the global batch
  double lr = 0;                   // learning rate used by this step
  double grad_norm = 0;            // global norm before clipping
  double tokens_per_s = 0;         // all ranks together; < 0 for models without tokens (the toy)
  double samples_per_s = 0;        // all ranks together
  double step_ms = 0;              // wall time of the step (its evaluation and save not included)
  double elapsed_s = 0;            // since the first step of this process began
  double eta_s = 0;                // estimated seconds to the end of the run
  int64_t peak_bytes = 0;          // peak allocator bytes on this rank's device during the step
  double mfu = -1;                 // model FLOPs utilisation of one device in [0, 1]; < 0 when unknown (an unknown GPU)
  std::optional<double> val_loss;  // validation loss after this step; empty when no evaluation ran
  std::optional<double> val_ppl;   // exp(val_loss), for models with tokens
};

/// The step line's means over its logging interval (the steps since the line
/// before). The loss is the mean over every step of the interval; the time
/// per step the mean over its timed steps: the first step of a process
/// includes warm-up, so it is timed only when it is the interval's only step.
/// The run's summary uses the same definition over all its timed steps.
class IntervalMeans {
 public:
  /// Adds one step; `warm_up` for the first step of the process.
  void add(double loss, double seconds, bool warm_up);
  int64_t steps() const { return steps_; }
  /// The mean loss of the steps added since reset().
  double loss() const;
  /// The mean seconds per timed step (the warm-up step's when it is the only one).
  double seconds_per_step() const;
  void reset() { *this = IntervalMeans(); }

 private:
  int64_t steps_ = 0;
  double loss_sum_ = 0;
  int64_t timed_ = 0;
  double timed_seconds_ = 0;
  double warm_up_seconds_ = 0;
};

/// A duration in one format whatever its length: "0m05s", "1m58s", "59m59s"
/// (whole seconds), then "1h00m", "2h03m" (whole minutes).
std::string format_duration(double seconds);

/// "step 5/20 | loss 5.1234 | lr 3.00e-04 | grad_norm 1.234 | 12,345 tok/s (all ranks) | 123.4 ms/step |
/// mfu 41.3% | peak 12.34 GB | elapsed 0m12s | eta 0m36s" ("1,234 samples/s (all ranks)" instead of tok/s for
/// models without tokens; no mfu when it is unknown), then " | val_loss 2.3456 (ppl 10.4)" after an
/// evaluation (no ppl without tokens). The caller passes the interval's means (IntervalMeans) in loss,
/// tokens_per_s, samples_per_s, step_ms and mfu, and the logged step's own lr and grad_norm.
std::string format_step_line(const StepMetrics& m);
/// One JSON object (no newline) of one step, its keys in this order: step, loss, val_loss and val_ppl (after an
/// evaluation; val_ppl for models with tokens), lr, grad_norm, tokens_per_s (models with tokens), samples_per_s,
/// step_ms, mfu (when known), elapsed_s, peak_bytes. Step first, the losses next, so that `cut -c` and `head`
/// show what a reader looks for.
std::string format_step_json(const StepMetrics& m);

/// Why a run began writing to the metrics file: from step 0 or init_from
/// (Start), or from a checkpoint of step N (Resume).
enum class RunEvent : uint8_t { Start, Resume };

/// The line marking the beginning of a run in a metrics file (no newline):
/// {"event":"start"|"resume","step":N,"run_name":"NAME"}, N the step the run
/// starts after. Readers take it for a mark, never for a step's values.
std::string format_event_json(RunEvent event, int64_t step, std::string_view run_name);

/// Appends JSON lines to a file; an empty path makes every call a no-op.
/// Metrics are never worth a run: a write that fails (a full disk) cuts the
/// file back to its last complete line and turns every later append into a
/// no-op, and the caller warns and trains on. A regular file that ends in a
/// half-written line (an earlier run killed or out of space mid-line) is cut
/// back to its last complete line when it is opened, so that the lines
/// appended now stay readable.
class MetricsFile {
 public:
  /// Throws st::Error naming the file when it cannot be opened.
  explicit MetricsFile(const std::string& path);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  /// False when this write failed, or an earlier one did (error() says why).
  bool append(const StepMetrics& m);
  /// The same for a run's event line (format_event_json).
  bool append_event(RunEvent event, int64_t step, std::string_view run_name);
  /// The bytes of a half-written last line cut off at open (0: none).
  int64_t cut_bytes() const { return cut_bytes_; }
  /// Why the file stopped taking lines ("" while it takes them).
  const std::string& error() const { return error_; }

 private:
  bool append_line(const std::string& line);

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;  // bytes of complete lines in the file
  int64_t cut_bytes_ = 0;
  std::string error_;
};

/// One step of a metrics file as read back; NaN for a field its lines lack
/// (val_loss is on evaluation steps only, tokens_per_s on models with tokens only).
struct MetricsRecord {
  static constexpr double kAbsent = std::numeric_limits<double>::quiet_NaN();
  int64_t step = 0;
  double loss = kAbsent;
  double val_loss = kAbsent;
  double lr = kAbsent;
  double grad_norm = kAbsent;
  double tokens_per_s = kAbsent;
  double samples_per_s = kAbsent;
};

/// A metrics file read back.
struct MetricsLog {
  std::vector<MetricsRecord> records;  // one per step, ascending
  // Where each later run began: the step of each "resume" event line, and of
  // an event or step line below the line before it (files written before
  // event lines have only those).
  std::vector<int64_t> restarts;
  std::string run_name;  // of the last event line that names one; "" when none does
};

/// Reads a metrics file (the reader of what MetricsFile appends). A run
/// resumed from a checkpoint older than its last logged step appends the
/// steps it redoes, so the steps go back: that line's step is a restart, and
/// for a step logged more than once each field takes its value from the last
/// line that has it (the later run wins). Event lines ("event" key) mark
/// restarts and name the run; they hold no step values. Blank lines are
/// skipped. Errors name "path:line" for a line that is not a JSON object,
/// lacks an integer "step" or has a field that is not a number; a file that cannot be read or holds
/// no step is an error naming the file.
MetricsLog read_metrics_file(const std::string& path);
/// The same from the file's text; `source` stands for the path in errors.
MetricsLog parse_metrics(std::string_view text, std::string_view source);

}  // namespace st::metrics
