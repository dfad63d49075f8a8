#pragma once
// Step metrics: the line rank 0 prints and the JSON object it appends to
// `logging.metrics_file` (one per logged step).
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
  double loss = 0;           // mean over the global batch
  double lr = 0;             // learning rate used by this step
  double grad_norm = 0;      // global norm before clipping
  double tokens_per_s = 0;   // all ranks together, over this step; < 0 for models without tokens (the toy)
  double samples_per_s = 0;  // all ranks together, over this step
  double elapsed_s = 0;      // since the first step began
  double eta_s = 0;          // estimated seconds to the end of the run
  int64_t peak_bytes = 0;    // peak allocator bytes on this rank's device during the step
  double mfu = -1;           // model FLOPs utilisation of one device in [0, 1]; < 0 when unknown (CPU, unknown GPU)
  std::optional<double> val_loss;  // validation loss after this step; empty when no evaluation ran
  std::optional<double> val_ppl;   // exp(val_loss), for models with tokens
};

/// "step 5/20 | loss 5.1234 | lr 3.00e-04 | grad_norm 1.234 | 12,345 tok/s | elapsed 1.2s | eta 3.4s"
/// ("1,234 samples/s" instead of tok/s for models without tokens), then
/// " | mfu 41.3% | peak 12.34 GB" when the MFU is known, then
/// " | val_loss 2.3456 (ppl 10.4)" after an evaluation (no ppl without tokens).
std::string format_step_line(const StepMetrics& m);
/// One JSON object (no newline) with keys step, loss, lr, grad_norm, samples_per_s, tokens_per_s (models with
/// tokens), elapsed_s, peak_bytes, mfu when it is known, and val_loss (and val_ppl for models with tokens)
/// after an evaluation.
std::string format_step_json(const StepMetrics& m);

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
  /// The bytes of a half-written last line cut off at open (0: none).
  int64_t cut_bytes() const { return cut_bytes_; }
  /// Why the file stopped taking lines ("" while it takes them).
  const std::string& error() const { return error_; }

 private:
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
  std::vector<int64_t> restarts;       // the step of each line whose step is below the line before it
};

/// Reads a metrics file (the reader of what MetricsFile appends). A run
/// resumed from a checkpoint older than its last logged step appends the
/// steps it redoes, so the steps go back: that line's step is a restart, and
/// for a step logged more than once each field takes its value from the last
/// line that has it (the later run wins). Blank lines are skipped. Errors name
/// "path:line" for a line that is not a JSON object, lacks an integer "step"
/// or has a field that is not a number; a file that cannot be read or holds
/// no step is an error naming the file.
MetricsLog read_metrics_file(const std::string& path);
/// The same from the file's text; `source` stands for the path in errors.
MetricsLog parse_metrics(std::string_view text, std::string_view source);

}  // namespace st::metrics
