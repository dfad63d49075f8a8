#pragma once
// A few independent tasks on a few threads, for I/O (checkpoint files, their
// checksums), where OpenMP's team of compute threads is the wrong tool.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace st {

/// Runs task(i, worker) once for every i in [0, n), on up to `threads`
/// threads (the calling thread is worker 0), each thread taking the next
/// unclaimed i. Every task runs even when some throw; returns the message of
/// the first one that threw (error_message_of), "" when none did.
inline std::string run_tasks(size_t n, int threads, const std::function<void(size_t i, int worker)>& task) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string first_error;
  auto work = [&](int worker) {
    for (size_t i = next++; i < n; i = next++) {
      std::string error = error_message_of([&] { task(i, worker); });
      if (error.empty()) continue;
      std::lock_guard lock(mu);
      if (first_error.empty()) first_error = std::move(error);
    }
  };
  const int count =
      static_cast<int>(std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1, std::max<size_t>(n, 1)));
  std::vector<std::thread> pool;
  for (int w = 1; w < count; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& t : pool) t.join();
  return first_error;
}

}  // namespace st
