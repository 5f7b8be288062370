// `kvl serve` under the failures a hostile or unlucky user meets: a model that cannot load, a KV
// budget too small for what is asked, pressure that once made a request livelock.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server_process.h"
#include "test_paths.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;

// stories260K with its `general.architecture` value renamed: a well-formed GGUF of an
// architecture the engine does not run.
std::string UnsupportedArchitectureModel() {
  std::ifstream in(testing::Stories260KPath(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "general.architecture";
  const size_t at = bytes.find(key);
  EXPECT_NE(at, std::string::npos);
  // key, then the value's type (u32) and length (u64), then "llama".
  const size_t value = at + key.size() + 4 + 8;
  EXPECT_EQ(bytes.substr(value, 5), "llama");
  bytes.replace(value, 5, "zzzzz");
  const std::string path =
      ::testing::TempDir() + "kvl_unsupported_arch_" + std::to_string(::getpid()) + ".gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A load that fails at once used to race the listener thread's start: the stop came before the
// accept loop and was lost, and the server answered 503 "loading model" forever while SIGTERM
// stayed blocked. Every start must now exit non-zero with the error, also beside busy threads.
TEST(ServeLoadTest, AFailedLoadExitsNonzeroWithTheErrorEveryTime) {
  const std::string model = UnsupportedArchitectureModel();
  std::atomic<bool> busy{true};
  std::vector<std::thread> burners;
  for (int i = 0; i < 2; ++i) {
    burners.emplace_back([&busy] {
      volatile uint64_t x = 0;
      while (busy.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  int hung = 0;
  for (int run = 0; run < 12; ++run) {
    ServerProcess server(model, {});
    const int status = server.WaitExit(/*seconds=*/15);
    if (status == -1) ++hung;
    EXPECT_EQ(status, 1) << "run " << run << ":\n" << server.Log();
    EXPECT_NE(server.Log().find("architecture 'zzzzz'"), std::string::npos) << server.Log();
  }
  busy = false;
  for (std::thread& t : burners) t.join();
  EXPECT_EQ(hung, 0);
  std::remove(model.c_str());
}

}  // namespace
}  // namespace kvl
