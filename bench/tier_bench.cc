// KV tier transfer throughput and latency at the page sizes of real models: one page is the K and
// V of every layer for a 16-token block. For each page size, tier and batch size it writes a
// working set with Put, reads it back with Get (in the same batches), and reports GB/s and the
// per-batch latency (median and p99). The cost model's "demote" inputs are these numbers.
//
// Tiers: ram, ram:zstd, disk (buffered; reads hit the page cache the writes just filled),
// disk-cold (buffered; the file is flushed and dropped from the page cache before reading),
// disk:direct (O_DIRECT; both directions go to the device).
//
// Usage: tier_bench [--json] [--dir=/tmp] [--total-mib=128] [--page=NAME]...
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvl/kv_tier.h"

namespace {

using kvl::KvTier;
using kvl::PageKey;
using kvl::PageRead;
using kvl::PageWrite;
using kvl::Status;

struct PageShape {
  const char* name;
  int64_t bytes;
  bool f16;  // element type of the KV, for realistic (barely compressible) contents
};

// 16-token blocks: stories260K (5 layers x 2 x 64 dim x f32), TinyLlama-1.1B (22 layers x 2 x
// 256 kv dim x f32), Llama-2-7B (32 layers x 2 x 4096 kv dim x f16).
constexpr PageShape kShapes[] = {
    {"stories260K", 20480, false},
    {"tinyllama-f32", 16ll * 22 * 2 * 256 * 4, false},
    {"llama2-7b-f16", 16ll * 32 * 2 * 4096 * 2, true},
};

struct TierKind {
  const char* name;
  bool disk;
  bool compress;
  bool direct;
  bool cold;
};
constexpr TierKind kTiers[] = {
    {"ram", false, false, false, false},       {"ram:zstd", false, true, false, false},
    {"disk", true, false, false, false},       {"disk-cold", true, false, false, true},
    {"disk:direct", true, false, true, false},
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// KV-like contents: normally distributed values, stored as f32 or f16.
std::vector<uint8_t> MakePage(int64_t bytes, bool f16, uint32_t seed) {
  std::vector<uint8_t> page(static_cast<size_t>(bytes));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  if (f16) {
    for (int64_t i = 0; i + 2 <= bytes; i += 2) {
      const _Float16 h = static_cast<_Float16>(dist(rng));
      std::memcpy(&page[i], &h, 2);
    }
  } else {
    for (int64_t i = 0; i + 4 <= bytes; i += 4) {
      const float f = dist(rng);
      std::memcpy(&page[i], &f, 4);
    }
  }
  return page;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[i];
}

// Flushes the file and drops it from the page cache, so the next reads come from the device.
void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Row {
  std::string page, tier, tier_name;
  int64_t page_bytes = 0;
  int batch = 0;
  int64_t pages = 0;
  double write_gbs = 0, read_gbs = 0;
  double write_ms_p50 = 0, write_ms_p99 = 0, read_ms_p50 = 0, read_ms_p99 = 0;
  double stored_ratio = 1;  // stored bytes / page bytes
  int64_t write_ops = 0, read_ops = 0;
  std::string error;
};

Row Measure(const PageShape& shape, const TierKind& kind, int batch, int64_t total_bytes,
            const std::string& dir) {
  Row row;
  row.page = shape.name;
  row.tier = kind.name;
  row.page_bytes = shape.bytes;
  row.batch = batch;
  // At least 8 batches, at most 4096, about total_bytes in all.
  const int64_t num_batches = std::clamp<int64_t>(total_bytes / (shape.bytes * batch), 8, 4096);
  const int64_t num_pages = num_batches * batch;
  row.pages = num_pages;
  // 8 distinct source pages, reused round-robin (contents matter only for zstd).
  std::vector<std::vector<uint8_t>> sources;
  for (uint32_t s = 0; s < 8; ++s) sources.push_back(MakePage(shape.bytes, shape.f16, s + 1));

  std::unique_ptr<KvTier> tier;
  const std::string path = dir + "/tier_bench_" + std::to_string(::getpid()) + ".pages";
  const int64_t capacity = num_pages * (shape.bytes + 8192) + (1 << 20);
  if (kind.disk) {
    auto made = kvl::MakeDiskTier({.path = path,
                                   .capacity_bytes = capacity,
                                   .page_bytes = shape.bytes,
                                   .direct_io = kind.direct,
                                   .persistent = false});
    if (!made.ok()) {
      row.error = made.status().ToString();
      return row;
    }
    tier = std::move(made).value();
  } else {
    tier = kvl::MakeRamTier({.capacity_bytes = capacity, .compress = kind.compress});
  }
  row.tier_name = std::string(tier->name());

  std::vector<double> write_s, read_s;
  std::vector<PageWrite> writes(static_cast<size_t>(batch));
  for (int64_t b = 0; b < num_batches; ++b) {
    for (int i = 0; i < batch; ++i) {
      const int64_t p = b * batch + i;
      writes[i] = {static_cast<PageKey>(p), sources[p % sources.size()]};
    }
    const double t0 = Now();
    const Status s = tier->Put(writes);
    write_s.push_back(Now() - t0);
    if (!s.ok()) {
      row.error = s.ToString();
      return row;
    }
  }
  if (kind.cold) DropCache(path);

  std::vector<std::vector<uint8_t>> outs(static_cast<size_t>(batch),
                                         std::vector<uint8_t>(shape.bytes));
  std::vector<PageRead> reads(static_cast<size_t>(batch));
  for (int64_t b = 0; b < num_batches; ++b) {
    for (int i = 0; i < batch; ++i) reads[i] = {static_cast<PageKey>(b * batch + i), outs[i]};
    const double t0 = Now();
    const std::vector<Status> results = tier->Get(reads);
    read_s.push_back(Now() - t0);
    for (const Status& s : results) {
      if (!s.ok()) {
        row.error = s.ToString();
        return row;
      }
    }
    if (b == 0 && outs[0] != sources[0]) {
      row.error = "read back different bytes";
      return row;
    }
  }
  const kvl::TierStats stats = tier->stats();
  double write_total = 0, read_total = 0;
  for (double t : write_s) write_total += t;
  for (double t : read_s) read_total += t;
  const double bytes = static_cast<double>(num_pages * shape.bytes);
  row.write_gbs = bytes / write_total / 1e9;
  row.read_gbs = bytes / read_total / 1e9;
  row.write_ms_p50 = 1e3 * Percentile(write_s, 0.5);
  row.write_ms_p99 = 1e3 * Percentile(write_s, 0.99);
  row.read_ms_p50 = 1e3 * Percentile(read_s, 0.5);
  row.read_ms_p99 = 1e3 * Percentile(read_s, 0.99);
  row.stored_ratio = static_cast<double>(stats.bytes_used) / bytes;
  row.write_ops = stats.write_ops;
  row.read_ops = stats.read_ops;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string dir = "/tmp";
  int64_t total_mib = 128;
  std::vector<std::string> only_pages;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strncmp(argv[i], "--dir=", 6) == 0) {
      dir = argv[i] + 6;
    } else if (std::strncmp(argv[i], "--total-mib=", 12) == 0) {
      total_mib = std::max(1, std::atoi(argv[i] + 12));
    } else if (std::strncmp(argv[i], "--page=", 7) == 0) {
      only_pages.push_back(argv[i] + 7);
    } else {
      std::fprintf(stderr,
                   "usage: tier_bench [--json] [--dir=/tmp] [--total-mib=128] [--page=NAME]...\n");
      return 2;
    }
  }

  std::vector<Row> rows;
  if (!json) {
    std::printf(
        "| page | page bytes | tier | batch | pages | write GB/s | read GB/s | write ms/batch p50 "
        "(p99) "
        "| read ms/batch p50 (p99) | stored/raw | write ops | read ops |\n");
    std::printf("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  for (const PageShape& shape : kShapes) {
    if (!only_pages.empty() &&
        std::find(only_pages.begin(), only_pages.end(), shape.name) == only_pages.end())
      continue;
    for (const TierKind& kind : kTiers) {
      for (int batch : {1, 16}) {
        Row row = Measure(shape, kind, batch, total_mib << 20, dir);
        if (!json) {
          if (!row.error.empty()) {
            std::printf("| %s | %lld | %s | %d | error: %s |\n", row.page.c_str(),
                        (long long)row.page_bytes, row.tier.c_str(), row.batch, row.error.c_str());
          } else {
            std::printf(
                "| %s | %lld | %s | %d | %lld | %.2f | %.2f | %.3f (%.3f) | %.3f (%.3f) | %.3f | "
                "%lld | %lld |\n",
                row.page.c_str(), (long long)row.page_bytes,
                row.tier_name == row.tier ? row.tier.c_str()
                                          : (row.tier + " [" + row.tier_name + "]").c_str(),
                row.batch, (long long)row.pages, row.write_gbs, row.read_gbs, row.write_ms_p50,
                row.write_ms_p99, row.read_ms_p50, row.read_ms_p99, row.stored_ratio,
                (long long)row.write_ops, (long long)row.read_ops);
          }
          std::fflush(stdout);
        }
        rows.push_back(std::move(row));
      }
    }
  }
  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "  {\"page\": \"%s\", \"page_bytes\": %lld, \"tier\": \"%s\", \"tier_name\": \"%s\", "
          "\"batch\": %d, \"pages\": %lld, \"write_gbs\": %.4f, \"read_gbs\": %.4f, "
          "\"write_ms_p50\": %.4f, \"write_ms_p99\": %.4f, \"read_ms_p50\": %.4f, \"read_ms_p99\": "
          "%.4f, "
          "\"stored_ratio\": %.4f, \"write_ops\": %lld, \"read_ops\": %lld, \"error\": \"%s\"}%s\n",
          r.page.c_str(), (long long)r.page_bytes, r.tier.c_str(), r.tier_name.c_str(), r.batch,
          (long long)r.pages, r.write_gbs, r.read_gbs, r.write_ms_p50, r.write_ms_p99,
          r.read_ms_p50, r.read_ms_p99, r.stored_ratio, (long long)r.write_ops,
          (long long)r.read_ops, r.error.c_str(), i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
  }
  return 0;
}
