// Opening the disk tier's page file: whose file it is, whether its pages can be used, and the
// records that rebuild the index (format in disk_tier.h, rules in kv_tier.h under "ownership").
//
// The order matters. A path is opened without following links and without creating anything;
// only when nothing is there is a file created, with O_EXCL so that a file appearing meanwhile is
// never taken over. The lock is taken before the header is read, so two tiers never both decide
// to start one file empty. A file is changed only once its first bytes are the tier's magic; a
// file of the tier's own whose magic was damaged (or that is empty) is only renamed aside, never
// changed or removed, so that a restart needs no one to remove it by hand.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "disk_tier.h"
#include "kvl/kv_tier.h"

namespace kvl::kv_internal {
namespace {

// Closes the descriptor on every error path; Release() hands it on.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

uint64_t HeaderChecksum(FileHeader header, std::string_view identity) {
  header.checksum = 0;
  XXH3_state_t* state = XXH3_createState();
  KVL_CHECK(state != nullptr);
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &header, sizeof header);
  XXH3_64bits_update(state, identity.data(), identity.size());
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

uint64_t NewEpoch() {
  std::random_device device;
  const uint64_t now = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t epoch = (static_cast<uint64_t>(device()) << 32 | device()) ^ now ^
                   (static_cast<uint64_t>(::getpid()) << 17);
  return epoch == 0 ? 1 : epoch;
}

// An identity as a message can show it: the text when it is short and printable, else its size
// and hash.
std::string DescribeIdentity(std::string_view identity) {
  const bool printable = std::all_of(identity.begin(), identity.end(), [](char c) {
    return c >= 0x20 && c < 0x7f;
  });
  if (identity.empty()) return "none";
  if (printable && identity.size() <= 120) return fmt::format("'{}'", identity);
  return fmt::format("{} bytes, hash {:016x}", identity.size(),
                     XXH3_64bits(identity.data(), identity.size()));
}

Status OsError(std::string_view what, const std::string& path, int error) {
  return IoError(fmt::format("disk tier: {} {}: {}", what, path, std::strerror(error)));
}

// Reads exactly n bytes at offset, or fewer at the end of the file; retries EINTR.
StatusOr<int64_t> ReadAt(int fd, void* out, int64_t n, int64_t offset, const std::string& path) {
  int64_t total = 0;
  while (total < n) {
    const ssize_t got = ::pread(fd, static_cast<uint8_t*>(out) + total,
                                static_cast<size_t>(n - total), offset + total);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return OsError("cannot read", path, errno);
    if (got == 0) break;
    total += got;
  }
  return total;
}

Status WriteAt(int fd, const void* bytes, int64_t n, int64_t offset, const std::string& path) {
  int64_t total = 0;
  while (total < n) {
    const ssize_t put = ::pwrite(fd, static_cast<const uint8_t*>(bytes) + total,
                                 static_cast<size_t>(n - total), offset + total);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return OsError("cannot write", path, put < 0 ? errno : EIO);
    total += put;
  }
  return Status::Ok();
}

// Why a file of ours cannot be used as it is, or "" when it can.
std::string UnusableBecause(const std::vector<uint8_t>& block, int64_t got,
                            const DiskTierOptions& options) {
  if (got < static_cast<int64_t>(sizeof(FileHeader))) return "its header is cut short";
  FileHeader header;
  std::memcpy(&header, block.data(), sizeof header);
  if (header.format_version != kDiskFormatVersion) {
    return fmt::format("it is in format version {}, this build reads version {}",
                       header.format_version, kDiskFormatVersion);
  }
  if (header.identity_bytes > kMaxDiskTierIdentityBytes ||
      got < static_cast<int64_t>(sizeof header + header.identity_bytes) ||
      header.header_bytes != kFileHeaderBytes) {
    return "its header is damaged";
  }
  const std::string_view identity(reinterpret_cast<const char*>(block.data()) + sizeof header,
                                  header.identity_bytes);
  if (HeaderChecksum(header, identity) != header.checksum) {
    return "its header is damaged (checksum mismatch)";
  }
  if (header.page_bytes != static_cast<uint64_t>(options.page_bytes)) {
    return fmt::format("it holds pages of {} bytes, this tier's are {}", header.page_bytes,
                       options.page_bytes);
  }
  if (identity != options.identity) {
    return fmt::format("it was written for another identity ({}; this tier's is {})",
                       DescribeIdentity(identity), DescribeIdentity(options.identity));
  }
  return "";
}

// The records of every slot that fits in the file, below num_slots.
StatusOr<std::vector<FoundSlot>> ScanSlots(int fd, const std::string& path,
                                           const DiskTierOptions& options, uint64_t epoch,
                                           int64_t file_bytes, int64_t num_slots) {
  const int64_t slot_bytes = DiskSlotBytes(options.page_bytes);
  std::vector<FoundSlot> found;
  for (int64_t s = 0; s < num_slots; ++s) {
    const int64_t offset = DiskSlotOffset(s, slot_bytes);
    if (offset + kSlotHeaderBytes + options.page_bytes > file_bytes) break;
    SlotHeader record;
    KVL_ASSIGN_OR_RETURN(const int64_t got, ReadAt(fd, &record, sizeof record, offset, path));
    if (got != static_cast<int64_t>(sizeof record) || record.magic != kSlotMagic ||
        record.record_checksum != SlotRecordChecksum(record) || record.epoch != epoch ||
        record.page_bytes != static_cast<uint64_t>(options.page_bytes)) {
      continue;  // never written, or torn: a free slot
    }
    found.push_back({s, record.key, record.generation, record.checksum});
  }
  // A key in two slots (a crash between writing its new page and forgetting the old one): the
  // newer generation wins.
  std::unordered_map<PageKey, size_t> newest;
  for (size_t i = 0; i < found.size(); ++i) {
    auto [it, inserted] = newest.try_emplace(found[i].key, i);
    if (!inserted && found[it->second].generation < found[i].generation) it->second = i;
  }
  std::vector<FoundSlot> kept;
  kept.reserve(newest.size());
  for (size_t i = 0; i < found.size(); ++i) {
    if (newest[found[i].key] == i) kept.push_back(found[i]);
  }
  return kept;
}

// Why a file whose first bytes are not the tier's magic is still the tier's own, damaged, rather
// than someone else's file named by mistake (which is never touched): it is empty, its first bytes
// are the magic cut short, its magic differs in at most two bytes, the rest of its header is the
// tier's, or its first slot's record is. "" when none holds.
std::string DamagedTierFileBecause(int fd, const std::vector<uint8_t>& block, int64_t got,
                                   int64_t file_bytes, const std::string& path) {
  if (file_bytes == 0) return "it is empty";
  const int64_t magic_bytes = std::min<int64_t>(got, sizeof kFileMagic);
  int64_t differ = static_cast<int64_t>(sizeof kFileMagic) - magic_bytes;
  for (int64_t i = 0; i < magic_bytes; ++i) differ += block[size_t(i)] != kFileMagic[i];
  if (got < static_cast<int64_t>(sizeof kFileMagic) && differ == int64_t(sizeof kFileMagic) - got) {
    return "it is shorter than the tier's magic";
  }
  if (differ <= 2) return "its magic is damaged";
  if (got >= static_cast<int64_t>(sizeof(FileHeader))) {
    FileHeader header;
    std::memcpy(&header, block.data(), sizeof header);
    if (header.format_version == kDiskFormatVersion && header.header_bytes == kFileHeaderBytes &&
        header.page_bytes > 0 && header.page_bytes < (1ull << 40) &&
        header.slot_bytes == static_cast<uint64_t>(DiskSlotBytes(int64_t(header.page_bytes)))) {
      return "its magic is damaged (the rest of its header is the tier's)";
    }
  }
  SlotHeader record;
  const StatusOr<int64_t> read = ReadAt(fd, &record, sizeof record, kFileHeaderBytes, path);
  if (read.ok() && *read == static_cast<int64_t>(sizeof record) && record.magic == kSlotMagic &&
      record.record_checksum == SlotRecordChecksum(record)) {
    return "its header is damaged (its first slot is the tier's)";
  }
  return "";
}

// Renames the file at `path` to PATH.damaged-<UTC time>[-n], a name that holds nothing yet (a
// file there is never replaced); returns the new name.
StatusOr<std::string> RenameAside(const std::string& path) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  for (int n = 0; n < 100; ++n) {
    const std::string aside = n == 0 ? fmt::format("{}.damaged-{}", path, stamp)
                                     : fmt::format("{}.damaged-{}-{}", path, stamp, n);
    if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, aside.c_str(), RENAME_NOREPLACE) == 0) {
      return aside;
    }
    if (errno == EEXIST) continue;
    if (errno != EINVAL) return OsError("cannot rename aside", path, errno);
    // A filesystem without RENAME_NOREPLACE: a name nothing holds, then a plain rename.
    struct stat st;
    if (::lstat(aside.c_str(), &st) == 0) continue;
    if (::rename(path.c_str(), aside.c_str()) == 0) return aside;
    return OsError("cannot rename aside", path, errno);
  }
  return IoError(fmt::format("disk tier: cannot rename {} aside: 100 names taken", path));
}

// The slots the tier gets: `num_slots`, or as many as the filesystem has room for, counting the
// blocks the file holds already (reused); the note says so. An error naming both sizes where not
// one slot fits. Unknown free space (fstatvfs failed) takes what was asked.
StatusOr<int64_t> SlotsThatFit(int fd, const struct stat& st, const std::string& path,
                               int64_t slot_bytes, int64_t num_slots, std::string* note) {
  struct statvfs vfs;
  if (::fstatvfs(fd, &vfs) != 0) return num_slots;
  const int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  const int64_t room = free_bytes + static_cast<int64_t>(st.st_blocks) * 512;
  const int64_t asked = kFileHeaderBytes + num_slots * slot_bytes;
  if (asked <= room) return num_slots;
  const int64_t fit = (room - kFileHeaderBytes) / slot_bytes;
  if (fit < 1) {
    return InvalidArgumentError(fmt::format(
        "disk tier {}: the tier asks for {} bytes but its filesystem has {} bytes free, not one "
        "slot of {} bytes: free space there, or name a file on another filesystem",
        path, asked, room, slot_bytes));
  }
  *note = fmt::format(
      "; shrunk to {} slots ({} bytes): the tier asked for {} bytes but its filesystem has {} "
      "bytes free",
      fit, kFileHeaderBytes + fit * slot_bytes, asked, room);
  return fit;
}

// O_DIRECT on an open descriptor, probed with an aligned rewrite of the header block (its own
// bytes) because some filesystems accept the flag and refuse the first aligned transfer.
bool EnableDirectIo(int fd, std::string* refused) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) {
    *refused = std::strerror(errno);
    return false;
  }
  void* block = std::aligned_alloc(kDiskAlignment, kDiskAlignment);
  KVL_CHECK_MSG(block != nullptr, "out of memory for a disk tier probe");
  bool ok = ::pread(fd, block, kDiskAlignment, 0) == kDiskAlignment &&
            ::pwrite(fd, block, kDiskAlignment, 0) == kDiskAlignment;
  if (!ok) {
    *refused = std::strerror(errno);
    ::fcntl(fd, F_SETFL, flags);
  }
  std::free(block);
  return ok;
}

}  // namespace

uint64_t SlotRecordChecksum(const SlotHeader& record) {
  return XXH3_64bits(&record, offsetof(SlotHeader, record_checksum));
}

StatusOr<OpenedDiskFile> OpenDiskFile(const DiskTierOptions& options, int64_t asked_slots) {
  const std::string& path = options.path;
  if (static_cast<int64_t>(options.identity.size()) > kMaxDiskTierIdentityBytes) {
    return InvalidArgumentError(fmt::format("disk tier {}: the identity has {} bytes, at most {}",
                                            path, options.identity.size(),
                                            kMaxDiskTierIdentityBytes));
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec)) {
    return InvalidArgumentError(
        fmt::format("disk tier {}: directory {} does not exist", path, dir.string()));
  }
  // Refused before any open: a link (never followed) and anything but a regular file.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return InvalidArgumentError(fmt::format(
          "disk tier: {} is a symbolic link; the tier does not follow links (name the file "
          "itself, or a new path)",
          path));
    }
    if (!S_ISREG(st.st_mode)) {
      return InvalidArgumentError(
          fmt::format("disk tier: {} exists and is not a regular file", path));
    }
  }

  bool created = false;
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) {  // created by someone else meanwhile: treat it as existing
      fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    }
  }
  if (fd < 0) {
    if (errno == ELOOP) {
      return InvalidArgumentError(fmt::format(
          "disk tier: {} is a symbolic link; the tier does not follow links", path));
    }
    return OsError(created ? "cannot create" : "cannot open", path, errno);
  }
  FdCloser closer(fd);
  // A file this call created and then cannot use is removed again; nothing else ever is.
  auto fail = [&](Status status) -> Status {
    if (created) ::unlink(path.c_str());
    return status;
  };
  if (::fstat(fd, &st) != 0) return fail(OsError("cannot stat", path, errno));
  if (!S_ISREG(st.st_mode)) {
    return fail(InvalidArgumentError(
        fmt::format("disk tier: {} exists and is not a regular file", path)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return IoError(fmt::format(
          "disk tier: {} is in use: another KV tier (in this or another process) holds its lock; "
          "give each process its own path",
          path));
    }
    return fail(OsError("cannot lock", path, errno));
  }

  OpenedDiskFile file;
  file.device = static_cast<uint64_t>(st.st_dev);
  file.inode = static_cast<uint64_t>(st.st_ino);
  const int64_t slot_bytes = DiskSlotBytes(options.page_bytes);
  std::string shrunk_note;
  const StatusOr<int64_t> fit =
      SlotsThatFit(fd, st, path, slot_bytes, asked_slots, &shrunk_note);
  if (!fit.ok()) return fail(fit.status());
  const int64_t num_slots = file.num_slots = *fit;
  std::string start_empty_because;
  if (created) {
    file.note = "created";
  } else {
    std::vector<uint8_t> block(static_cast<size_t>(kFileHeaderBytes), 0);
    KVL_ASSIGN_OR_RETURN(const int64_t got, ReadAt(fd, block.data(), kFileHeaderBytes, 0, path));
    if (got < static_cast<int64_t>(sizeof kFileMagic) ||
        std::memcmp(block.data(), kFileMagic, sizeof kFileMagic) != 0) {
      const std::string damaged =
          DamagedTierFileBecause(fd, block, got, static_cast<int64_t>(st.st_size), path);
      if (!damaged.empty()) {
        // The tier's own file, damaged: kept for whoever wants to look at it, out of the way of
        // a fresh one.
        KVL_ASSIGN_OR_RETURN(const std::string aside, RenameAside(path));
        ::close(closer.Release());  // its lock goes with it
        KVL_ASSIGN_OR_RETURN(OpenedDiskFile fresh, OpenDiskFile(options, asked_slots));
        fresh.note += fmt::format(" (the file there was damaged: {}; renamed it to {})", damaged,
                                  aside);
        return fresh;
      }
      return InvalidArgumentError(fmt::format(
          "disk tier: {} is not a kvlattice KV tier file (it does not start with the tier's "
          "header), so it is left as it is; name a new path, or remove the file yourself",
          path));
    }
    start_empty_because = UnusableBecause(block, got, options);
    if (start_empty_because.empty() && !options.persistent) {
      start_empty_because = "a scratch tier starts empty";
    }
    if (start_empty_because.empty()) {
      FileHeader header;
      std::memcpy(&header, block.data(), sizeof header);
      file.epoch = header.epoch;
      KVL_ASSIGN_OR_RETURN(file.found, ScanSlots(fd, path, options, file.epoch,
                                                 static_cast<int64_t>(st.st_size), num_slots));
      file.note = fmt::format("reopened with {} pages", file.found.size());
      // A smaller capacity than last time: the slots past it go.
      const int64_t end = DiskSlotOffset(num_slots, slot_bytes);
      if (st.st_size > end && ::ftruncate(fd, end) != 0) {
        return OsError("cannot shorten", path, errno);
      }
    } else {
      file.note = "started empty: " + start_empty_because;
    }
  }
  if (created || !start_empty_because.empty()) {
    // Emptied first: a crash before the new header is written leaves the old header over no
    // slots, which reopens as an empty tier.
    if (!created && ::ftruncate(fd, 0) != 0) return OsError("cannot truncate", path, errno);
    std::vector<uint8_t> block(static_cast<size_t>(kFileHeaderBytes), 0);
    FileHeader header;
    std::memcpy(header.magic, kFileMagic, sizeof kFileMagic);
    header.format_version = kDiskFormatVersion;
    header.header_bytes = kFileHeaderBytes;
    header.page_bytes = static_cast<uint64_t>(options.page_bytes);
    header.slot_bytes = static_cast<uint64_t>(slot_bytes);
    header.epoch = file.epoch = NewEpoch();
    header.identity_bytes = static_cast<uint32_t>(options.identity.size());
    header.checksum = HeaderChecksum(header, options.identity);
    std::memcpy(block.data(), &header, sizeof header);
    std::memcpy(block.data() + sizeof header, options.identity.data(), options.identity.size());
    const Status written = WriteAt(fd, block.data(), kFileHeaderBytes, 0, path);
    if (!written.ok()) return fail(written);
  }
  file.note += shrunk_note;
  if (!options.persistent) file.temp_guard = TempFileGuard(path);
  if (options.direct_io) file.direct = EnableDirectIo(fd, &file.direct_refused);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  file.fd = closer.Release();
  return file;
}

}  // namespace kvl::kv_internal
