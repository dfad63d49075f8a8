#include "metrics/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <sstream>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "core/format.h"

namespace st::metrics {

namespace {
// The numeric fields a metrics line may hold, as read back.
struct FieldOf {
  std::string_view key;
  double MetricsRecord::*field;
};
constexpr FieldOf kReadFields[] = {{"loss", &MetricsRecord::loss},
                                   {"val_loss", &MetricsRecord::val_loss},
                                   {"lr", &MetricsRecord::lr},
                                   {"grad_norm", &MetricsRecord::grad_norm},
                                   {"tokens_per_s", &MetricsRecord::tokens_per_s},
                                   {"samples_per_s", &MetricsRecord::samples_per_s}};

// The start of a line, for an error message.
std::string snippet(const std::string& line) { return line.size() > 60 ? line.substr(0, 60) + "..." : line; }

// Overwrites `into`'s fields with those `line` has (null, as JSON writes a
// NaN, counts as absent); `where` is "path:line".
void merge_fields(const nlohmann::json& line, MetricsRecord& into, const std::string& where) {
  for (const FieldOf& f : kReadFields) {
    const auto it = line.find(f.key);
    if (it == line.end() || it->is_null()) continue;
    ST_CHECK(it->is_number(), "{}: \"{}\" is {}, not a number", where, f.key, it->dump());
    into.*f.field = it->get<double>();
  }
}

// An event line: a resume (or a start below the line before) is a restart;
// a name it carries is the run's.
void read_event(const nlohmann::json& line, const nlohmann::json& event, int64_t step, int64_t previous,
                MetricsLog& log) {
  if ((event.is_string() && event.get<std::string>() == "resume") || step < previous) log.restarts.push_back(step);
  const auto name = line.find("run_name");
  if (name != line.end() && name->is_string() && !name->get<std::string>().empty())
    log.run_name = name->get<std::string>();
}

}  // namespace

void IntervalMeans::add(double loss, double seconds, bool warm_up) {
  ++steps_;
  loss_sum_ += loss;
  if (warm_up) {
    warm_up_seconds_ = seconds;
    return;
  }
  ++timed_;
  timed_seconds_ += seconds;
}

double IntervalMeans::loss() const { return steps_ > 0 ? loss_sum_ / static_cast<double>(steps_) : 0.0; }

double IntervalMeans::seconds_per_step() const {
  return timed_ > 0 ? timed_seconds_ / static_cast<double>(timed_) : warm_up_seconds_;
}

std::string format_duration(double seconds) {
  // Rounded once, to the unit shown, so that 59.6 s reads "1m00s", never "0m60s".
  const int64_t s = std::isfinite(seconds) && seconds > 0 ? std::llround(seconds) : 0;
  char text[48];
  if (s < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    const int64_t minutes = std::llround(static_cast<double>(s) / 60.0);
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(minutes / 60),
                  static_cast<long long>(minutes % 60));
  }
  return text;
}

std::string format_step_line(const StepMetrics& m) {
  // Throughput is easier to read grouped: "1,234,567 tok/s".
  const std::string rate = m.tokens_per_s >= 0 ? with_commas(std::llround(m.tokens_per_s)) + " tok/s (all ranks)"
                                               : with_commas(std::llround(m.samples_per_s)) + " samples/s (all ranks)";
  std::string line = format("step {}/{} | loss {:.4f} | lr {:.2e} | grad_norm {:.3f} | {} | {:.1f} ms/step", m.step,
                            m.total_steps, m.loss, m.lr, m.grad_norm, rate, m.step_ms);
  if (m.mfu >= 0) line += format(" | mfu {:.1f}%", 100.0 * m.mfu);
  line += format(" | peak {} | elapsed {} | eta {}", human_bytes(m.peak_bytes), format_duration(m.elapsed_s),
                 format_duration(m.eta_s));
  if (m.val_loss) line += format(" | val_loss {:.4f}", *m.val_loss);
  if (m.val_ppl) line += format(" (ppl {:.1f})", *m.val_ppl);
  return line;
}

std::string format_step_json(const StepMetrics& m) {
  // ordered_json keeps the insertion order (nlohmann::json sorts the keys).
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  if (m.val_loss) j["val_loss"] = *m.val_loss;  // a non-finite value is written as null
  if (m.val_ppl) j["val_ppl"] = *m.val_ppl;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  if (m.tokens_per_s >= 0) j["tokens_per_s"] = m.tokens_per_s;
  j["samples_per_s"] = m.samples_per_s;
  j["step_ms"] = m.step_ms;
  if (m.mfu >= 0) j["mfu"] = m.mfu;
  j["elapsed_s"] = m.elapsed_s;
  j["peak_bytes"] = m.peak_bytes;
  return j.dump();
}

std::string format_event_json(RunEvent event, int64_t step, std::string_view run_name) {
  nlohmann::ordered_json j;
  j["event"] = event == RunEvent::Resume ? "resume" : "start";
  j["step"] = step;
  j["run_name"] = std::string(run_name);
  // A name that is not UTF-8 is written with replacement characters rather than failing the run.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

namespace {

// The length of `fd`'s regular file up to and including its last '\n' (0
// when it has none), read backwards from `size` in blocks.
int64_t complete_lines_length(int fd, int64_t size, const std::string& path) {
  constexpr int64_t kBlock = 4096;
  char block[kBlock];
  for (int64_t end = size; end > 0;) {
    const int64_t begin = std::max<int64_t>(0, end - kBlock);
    const ssize_t got = ::pread(fd, block, static_cast<size_t>(end - begin), begin);
    ST_CHECK(got == end - begin, "cannot read logging.metrics_file '{}': {}", path,
             got < 0 ? std::strerror(errno) : "short read");
    for (int64_t i = end - begin; i > 0; --i) {
      if (block[i - 1] == '\n') return begin + i;
    }
    end = begin;
  }
  return 0;
}

// Creates the directories a metrics file goes in, as checkpoint.dir is created.
void create_parent_directories(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  ST_CHECK(!ec, "cannot create the directory '{}' of logging.metrics_file '{}': {}", parent.string(), path,
           ec.message());
}

}  // namespace

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
  if (path.empty()) return;
  create_parent_directories(path);
  // Owned here until the repair is done, so that an error below closes it.
  UniqueFd fd = open_output_file(path, "logging.metrics_file", OutputMode::Append);
  struct stat st {};
  if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) {  // a device (/dev/null) has nothing to repair
    size_ = st.st_size;
    const UniqueFd reader = open_regular_file(path, "logging.metrics_file");
    const int64_t complete = complete_lines_length(reader.get(), size_, path);
    ST_CHECK(::ftruncate(fd.get(), complete) == 0,
             "cannot cut the half-written last line of logging.metrics_file '{}': {}", path, std::strerror(errno));
    cut_bytes_ = size_ - complete;
    size_ = complete;
  }
  fd_ = fd.release();
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool MetricsFile::append(const StepMetrics& m) { return append_line(format_step_json(m) + "\n"); }

bool MetricsFile::append_event(RunEvent event, int64_t step, std::string_view run_name) {
  return append_line(format_event_json(event, step, run_name) + "\n");
}

bool MetricsFile::append_line(const std::string& line) {
  if (path_.empty()) return true;
  if (fd_ < 0) return false;
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    error_ = format("cannot write logging.metrics_file '{}': {}", path_, n < 0 ? std::strerror(errno) : "no progress");
    // What reached the file of this line goes (a device such as /dev/full cannot be cut: nothing to do there).
    (void)::ftruncate(fd_, size_);
    ::close(fd_);
    fd_ = -1;
    return false;
  }
  size_ += static_cast<int64_t>(line.size());
  return true;
}

MetricsLog parse_metrics(std::string_view text, std::string_view source) {
  std::map<int64_t, MetricsRecord> by_step;
  MetricsLog log;
  std::istringstream in{std::string(text)};
  int64_t line_no = 0;
  int64_t previous = std::numeric_limits<int64_t>::min();
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = format("{}:{}", source, line_no);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ST_CHECK(j.is_object(), "{}: not a JSON object (a metrics file holds one per line): {}", where, snippet(line));
    const auto step = j.find("step");
    ST_CHECK(step != j.end() && step->is_number_integer(), "{}: no integer \"step\" in {}", where, snippet(line));
    if (const auto event = j.find("event"); event != j.end()) {
      read_event(j, *event, step->get<int64_t>(), previous, log);
      previous = step->get<int64_t>();
      continue;
    }
    MetricsRecord& record = by_step[step->get<int64_t>()];
    record.step = step->get<int64_t>();
    merge_fields(j, record, where);
    if (record.step < previous) log.restarts.push_back(record.step);
    previous = record.step;
  }
  ST_CHECK(!by_step.empty(), "{}: no steps (an empty metrics file)", source);
  for (auto& [step, record] : by_step) log.records.push_back(record);
  return log;
}

MetricsLog read_metrics_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  ST_CHECK(std::filesystem::exists(status), "metrics file '{}' does not exist", path);
  ST_CHECK(!std::filesystem::is_directory(status), "metrics file '{}' is a directory", path);
  // read_file refuses a FIFO or a device without blocking on it.
  return parse_metrics(read_file(path, "metrics file"), path);
}

}  // namespace st::metrics
