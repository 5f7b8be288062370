#include "kvl/user_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvl {
namespace {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

StatusOr<int> OpenUserFile(const std::string& path, std::string_view what) {
  if (path.empty()) return InvalidArgumentError(fmt::format("{}: the path is empty", what));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = fmt::format("{} '{}': cannot open: {}", what, path, std::strerror(err));
    // ENOTDIR: a component of the path is a file, so this file does not exist either.
    return err == ENOENT || err == ENOTDIR ? NotFoundError(msg) : IoError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(fmt::format("{} '{}': cannot stat: {}", what, path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(fmt::format("{} '{}' is {}, not a regular file", what, path,
                                            FileKind(st.st_mode)));
  }
  // Regular files never block; clearing the flag keeps later reads ordinary.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

StatusOr<std::string> ReadUserFile(const std::string& path, std::string_view what,
                                   int64_t max_bytes) {
  KVL_ASSIGN_OR_RETURN(const int fd, OpenUserFile(path, what));
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > max_bytes) {
    ::close(fd);
    return InvalidArgumentError(fmt::format("{} '{}' has {} bytes, more than the {} allowed", what,
                                            path, static_cast<int64_t>(st.st_size), max_bytes));
  }
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return IoError(fmt::format("{} '{}': read failed: {}", what, path, std::strerror(err)));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(text.size()) + n > max_bytes) {  // the file grew while read
      ::close(fd);
      return InvalidArgumentError(
          fmt::format("{} '{}' is larger than the {} bytes allowed", what, path, max_bytes));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace kvl
