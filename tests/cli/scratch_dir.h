// What the bench tests share beside running kvl (run_command.h): a scratch directory of their own
// for the files a bench writes, and the python that draws the figures.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "run_command.h"

namespace kvl::testing {

// A fresh directory per test (named after `prefix` and the process), removed after it.
class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / (prefix_ + "-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string prefix_;
  std::filesystem::path dir_;
};

// The first python3 that has matplotlib (PATH's may be another than Debian's, which `make test`
// installs it for); empty when there is none.
inline std::string PythonWithMatplotlib() {
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    if (RunShell(std::string(candidate) + " -c 'import matplotlib' 2>/dev/null").exit_code == 0) {
      return candidate;
    }
  }
  return "";
}

}  // namespace kvl::testing
