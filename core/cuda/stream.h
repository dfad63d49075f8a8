#pragma once
// Streams, events and the per-GPU compute stream of the CUDA backend. CUDA
// builds only (needs the CUDA runtime headers). Handles are move-only RAII
// objects whose destructors never throw.
#include <utility>

#include <cuda_runtime_api.h>

#include "core/cuda/cuda_check.h"

/// Checks the kernel launch just issued (bad configuration, no image for this
/// GPU's architecture); asynchronous faults surface at the next synchronising call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace st::cuda {

/// Makes GPU `index` current for the guard's lifetime and restores the
/// previous one after, so a call never changes which GPU its caller works on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) {
      CUDA_CHECK(cudaSetDevice(index));
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    // Restoring can only fail if the context is already broken, and the next
    // checked call reports that.
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// An owned, non-blocking stream on the current device.
class Stream {
 public:
  /// Creates a stream on the current device; `priority` as in
  /// cudaStreamCreateWithPriority (lower is more urgent, 0 is the default).
  explicit Stream(int priority = 0);
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

/// An owned event (timing disabled unless asked for).
class Event {
 public:
  enum class Timing : uint8_t { Off, On };
  explicit Event(Timing timing = Timing::Off);
  ~Event();
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  /// Marks the point after all work issued to `stream` so far.
  void record(cudaStream_t stream) const;
  /// Makes `stream` wait (on the device, not the host) until the marked point.
  void block(cudaStream_t stream) const;
  /// True when the marked work is done.
  bool query() const;
  void synchronize() const;
  /// Milliseconds between two recorded timing events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t event_ = nullptr;
};

/// The stream every op on GPU `index` is issued to: non-blocking, created on
/// first use, one per GPU for the process. Communication uses streams of its
/// own, ordered against this one with events.
cudaStream_t compute_stream(int index);

/// Marks a live GPU block as used by `stream` too (see CachingAllocator::record_stream).
void record_stream(void* ptr, int device, cudaStream_t stream);

}  // namespace st::cuda
