#pragma once
// The collective watchdog: no rank waits forever (as PyTorch's NCCL watchdog).
//
// A thread per rank wakes every beat (timeout / 5, between 0.2 s and 2 s). It
// knows what the rank is doing: blocked in a collective (Blocked, set by the
// MPI backend's Work::wait(), with the collective's description), inside which
// shard unit (set_activity(), set by FSDP) or phase such as a checkpoint save
// (Phase, set by checkpoint/), and when the step last moved
// (progress(), set by the trainer). Over a side channel of their own (a
// duplicate of MPI_COMM_WORLD used only by these threads) every rank sends
// rank 0 a heartbeat with that state (its Phase included), and rank 0
// answers each one.
//
// When a collective has made no progress for `timeout_s` (or a step has
// neither finished a micro-batch nor a collective for that long), rank 0
// writes one error line naming the collective, the unit and the ranks that
// have not arrived (a rank whose heartbeat stopped is frozen or dead; a rank
// that is not waiting is still computing), and calls MPI_Abort so every rank
// exits non-zero. Other ranks do the same with what they know if rank 0 has
// not acted within a few beats (rank 0 may be the frozen one).
//
// Without MPI_THREAD_MULTIPLE there is no side channel: each rank then
// reports only its own state.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"

namespace st {

class Watchdog {
 public:
  /// Collective over MPI_COMM_WORLD (duplicates it). MPI must be initialised.
  Watchdog(double timeout_s, Logger& log);
  /// Collective: stops the thread and drains the side channel. On an error
  /// path (an exception in flight) it only stops its thread, so a rank that
  /// fails alone never waits here for the others.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// While alive, this rank is blocked waiting for the collective `what`.
  class Blocked {
   public:
    Blocked(Watchdog* watchdog, const std::string& what);
    ~Blocked();
    Blocked(const Blocked&) = delete;
    Blocked& operator=(const Blocked&) = delete;

   private:
    Watchdog* watchdog_;
  };

  /// While alive, the rank is in `what`, e.g. "the checkpoint save of step
  /// 200 (writing files)", which the watchdog names instead of the last
  /// unit's activity (a save comes after backward, whose label would stay).
  /// Nests: the innermost wins; the destructor restores the outer one. A
  /// null watchdog makes it a no-op.
  class Phase {
   public:
    Phase(Watchdog* watchdog, std::string what);
    ~Phase();
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;

   private:
    Watchdog* watchdog_;
    std::string outer_;
  };

  /// What the rank computes now, e.g. "forward of unit model.layers.2"; the
  /// string must outlive its use (units keep theirs); nullptr clears it.
  void set_activity(const std::string* label) { activity_.store(label); }
  /// The step moved on (a micro-batch or a step ended).
  void progress();

 private:
  struct Side;
  void run();
  /// A second thread, for when the first is stuck inside MPI for timeout_s.
  void guard();
  void beat(int64_t now);
  [[noreturn]] void abort_job(const std::string& message);
  std::string local_state(int64_t now);
  /// Rank 0: every rank's state from its last heartbeat, in three lists.
  std::string ranks_report(int64_t now) const;
  /// Rank 0, in a job over several hosts: the hosts none of whose ranks sends
  /// heartbeats any more ("host h2 (ranks 2, 3) has gone silent: ..."), or "".
  std::string silent_hosts(int64_t now) const;

  const double timeout_s_;
  const int64_t timeout_ns_;
  const int64_t beat_ns_;
  Logger& log_;
  int rank_ = 0;
  int world_ = 1;
  std::atomic<int64_t> blocked_since_{0};  // steady-clock ns; 0 while not blocked
  std::atomic<int64_t> last_progress_;
  std::atomic<int64_t> waits_done_{0};
  std::atomic<const std::string*> activity_{nullptr};
  std::mutex what_mutex_;
  std::string blocked_what_;  // guarded by what_mutex_
  std::string phase_;         // guarded by what_mutex_; "" outside a Phase
  std::unique_ptr<Side> side_;
  // Each rank's host name when the job spans several hosts (else empty), for reports.
  std::vector<std::string> hosts_;
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by stop_mutex_
  std::thread thread_;
  std::thread guard_;
  std::atomic<int64_t> beat_started_{0};  // steady-clock ns when run()'s current beat began; 0 between beats
};

}  // namespace st
