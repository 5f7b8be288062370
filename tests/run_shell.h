// Running a command line to its end from a test: its exit code and what it printed. Any test
// layer may include it (it needs no define of the build).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace kvl::testing {

struct CommandResult {
  int exit_code;
  std::string output;  // stdout (a command that wants stderr too redirects it: 2>&1)
};

// Runs `command` through the shell; exit_code is -1 when it could not start or did not exit.
inline CommandResult RunShell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace kvl::testing
