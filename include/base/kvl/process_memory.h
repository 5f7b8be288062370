// This process's resident memory as the kernel counts it (/proc/self/status), split by what backs
// it: anonymous memory (the heap, the KV pool, the tiers' RAM) and file pages (the model's
// weights, mapped from the GGUF). "Memory bounded where the user can see it" means the anonymous
// part: the weights are the same whatever the KV cache does.
//
// Thread-safety: free of shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvl {

struct ProcessMemory {
  int64_t rss_bytes = 0;        // VmRSS
  int64_t rss_anon_bytes = 0;   // RssAnon + RssShmem
  int64_t rss_file_bytes = 0;   // RssFile
  int64_t rss_peak_bytes = 0;   // VmHWM: the most VmRSS ever was
};

// Parses the text of /proc/<pid>/status; nullopt when a field is missing (kernels before 4.5
// have no RssAnon) or malformed.
std::optional<ProcessMemory> ParseProcessStatus(std::string_view status);
// This process now; nullopt where /proc/self/status cannot be read.
std::optional<ProcessMemory> ReadProcessMemory();

// The resident bytes of every mapping of the file `path` (its "Rss:" lines summed), from the text
// of /proc/<pid>/smaps: how much of a mapped model file is in memory. `path` must be the absolute,
// resolved path the kernel prints. 0 when nothing maps it; nullopt when the text is malformed.
std::optional<int64_t> ParseMappedFileResidentBytes(std::string_view smaps, std::string_view path);
// This process's resident pages of `path` (resolved to its canonical name); nullopt where
// /proc/self/smaps cannot be read. Costs a read of every mapping's counters: sample it, do not
// call it per step.
std::optional<int64_t> ReadMappedFileResidentBytes(const std::string& path);

}  // namespace kvl
