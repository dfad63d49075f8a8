#include "launch/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/format.h"

namespace st::launch {

namespace {
std::string seconds_str(double s) {
  if (s < 120) return format("{:.1f}s", s);
  if (s < 7200) return format("{}m{:.0f}s", static_cast<int64_t>(s / 60), std::fmod(s, 60.0));
  return format("{}h{}m", static_cast<int64_t>(s / 3600), static_cast<int64_t>(std::fmod(s, 3600.0) / 60));
}

}  // namespace

std::string format_step_line(const StepMetrics& m) {
  // Throughput is easier to read grouped: "1,234,567 tok/s".
  const std::string rate = m.tokens_per_s >= 0 ? with_commas(std::llround(m.tokens_per_s)) + " tok/s"
                                               : with_commas(std::llround(m.samples_per_s)) + " samples/s";
  std::string line =
      format("step {}/{} | loss {:.4f} | lr {:.2e} | grad_norm {:.3f} | {} | elapsed {} | eta {}", m.step,
             m.total_steps, m.loss, m.lr, m.grad_norm, rate, seconds_str(m.elapsed_s), seconds_str(m.eta_s));
  if (m.mfu >= 0) line += format(" | mfu {:.1f}% | peak {:.2f} GB", 100.0 * m.mfu, m.peak_bytes / 1e9);
  if (m.val_loss) line += format(" | val_loss {:.4f}", *m.val_loss);
  if (m.val_ppl) line += format(" (ppl {:.1f})", *m.val_ppl);
  return line;
}

std::string format_step_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"samples_per_s", m.samples_per_s},
                      {"elapsed_s", m.elapsed_s},
                      {"peak_bytes", m.peak_bytes}};
  if (m.tokens_per_s >= 0) j["tokens_per_s"] = m.tokens_per_s;
  if (m.mfu >= 0) j["mfu"] = m.mfu;
  if (m.val_loss) j["val_loss"] = *m.val_loss;  // a non-finite value is written as null
  if (m.val_ppl) j["val_ppl"] = *m.val_ppl;
  return j.dump();
}

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "a");
  ST_CHECK(file_ != nullptr, "cannot open logging.metrics_file '{}': {}", path, std::strerror(errno));
}

MetricsFile::~MetricsFile() {
  if (file_) std::fclose(file_);
}

void MetricsFile::append(const StepMetrics& m) {
  if (!file_) return;
  std::string line = format_step_json(m) + "\n";
  ST_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
           "cannot write logging.metrics_file '{}': {}", path_, std::strerror(errno));
}

}  // namespace st::launch
