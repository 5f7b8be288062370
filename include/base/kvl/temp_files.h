// Temporary files removed on every exit path, signals included. Whoever creates a temporary file
// (the disk tier's page file, calibration's scratch file, a profile being written) holds a
// TempFileGuard for it; destructors remove the file on normal exits, and the one signal path
// (InstallTempFileCleanup) removes every registered file when SIGINT, SIGTERM, SIGHUP or SIGQUIT
// ends the process, then lets the signal take its default action, so the exit status still says
// which signal it was.
//
// The registry is a fixed table of paths written before a file is published and read by the
// handler with async-signal-safe calls only (atomic loads, unlink). Thread-safe.
#pragma once

#include <string>

namespace kvl {

class TempFileGuard {
 public:
  TempFileGuard() = default;
  // Registers `path` for removal by the signal handler; a path too long for the table or a full
  // table leaves it unregistered (it is still removed by its owner on normal exits).
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard() { Release(); }
  TempFileGuard(TempFileGuard&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  TempFileGuard& operator=(TempFileGuard&& other) noexcept;
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

  bool registered() const { return slot_ >= 0; }
  // Unregisters the path without removing the file (the owner removes it, or keeps it).
  void Release();

 private:
  int slot_ = -1;
};

// Installs the handler for SIGINT, SIGTERM, SIGHUP and SIGQUIT (not for a signal the process
// was started with ignored, as under nohup). Programs call it once at startup; libraries never do.
void InstallTempFileCleanup();

}  // namespace kvl
