// One background thread per tier that runs GetAsync work in submission order, so a tier's
// prefetches reach the device in the order they were asked for (and never race each other for
// the tier's lock in arbitrary order). The thread starts on the first Submit.
//
// Thread-safety: Submit may be called from any thread. Stop (and the destructor) runs every task
// already submitted (so no future is left broken) and joins the thread; the owner must Stop the
// worker before anything its tasks touch goes away.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "kvl/status.h"

namespace kvl::kv_internal {

class TierWorker {
 public:
  using Result = std::vector<Status>;

  TierWorker() = default;
  TierWorker(const TierWorker&) = delete;
  TierWorker& operator=(const TierWorker&) = delete;
  ~TierWorker();

  std::future<Result> Submit(std::function<Result()> work);
  // Runs what was submitted, then joins the thread; Submit must not be called afterwards.
  void Stop();

 private:
  void Loop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<Result()>> queue_;  // guarded by mutex_
  bool stopping_ = false;                           // guarded by mutex_
  std::thread thread_;                              // started lazily under mutex_
};

}  // namespace kvl::kv_internal
