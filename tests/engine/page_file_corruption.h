// Corrupting a disk tier's page file behind its back, for the tests that show a bad page is caught
// by its checksum and recomputed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace kvl::testing {

// Flips one byte in every 4 KiB of the file, from byte `first` on: every slot written so far is
// hit. Returns how many bytes were flipped (0 when the file cannot be opened).
inline int CorruptEvery4KiB(const std::string& path, off_t first) {
  const int fd = open(path.c_str(), O_RDWR);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return 0;
  int flipped = 0;
  const off_t size = lseek(fd, 0, SEEK_END);
  for (off_t off = first; off < size; off += 4096) {
    char byte;
    EXPECT_EQ(pread(fd, &byte, 1, off), 1);
    byte = static_cast<char>(byte ^ 0x5A);
    EXPECT_EQ(pwrite(fd, &byte, 1, off), 1);
    ++flipped;
  }
  close(fd);
  return flipped;
}

}  // namespace kvl::testing
