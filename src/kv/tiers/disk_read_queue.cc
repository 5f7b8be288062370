#include "disk_read_queue.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "kvl/status.h"

#if KVL_HAVE_LIBURING
#include <liburing.h>
#endif

namespace kvl::kv_internal {
namespace {

// Reads in flight at once: enough to keep a disk's queue full (a layer of ~100 pages on disk is
// one or two rounds), small enough that the ring's memory does not matter.
constexpr unsigned kRingEntries = 128;

// Moves a request past `n` bytes that arrived; true when its iovecs are full.
bool Advance(DiskReadRequest& r, size_t n) {
  r.bytes_read += static_cast<int64_t>(n);
  const int start = AdvanceIovecs(r.iov, r.iov_count, 0, n);
  r.iov += start;
  r.iov_count -= start;
  return r.iov_count == 0;
}

}  // namespace

int AdvanceIovecs(iovec* iov, int count, int start, size_t n) {
  while (start < count && n >= iov[start].iov_len) {
    n -= iov[start].iov_len;
    ++start;
  }
  if (start < count && n > 0) {
    iov[start].iov_base = static_cast<uint8_t*>(iov[start].iov_base) + n;
    iov[start].iov_len -= n;
  }
  return start;
}

#if KVL_HAVE_LIBURING

struct DiskReadQueue::Ring {
  io_uring ring;
};

DiskReadQueue::DiskReadQueue(bool try_io_uring) {
  if (!try_io_uring) {
    note_ = "preadv (io_uring not asked for)";
    return;
  }
  auto ring = std::make_unique<Ring>();
  int error = io_uring_queue_init(kRingEntries, &ring->ring, 0);
  if (error < 0) {
    note_ = fmt::format("preadv (io_uring refused: {})", std::strerror(-error));
    return;
  }
  // A no-op round trip: a sandbox may allow the setup and refuse io_uring_enter.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
  io_uring_prep_nop(sqe);
  error = io_uring_submit_and_wait(&ring->ring, 1);
  io_uring_cqe* cqe = nullptr;
  if (error >= 0) error = io_uring_peek_cqe(&ring->ring, &cqe);
  if (error < 0 || cqe == nullptr) {
    io_uring_queue_exit(&ring->ring);
    note_ = fmt::format("preadv (io_uring refused: {})", std::strerror(error < 0 ? -error : EIO));
    return;
  }
  io_uring_cqe_seen(&ring->ring, cqe);
  ring_ = std::move(ring);
  note_ = "io_uring";
}

DiskReadQueue::~DiskReadQueue() {
  if (ring_) io_uring_queue_exit(&ring_->ring);
}

int64_t DiskReadQueue::ReadThroughRing(int fd, std::span<DiskReadRequest> requests) {
  io_uring* ring = &ring_->ring;
  std::deque<size_t> waiting;  // requests (or their continuations) not yet submitted
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].iov_count > 0) waiting.push_back(i);
  }
  std::vector<size_t> prepared;  // taken into the ring, not yet taken by the kernel
  int64_t ops = 0;
  unsigned in_flight = 0;
  int ring_error = 0;  // the ring itself failed (it never does once the probe passed)
  while (!waiting.empty() || in_flight > 0) {
    while (ring_error == 0 && !waiting.empty() && in_flight + prepared.size() < kRingEntries) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      DiskReadRequest& r = requests[waiting.front()];
      io_uring_prep_readv(sqe, fd, r.iov, static_cast<unsigned>(r.iov_count),
                          static_cast<uint64_t>(r.offset + r.bytes_read));
      io_uring_sqe_set_data64(sqe, waiting.front());
      prepared.push_back(waiting.front());
      waiting.pop_front();
    }
    // Submits what was prepared, then waits for everything in flight: one wake-up per wave of
    // reads, not one per read (a layer of a hundred pages would wake this thread a hundred times).
    int submitted = ring_error == 0 && !prepared.empty() ? io_uring_submit(ring) : 0;
    // Nothing taken and nothing in flight would wait forever: a ring that stalls is given up.
    if (submitted == 0 && !prepared.empty() && in_flight == 0) submitted = -EIO;
    if (submitted > 0) {
      in_flight += static_cast<unsigned>(submitted);
      ops += submitted;
      const size_t taken = std::min(prepared.size(), static_cast<size_t>(submitted));
      prepared.erase(prepared.begin(), prepared.begin() + static_cast<ptrdiff_t>(taken));
    } else if (submitted < 0 && submitted != -EINTR && submitted != -EAGAIN && submitted != -EBUSY) {
      // What the kernel never took fails with its reason; what is in flight is awaited below, and
      // the ring is then given up for preadv.
      ring_error = -submitted;
      for (size_t i : prepared) requests[i].error = ring_error;
      for (size_t i : waiting) requests[i].error = ring_error;
      prepared.clear();
      waiting.clear();
    }
    io_uring_cqe* cqe = nullptr;
    if (in_flight > 0) {
      const int waited = io_uring_wait_cqe_nr(ring, &cqe, in_flight);
      if (waited < 0 && waited != -EINTR && waited != -EAGAIN) {
        // Reads still in flight could land in buffers after they are reused: never wrong bytes.
        KVL_CHECK_MSG(false, "io_uring: cannot wait for the reads in flight");
      }
    }
    // Every completion that is there.
    while (in_flight > 0 && io_uring_peek_cqe(ring, &cqe) == 0 && cqe != nullptr) {
      const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      const int result = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --in_flight;
      DiskReadRequest& r = requests[i];
      if (result < 0 && (result == -EINTR || result == -EAGAIN) && ring_error == 0) {
        waiting.push_back(i);
      } else if (result < 0) {
        r.error = -result;
      } else if (result > 0 && !Advance(r, static_cast<size_t>(result))) {
        // A short read: the rest from where it stopped.
        if (ring_error == 0) {
          waiting.push_back(i);
        } else {
          r.error = ring_error;
        }
      }
      // result == 0: the file ended; bytes_read says how far it got.
    }
  }
  if (ring_error != 0) {
    io_uring_queue_exit(ring);
    ring_.reset();
    note_ = fmt::format("preadv (io_uring failed: {})", std::strerror(ring_error));
  }
  return ops;
}

#else  // without liburing: one preadv after another

struct DiskReadQueue::Ring {};

DiskReadQueue::DiskReadQueue(bool try_io_uring) {
  note_ = try_io_uring ? "preadv (built without liburing)" : "preadv (io_uring not asked for)";
}

DiskReadQueue::~DiskReadQueue() = default;

int64_t DiskReadQueue::ReadThroughRing(int fd, std::span<DiskReadRequest> requests) {
  return ReadOneByOne(fd, requests);
}

#endif

int64_t DiskReadQueue::ReadAll(int fd, std::span<DiskReadRequest> requests) {
  return ring_ ? ReadThroughRing(fd, requests) : ReadOneByOne(fd, requests);
}

int64_t DiskReadQueue::ReadOneByOne(int fd, std::span<DiskReadRequest> requests) {
  int64_t ops = 0;
  for (DiskReadRequest& r : requests) {
    while (r.iov_count > 0) {
      const ssize_t n = ::preadv(fd, r.iov, r.iov_count, r.offset + r.bytes_read);
      ++ops;
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n < 0) {
        r.error = errno;
        break;
      }
      if (n == 0) break;  // end of file
      Advance(r, static_cast<size_t>(n));
    }
  }
  return ops;
}

}  // namespace kvl::kv_internal
