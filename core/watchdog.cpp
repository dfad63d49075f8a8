#include "core/watchdog.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

#include <mpi.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/error.h"

namespace st {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

constexpr int kHeartbeatTag = 7101;  // rank r -> rank 0
constexpr int kAnswerTag = 7102;     // rank 0 -> rank r

// A heartbeat, sent as bytes: rank 0 reports every rank's last one.
struct Beat {
  int64_t waits = 0;              // collective waits finished
  int64_t blocked = 0;            // ns blocked in the current one (0: not blocked)
  int64_t idle = 0;               // ns since the step last moved
  std::array<char, 104> phase{};  // the rank's Watchdog::Phase, NUL-terminated ("" outside one; cut to fit)
};
static_assert(std::is_trivially_copyable_v<Beat>);
constexpr int kBeatBytes = static_cast<int>(sizeof(Beat));

// ", during <phase>" for a rank's list entry, "" outside a phase.
std::string during_phase(const Beat& beat) {
  const std::string phase(beat.phase.data(), ::strnlen(beat.phase.data(), beat.phase.size()));
  return phase.empty() ? std::string() : format(", during {}", phase);
}

}  // namespace

struct Watchdog::Side {
  MPI_Comm comm = MPI_COMM_NULL;
  std::deque<std::pair<Beat, MPI_Request>> sends;  // buffers stay put until their send completes
  std::vector<int64_t> sent, received;             // messages per peer, for the drain at shutdown
  std::vector<int64_t> heard;                      // rank 0: when each rank was last heard from
  std::vector<Beat> state;                         // rank 0: each rank's last heartbeat
  int64_t root_heard = 0;                          // other ranks: when rank 0 last answered
  std::atomic<int> sending_to{-1};                 // the peer of the send in progress, for the guard

  void send(const Beat& beat, int to) {
    sends.emplace_back(beat, MPI_REQUEST_NULL);
    sending_to.store(to);
    MPI_Isend(&sends.back().first, kBeatBytes, MPI_BYTE, to, to == 0 ? kHeartbeatTag : kAnswerTag, comm,
              &sends.back().second);
    sending_to.store(-1);
    ++sent[static_cast<size_t>(to)];
    // Completed sends are dropped from the front (they complete in order per peer, closely enough).
    while (!sends.empty()) {
      int done = 0;
      MPI_Test(&sends.front().second, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sends.pop_front();
    }
  }

  // Receives every message that has arrived; returns them with their source.
  template <class F>
  void drain(F&& on_message) {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &status);
      if (!flag) return;
      Beat beat{};
      MPI_Recv(&beat, kBeatBytes, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, comm, MPI_STATUS_IGNORE);
      ++received[static_cast<size_t>(status.MPI_SOURCE)];
      on_message(status.MPI_SOURCE, beat);
    }
  }
};

Watchdog::Watchdog(double timeout_s, Logger& log)
    : timeout_s_(timeout_s),
      timeout_ns_(static_cast<int64_t>(timeout_s * 1e9)),
      beat_ns_(std::clamp<int64_t>(timeout_ns_ / 5, 200'000'000, 2'000'000'000)),
      log_(log),
      last_progress_(now_ns()) {
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  int provided = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&provided));
  if (provided == MPI_THREAD_MULTIPLE) {
    side_ = std::make_unique<Side>();
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &side_->comm));
    const auto n = static_cast<size_t>(world_);
    side_->sent.assign(n, 0);
    side_->received.assign(n, 0);
    side_->heard.assign(n, now_ns());
    side_->state.assign(n, Beat{});
    side_->root_heard = now_ns();
    // Host names, so that a report names where the silent ranks run.
    constexpr int kName = 64;
    char mine[kName] = {};
    const std::string name = host_name();
    name.copy(mine, kName - 1);
    std::vector<char> all(n * kName);
    MPI_CHECK(MPI_Allgather(mine, kName, MPI_CHAR, all.data(), kName, MPI_CHAR, side_->comm));
    for (size_t r = 0; r < n; ++r) hosts_.emplace_back(all.data() + r * kName);
    if (std::all_of(hosts_.begin(), hosts_.end(), [&](const std::string& h) { return h == hosts_[0]; })) hosts_.clear();
  } else {
    log_.warn0("watchdog: MPI gives no MPI_THREAD_MULTIPLE, so ranks report only their own state on a timeout");
  }
  thread_ = std::thread([this] { run(); });
  if (side_) guard_ = std::thread([this] { guard(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (guard_.joinable()) guard_.join();
  if (!side_ || std::uncaught_exceptions() > 0) return;
  // Every message sent on the side channel is received before it is freed:
  // the ranks tell each other how many they sent, then collect the rest.
  std::vector<int64_t> expected(side_->sent.size(), 0);
  MPI_Alltoall(side_->sent.data(), 1, MPI_INT64_T, expected.data(), 1, MPI_INT64_T, side_->comm);
  for (size_t r = 0; r < expected.size(); ++r) {
    for (; side_->received[r] < expected[r]; ++side_->received[r]) {
      Beat beat{};
      MPI_Recv(&beat, kBeatBytes, MPI_BYTE, static_cast<int>(r), MPI_ANY_TAG, side_->comm, MPI_STATUS_IGNORE);
    }
  }
  for (auto& [beat, request] : side_->sends) MPI_Wait(&request, MPI_STATUS_IGNORE);
  MPI_Comm_free(&side_->comm);
}

Watchdog::Blocked::Blocked(Watchdog* watchdog, const std::string& what) : watchdog_(watchdog) {
  if (!watchdog_) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_->what_mutex_);
    watchdog_->blocked_what_ = what;
  }
  watchdog_->blocked_since_.store(now_ns());
}

Watchdog::Blocked::~Blocked() {
  if (!watchdog_) return;
  watchdog_->blocked_since_.store(0);
  watchdog_->waits_done_.fetch_add(1);
  watchdog_->last_progress_.store(now_ns());
}

Watchdog::Phase::Phase(Watchdog* watchdog, std::string what) : watchdog_(watchdog) {
  if (!watchdog_) return;
  std::lock_guard<std::mutex> lock(watchdog_->what_mutex_);
  outer_ = std::exchange(watchdog_->phase_, std::move(what));
}

Watchdog::Phase::~Phase() {
  if (!watchdog_) return;
  std::lock_guard<std::mutex> lock(watchdog_->what_mutex_);
  watchdog_->phase_ = std::move(outer_);
}

void Watchdog::progress() { last_progress_.store(now_ns()); }

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  int64_t last = now_ns();
  while (!stop_cv_.wait_for(lock, std::chrono::nanoseconds(beat_ns_), [this] { return stop_; })) {
    const int64_t now = now_ns();
    // A beat that comes far too late means this process itself was frozen
    // (SIGSTOP, a suspended VM): what it knows is stale, so it judges nobody
    // until the next beat has fresh news.
    const bool was_frozen = now - last > 3 * beat_ns_;
    last = now;
    if (was_frozen) {
      if (side_) std::fill(side_->heard.begin(), side_->heard.end(), now);
      if (side_) side_->root_heard = now;
      continue;
    }
    beat_started_.store(now);
    lock.unlock();  // guard() waits on the same mutex and must run while a beat is stuck
    beat(now);
    lock.lock();
    beat_started_.store(0);
  }
}

void Watchdog::guard() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  int64_t last = now_ns();
  while (!stop_cv_.wait_for(lock, std::chrono::nanoseconds(beat_ns_), [this] { return stop_; })) {
    const int64_t now = now_ns();
    const bool was_frozen = now - last > 3 * beat_ns_;  // as in run()
    last = now;
    const int64_t started = beat_started_.load();
    if (was_frozen || started == 0 || now - started <= timeout_ns_) continue;
    // The heartbeat thread is stuck inside MPI. Open MPI does that when a
    // TCP peer dies: the thread that notices reports it to mpirun and waits,
    // holding the connection's lock, for an answer that never comes while
    // mpirun sleeps in its kill path. No MPI call can report it, so this
    // rank says what it knows and ends itself; its exit fails the job.
    const int peer = side_->sending_to.load();
    const std::string what =
        peer < 0 ? std::string("a heartbeat receive")
                 : format("a heartbeat send to rank {}{}", peer, hosts_.empty() ? "" : " on host " + hosts_[peer]);
    const std::string line = format(
        "watchdog on rank {}: MPI has not returned for {:.1f} s ({} is blocked: Open MPI is stuck, as it is after "
        "losing the connection to a rank that died or was cut off); {}; ending this rank (comm.timeout_s = {})",
        rank_, seconds(now - started), what, local_state(now), timeout_s_);
    log_.error("{}", line);
    tell_launcher(line);
    ::_exit(1);
  }
}

std::string Watchdog::local_state(int64_t now) {
  const int64_t since = blocked_since_.load();
  const std::string* activity = activity_.load();
  std::string what, phase;
  {
    std::lock_guard<std::mutex> lock(what_mutex_);
    what = blocked_what_;
    phase = phase_;
  }
  // A phase (a checkpoint save) outranks the unit label, which stays set after the unit ran.
  const std::string during = !phase.empty() ? format(" during {}", phase)
                             : activity     ? format(" during {}", *activity)
                                            : std::string();
  if (since != 0) return format("{}{} made no progress for {:.1f} s", what, during, seconds(now - since));
  return format("the step on rank {}{} made no progress for {:.1f} s (no collective finished, no micro-batch ended)",
                rank_, during, seconds(now - last_progress_.load()));
}

void Watchdog::beat(int64_t now) {
  const int64_t since = blocked_since_.load();
  const int64_t blocked = since != 0 ? now - since : 0;
  const int64_t idle = since != 0 ? 0 : now - last_progress_.load();
  Beat mine{waits_done_.load(), blocked, idle, {}};
  {
    std::lock_guard<std::mutex> lock(what_mutex_);
    phase_.copy(mine.phase.data(), std::min(phase_.size(), mine.phase.size() - 1));
  }
  const int64_t grace = 3 * beat_ns_;  // lets rank 0, which knows most, report first

  if (!side_) {
    if (blocked > timeout_ns_ || idle > timeout_ns_)
      abort_job(format("watchdog on rank {}: {}; the other ranks' states are unknown (no MPI_THREAD_MULTIPLE)", rank_,
                       local_state(now)));
    return;
  }
  Side& s = *side_;
  if (rank_ != 0) {
    s.drain([&](int, const Beat&) { s.root_heard = now; });
    s.send(mine, 0);
    const int64_t root_silent = now - s.root_heard;
    if (blocked > timeout_ns_ + grace || idle > timeout_ns_ + grace || root_silent > timeout_ns_ + grace)
      abort_job(format("watchdog on rank {}: {}; rank 0 has not answered for {:.1f} s{}", rank_, local_state(now),
                       seconds(root_silent), root_silent > timeout_ns_ ? " (it may be the rank that stopped)" : ""));
    return;
  }

  s.drain([&](int source, const Beat& beat) {
    s.heard[static_cast<size_t>(source)] = now;
    s.state[static_cast<size_t>(source)] = beat;
  });
  s.heard[0] = now;
  s.state[0] = mine;
  for (int r = 1; r < world_; ++r) s.send(mine, r);

  // Trouble: a rank blocked or idle past the timeout, or a rank gone silent.
  bool trouble = false;
  for (size_t r = 0; r < s.state.size(); ++r)
    trouble =
        trouble || s.state[r].blocked > timeout_ns_ || s.state[r].idle > timeout_ns_ || now - s.heard[r] > timeout_ns_;
  if (!trouble) return;
  const std::string headline =
      blocked > 0 || idle > timeout_ns_ ? local_state(now) + " on rank 0" : "a collective made no progress";
  abort_job(format("watchdog: {}; {}", headline, ranks_report(now)));
}

std::string Watchdog::ranks_report(int64_t now) const {
  const Side& s = *side_;
  std::vector<std::string> silent, computing, waiting;
  for (size_t r = 0; r < s.state.size(); ++r) {
    const Beat& b = s.state[r];
    const int64_t quiet = now - s.heard[r];
    // Heartbeats come every beat, so three missed ones mean the rank is not running.
    if (quiet > std::min(timeout_ns_, 3 * beat_ns_))
      silent.push_back(format("{}{} (no heartbeat for {:.1f} s: stopped, frozen or dead{})", r,
                              hosts_.empty() ? std::string() : " on host " + hosts_[r], seconds(quiet),
                              during_phase(b)));
    else if (b.blocked == 0)
      computing.push_back(format("{} (not waiting: computing for {:.1f} s after {} collective waits{})", r,
                                 seconds(b.idle), b.waits, during_phase(b)));
    else
      waiting.push_back(format("{} ({:.1f} s{})", r, seconds(b.blocked), during_phase(b)));
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& x : v) out += (out.empty() ? "" : ", ") + x;
    return out.empty() ? std::string("none") : out;
  };
  return format("{}ranks that have not arrived: {}; still computing: {}; waiting: {}", silent_hosts(now), list(silent),
                list(computing), list(waiting));
}

std::string Watchdog::silent_hosts(int64_t now) const {
  if (hosts_.empty()) return {};
  struct Host {
    std::string name;
    std::string ranks;  // "2, 3"
    bool silent = true;
  };
  std::vector<Host> hosts;  // in rank order
  for (size_t r = 0; r < hosts_.size(); ++r) {
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const Host& h) { return h.name == hosts_[r]; });
    if (it == hosts.end()) it = hosts.insert(hosts.end(), Host{hosts_[r], {}, true});
    it->ranks += (it->ranks.empty() ? "" : ", ") + std::to_string(r);
    it->silent = it->silent && now - side_->heard[r] > std::min(timeout_ns_, 3 * beat_ns_);
  }
  std::string out;
  for (const Host& h : hosts)
    if (h.silent)
      out += format("host {} (ranks {}) has gone silent: it is down or cut off from the others; ", h.name, h.ranks);
  return out;
}

void Watchdog::abort_job(const std::string& message) {
  const std::string line = format("{}; aborting the job (comm.timeout_s = {})", message, timeout_s_);
  log_.error("{}", line);
  tell_launcher(line);
  // MPI_Abort asks mpirun to end the job, and waits for its answer, for ever
  // when mpirun cannot give one: once a rank on another host has failed,
  // mpirun sleeps in its kill path (2 x odls_base_sigkill_timeout, which
  // scripts/launch raises to 2 minutes). So this rank ends itself a few
  // seconds later; its exit status fails the job either way.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ::_exit(1);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::terminate();  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

}  // namespace st
