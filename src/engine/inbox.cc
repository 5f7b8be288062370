#include "inbox.h"

#include "scheduler.h"

namespace kvl {

RequestId Inbox::Push(std::unique_ptr<Sequence> seq) {
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_id_++;
    seq->id = id;
    queue_.push_back(std::move(seq));
    ++submitted_;
  }
  cv_.notify_one();
  return id;
}

void Inbox::Cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.insert(id);
  }
  interrupt_.store(true);
  cv_.notify_one();  // an idle step loop takes it now
}

void Inbox::Interrupt() {
  stopping_.store(true);
  interrupt_.store(true);
  Wake();
}

void Inbox::Resume() {
  stopping_.store(false);
  interrupt_.store(false);
}

bool Inbox::HasQueued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !queue_.empty() || !cancels_.empty();
}

void Inbox::Drain(Scheduler& scheduler) {
  // Cleared before the cancels are taken: one that arrives after sets it again.
  interrupt_.store(stopping_.load());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!queue_.empty()) {
      scheduler.Enqueue(std::move(queue_.front()));
      queue_.pop_front();
    }
    draining_.swap(cancels_);
  }
  if (!draining_.empty()) {
    scheduler.Cancel(draining_);
    draining_.clear();
  }
}

void Inbox::Wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !queue_.empty() || !cancels_.empty() || woken_; });
  woken_ = false;
}

bool Inbox::WaitFor(std::chrono::duration<double> timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool woken = cv_.wait_for(
      lock, timeout, [this] { return !queue_.empty() || !cancels_.empty() || woken_; });
  woken_ = false;
  return woken;
}

void Inbox::Wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  cv_.notify_all();
}

int64_t Inbox::requests_submitted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_;
}

}  // namespace kvl
