// The CLI tests run the built kvl (and a few tools beside it) through RunShell (run_shell.h).
#pragma once

#include <string>

#include "run_shell.h"
#include "test_paths.h"

namespace kvl::testing {

// The built kvl with `args`; its stderr joins the output when asked, else it is dropped.
inline CommandResult RunKvl(const std::string& args, bool with_stderr) {
  return RunShell(std::string(KVL_KVL_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace kvl::testing
