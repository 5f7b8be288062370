#include "tier_worker.h"

#include <utility>

namespace kvl::kv_internal {

TierWorker::~TierWorker() { Stop(); }

void TierWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::future<TierWorker::Result> TierWorker::Submit(std::function<Result()> work) {
  std::packaged_task<Result()> task(std::move(work));
  std::future<Result> result = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    KVL_CHECK(!stopping_);
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  wake_.notify_one();
  return result;
}

void TierWorker::Loop() {
  for (;;) {
    std::packaged_task<Result()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      // Drain the queue before stopping: every future handed out gets its value.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kvl::kv_internal
