// A small filesystem for the tests of a full disk (issue 37): a tmpfs of a few hundred KiB
// mounted in a mount namespace of this test process's own, so that nothing outside the process
// ever sees it and it goes when the process does. Needs CAP_SYS_ADMIN (root, or a user namespace
// that allows mounts); without it, `skip_reason` says why and the test skips.
#pragma once

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace kvl::testing {

class SmallFilesystem {
 public:
  // A tmpfs of `bytes` at a fresh folder under `parent`.
  SmallFilesystem(const std::string& parent, int64_t bytes) {
    // Mounts made from here on are this process's alone, and never propagate back.
    if (::unshare(CLONE_NEWNS) != 0) {
      skip_reason_ = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno) +
                     " (a mount namespace needs CAP_SYS_ADMIN and a single-threaded process)";
      return;
    }
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      skip_reason_ = std::string("making / private: ") + std::strerror(errno);
      return;
    }
    dir_ = parent + "/kvl-small-fs-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    const std::string size = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, size.c_str()) != 0) {
      skip_reason_ = std::string("mount -t tmpfs -o ") + size + ": " + std::strerror(errno);
      std::filesystem::remove(dir_);
      dir_.clear();
      return;
    }
    mounted_ = true;
  }
  ~SmallFilesystem() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  SmallFilesystem(const SmallFilesystem&) = delete;
  SmallFilesystem& operator=(const SmallFilesystem&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string skip_reason_;
};

}  // namespace kvl::testing
