// The read pattern of a decode step that streams its history from a direct-I/O disk tier: P
// pages, each written as one batch of L layer pages, then read back layer by layer (one Get of
// layer l of every page, as KvLayerStreamer::IssueLayerRead asks), through io_uring and through
// one preadv after another. Prints ms per step, GB/s and read requests per step for each; the
// bytes are checked against what was written.
//
// Usage: disk_stream_bench [--dir=/tmp] [--pages=120] [--layers=22] [--layer-bytes=32768]
//                          [--steps=8]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "kv/tiers/disk_tier.h"
#include "kvl/kv_tier.h"

namespace {

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::stoll(argv[i] + prefix.size());
  }
  return fallback;
}

std::string Dir(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--dir=", 6) == 0) return argv[i] + 6;
  }
  return "/tmp";
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t pages = Flag(argc, argv, "pages", 120);
  const int64_t layers = Flag(argc, argv, "layers", 22);
  const int64_t layer_bytes = Flag(argc, argv, "layer-bytes", 32768);
  const int64_t steps = Flag(argc, argv, "steps", 8);
  std::printf("%lld pages x %lld layers of %lld bytes, read one layer of every page at a time, "
              "%lld steps\n\n| reads | ms per step | GB/s | requests per step |\n| :-- | --: | --: | --: |\n",
              static_cast<long long>(pages), static_cast<long long>(layers),
              static_cast<long long>(layer_bytes), static_cast<long long>(steps));
  for (bool io_uring : {false, true}) {
    const std::string path =
        Dir(argc, argv) + "/kvl-disk-stream-bench-" + std::to_string(::getpid()) + ".pages";
    auto made = kvl::MakeDiskTier({.path = path,
                                   .capacity_bytes = (pages * layers + 16) * (layer_bytes + 4096),
                                   .page_bytes = layer_bytes,
                                   .direct_io = true,
                                   .persistent = false,
                                   .io_uring = io_uring});
    if (!made.ok()) {
      std::fprintf(stderr, "disk_stream_bench: %s\n", made.status().ToString().c_str());
      return 1;
    }
    kvl::DiskKvTier& tier = **made;
    std::mt19937_64 rng(7);
    std::vector<uint8_t> bytes(static_cast<size_t>(layer_bytes));
    for (int64_t p = 0; p < pages; ++p) {
      std::vector<std::vector<uint8_t>> page(static_cast<size_t>(layers));
      std::vector<kvl::PageWrite> writes;
      for (int64_t l = 0; l < layers; ++l) {
        page[l].resize(static_cast<size_t>(layer_bytes));
        for (auto& b : page[l]) b = static_cast<uint8_t>(rng());
        writes.push_back({static_cast<kvl::PageKey>(p << 8 | l), page[l]});
      }
      if (!tier.Put(writes).ok()) return 1;
    }
    std::vector<uint8_t> staging(static_cast<size_t>(pages * layer_bytes));
    const int64_t ops_before = tier.stats().read_ops;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t l = 0; l < layers; ++l) {
        std::vector<kvl::PageRead> reads;
        for (int64_t p = 0; p < pages; ++p) {
          reads.push_back({static_cast<kvl::PageKey>(p << 8 | l),
                           std::span<uint8_t>(staging.data() + p * layer_bytes,
                                              static_cast<size_t>(layer_bytes))});
        }
        for (const kvl::Status& st : tier.GetAsync(std::move(reads)).get()) {
          if (!st.ok()) {
            std::fprintf(stderr, "disk_stream_bench: %s\n", st.ToString().c_str());
            return 1;
          }
        }
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const double step_ms = ms / static_cast<double>(steps);
    const double step_bytes = static_cast<double>(pages * layers * layer_bytes);
    const std::string how = dynamic_cast<const kvl::kv_internal::DiskTierInfo&>(tier).read_path();
    std::printf("| %s | %.1f | %.2f | %lld |\n", how.c_str(),
                step_ms, step_bytes / (step_ms * 1e6),
                static_cast<long long>((tier.stats().read_ops - ops_before) / steps));
  }
  return 0;
}
