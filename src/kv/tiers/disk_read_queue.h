// The disk tier's reads of one Get, all in flight at once. A Get that streams one layer of every
// page on disk is a hundred small reads at scattered offsets (each page's layers are contiguous,
// not the same layer of different pages); issued one preadv after another, each waits the
// device's whole latency (~50 us) and the disk delivers a quarter of its bandwidth. Through
// io_uring (Debian's liburing) the whole batch is submitted with one system call, and the device
// works on all of it at once.
//
// io_uring may be missing (a build without liburing-dev) or forbidden at run time (a container's
// seccomp profile refuses io_uring_setup, a kernel with io_uring_disabled): the queue probes it
// once, with a no-op round trip, and otherwise reads the batch one preadv after another. Both
// give the same bytes; io_uring_note() says which is used and why.
//
// Thread-safety: none; the disk tier calls it under its own mutex.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace kvl::kv_internal {

// One read: fill the iovecs from `offset` on. The iovec array is the caller's and is advanced in
// place as bytes arrive (a short read continues where it stopped).
struct DiskReadRequest {
  iovec* iov = nullptr;
  int iov_count = 0;
  int64_t offset = 0;
  int64_t bytes_read = 0;  // out: less than the iovecs hold when the file ends first
  int error = 0;           // out: the errno of a read the OS failed (0: none)
};

class DiskReadQueue {
 public:
  // try_io_uring false: always one preadv after another (tests compare both ways).
  explicit DiskReadQueue(bool try_io_uring);
  ~DiskReadQueue();
  DiskReadQueue(const DiskReadQueue&) = delete;
  DiskReadQueue& operator=(const DiskReadQueue&) = delete;

  bool io_uring_active() const { return ring_ != nullptr; }
  // "io_uring", or "preadv (io_uring ...: why not)".
  const std::string& note() const { return note_; }

  // Reads every request until its iovecs are full, the file ends, or the OS fails it (EINTR and
  // EAGAIN are retried). Returns the read operations handed to the OS: one per request, plus one
  // per continuation of a short read.
  int64_t ReadAll(int fd, std::span<DiskReadRequest> requests);

 private:
  int64_t ReadOneByOne(int fd, std::span<DiskReadRequest> requests);
  int64_t ReadThroughRing(int fd, std::span<DiskReadRequest> requests);

  struct Ring;  // liburing's state; defined only where liburing is built in
  std::unique_ptr<Ring> ring_;
  std::string note_;
};

// Drops the first `n` bytes from an iovec array in place; returns the new start index.
int AdvanceIovecs(iovec* iov, int count, int start, size_t n);

}  // namespace kvl::kv_internal
