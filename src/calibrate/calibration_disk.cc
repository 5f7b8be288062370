// The disk part of calibration: sequential write and read of a scratch file in 1 MiB requests,
// then 4 KiB reads at random aligned offsets. Reads must come from the device, not the page
// cache, so the file is fsynced and dropped from the cache (posix_fadvise DONTNEED) before every
// read pass, and reads use O_DIRECT where the filesystem allows it.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <system_error>

#include "calibration_internal.h"
#include "kvl/temp_files.h"

namespace kvl::calibration_internal {
namespace {

constexpr int64_t kRequestBytes = int64_t{1} << 20;  // sequential request size
constexpr int64_t kPageBytes = 4096;                 // random read size and O_DIRECT alignment

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

AlignedBuffer AllocateAligned(int64_t bytes) {
  void* p = std::aligned_alloc(static_cast<size_t>(kPageBytes), static_cast<size_t>(bytes));
  KVL_CHECK(p != nullptr);
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

Status Errno(const std::string& what, const std::string& path) {
  return IoError(fmt::format("calibrate: {} '{}': {}", what, path, std::strerror(errno)));
}

// Closes the descriptor and removes the scratch file whatever way the test ends.
class ScratchFile {
 public:
  // Registered before it exists, so a signal at any point removes it (kvl/temp_files.h).
  explicit ScratchFile(std::string path) : path_(std::move(path)), guard_(path_) {}
  ~ScratchFile() {
    Close();
    ::unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  Status Open(int flags) {
    Close();
    fd_ = ::open(path_.c_str(), flags | O_CLOEXEC, 0600);
    if (fd_ < 0) return Errno("cannot open", path_);
    return Status::Ok();
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Writes back dirty pages and drops the file's cached pages, so the next read goes to disk.
  void DropCache() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

 private:
  std::string path_;
  TempFileGuard guard_;
  int fd_ = -1;
};

// Opens the file for reading, with O_DIRECT when the filesystem takes it (a first aligned read
// proves it: some filesystems accept the flag at open and fail the read). Returns whether
// O_DIRECT is in effect.
StatusOr<bool> OpenForReading(ScratchFile& file, uint8_t* aligned_page) {
  file.DropCache();
  if (file.Open(O_RDONLY | O_DIRECT).ok()) {
    if (::pread(file.fd(), aligned_page, kPageBytes, 0) == kPageBytes) return true;
  }
  KVL_RETURN_IF_ERROR(file.Open(O_RDONLY));
  return false;
}

Status WriteAll(int fd, const uint8_t* data, int64_t bytes, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, static_cast<size_t>(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("cannot write", path);
    data += n;
    bytes -= n;
  }
  return Status::Ok();
}

Status ReadAll(int fd, uint8_t* data, int64_t bytes, int64_t offset, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) return IoError(fmt::format("calibrate: '{}' ended early", path));
    data += n;
    bytes -= n;
    offset += n;
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> ResolveDiskDir(const std::string& dir) {
  std::error_code ec;
  const std::string resolved =
      dir.empty() ? std::filesystem::temp_directory_path(ec).string() : dir;
  if (ec) {
    const char* tmpdir = std::getenv("TMPDIR");
    return IoError(fmt::format(
        "calibrate: no temp directory for the disk measurement ({}: {}); set TMPDIR to an "
        "existing folder or pass --disk DIR",
        tmpdir != nullptr ? fmt::format("TMPDIR='{}'", tmpdir) : std::string("/tmp"),
        ec.message()));
  }
  if (!std::filesystem::exists(resolved, ec)) {
    return NotFoundError(fmt::format("calibrate: disk directory '{}' does not exist", resolved));
  }
  if (!std::filesystem::is_directory(resolved, ec)) {
    return InvalidArgumentError(fmt::format("calibrate: --disk '{}' is not a directory", resolved));
  }
  return resolved;
}

StatusOr<DiskMeasurement> MeasureDisk(const DiskTestOptions& options, StageProgress& progress) {
  DiskMeasurement m;
  KVL_ASSIGN_OR_RETURN(m.dir, ResolveDiskDir(options.dir));
  const int64_t requests =
      std::max<int64_t>(1, (options.bytes + kRequestBytes - 1) / kRequestBytes);
  m.bytes = requests * kRequestBytes;
  ScratchFile file(
      (std::filesystem::path(m.dir) / fmt::format("kvl-calibrate-{}.tmp", ::getpid())).string());

  // Random bytes, so a compressing or deduplicating filesystem cannot shortcut the writes.
  AlignedBuffer buffer = AllocateAligned(kRequestBytes);
  std::mt19937_64 rng(42);
  for (int64_t i = 0; i < kRequestBytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(buffer.get() + i, &r, sizeof(r));
  }

  std::vector<double> write_seconds, read_seconds;
  for (int rep = 0; rep < options.repetitions; ++rep) {
    KVL_RETURN_IF_ERROR(file.Open(O_WRONLY | O_CREAT | O_TRUNC));
    double t0 = NowSeconds();
    for (int64_t r = 0; r < requests; ++r) {
      // Vary each request a little so no two blocks are the same.
      std::memcpy(buffer.get(), &r, sizeof(r));
      KVL_RETURN_IF_ERROR(WriteAll(file.fd(), buffer.get(), kRequestBytes, file.path()));
    }
    if (::fsync(file.fd()) != 0) return Errno("cannot fsync", file.path());
    write_seconds.push_back(NowSeconds() - t0);
    file.Close();

    KVL_ASSIGN_OR_RETURN(m.read_direct, OpenForReading(file, buffer.get()));
    t0 = NowSeconds();
    for (int64_t r = 0; r < requests; ++r) {
      KVL_RETURN_IF_ERROR(
          ReadAll(file.fd(), buffer.get(), kRequestBytes, r * kRequestBytes, file.path()));
    }
    read_seconds.push_back(NowSeconds() - t0);
    file.Close();
    progress.Step();
  }
  m.write_gbps = static_cast<double>(m.bytes) / Median(write_seconds) / 1e9;
  m.read_gbps = static_cast<double>(m.bytes) / Median(read_seconds) / 1e9;

  // 4 KiB reads at random page-aligned offsets, each timed alone: the latency a page-in pays.
  KVL_ASSIGN_OR_RETURN(m.random_read_direct, OpenForReading(file, buffer.get()));
  const int64_t num_pages = m.bytes / kPageBytes;
  std::uniform_int_distribution<int64_t> page(0, num_pages - 1);
  std::vector<double> latencies_us;
  latencies_us.reserve(static_cast<size_t>(options.random_reads));
  for (int64_t i = 0; i < options.random_reads; ++i) {
    const int64_t offset = page(rng) * kPageBytes;
    const double t0 = NowSeconds();
    KVL_RETURN_IF_ERROR(ReadAll(file.fd(), buffer.get(), kPageBytes, offset, file.path()));
    latencies_us.push_back((NowSeconds() - t0) * 1e6);
  }
  file.Close();
  progress.Step();
  m.random_read_median_us = Median(latencies_us);
  m.random_read_p99_us = Percentile(latencies_us, 99);
  return m;
}

}  // namespace kvl::calibration_internal
