// Running a command line to its end from a test: its exit code and what it printed. The CLI tests
// run the built kvl (and a few tools beside it) this way.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "test_paths.h"

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

// The built kvl with `args`; its stderr joins the output when asked, else it is dropped.
inline CommandResult RunKvl(const std::string& args, bool with_stderr) {
  return RunShell(std::string(KVL_KVL_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace kvl::testing
