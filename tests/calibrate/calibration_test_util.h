// What the calibration tests share: stories260K loaded once with a 2-thread pool (as the engine
// passes its own), quick calibration options, and temp files of this test process.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "kvl/calibration.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"
#include "test_paths.h"

namespace kvl::testing {

struct LoadedModel {
  std::unique_ptr<Model> model;
  ThreadPool pool{2};
  ops::OpsContext ctx{ops::BestIsa(), &pool};
};

// Loaded on first use, kept for the test binary.
inline LoadedModel& Stories260K() {
  static LoadedModel* loaded = [] {
    auto* l = new LoadedModel;
    StatusOr<std::unique_ptr<Model>> m = Model::Load(Stories260KPath());
    KVL_CHECK_MSG(m.ok(), m.status().ToString().c_str());
    l->model = std::move(*m);
    return l;
  }();
  return *loaded;
}

// A quick calibration sized to run in about a second on stories260K.
inline CalibrateOptions TinyCalibrateOptions() {
  CalibrateOptions o;
  o.disk_dir = ::testing::TempDir();
  o.quick = true;
  o.memory_bytes = 16 << 20;
  o.disk_bytes = 4 << 20;
  o.random_reads = 64;
  o.repetitions = 3;
  o.disk_repetitions = 1;
  o.min_sample_seconds = 0.002;
  return o;
}

inline std::string TempPrefix() { return "kvl-calibration-test-" + std::to_string(::getpid()) + "-"; }

// A path in the temp dir unique to this process and name (ctest runs test binaries in parallel).
inline std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / (TempPrefix() + name)).string();
}

// Removes this process's TempPath files when the test program ends, so runs leave nothing behind.
class TempPathCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir(), ec)) {
      if (entry.path().filename().string().rfind(TempPrefix(), 0) == 0) {
        std::filesystem::remove_all(entry.path(), ec);
      }
    }
  }
};
inline ::testing::Environment* const kTempPathCleanup =
    ::testing::AddGlobalTestEnvironment(new TempPathCleanup);

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kvl::testing
