// This process's resident memory as the kernel counts it (/proc/self/status), split by what backs
// it: anonymous memory (the heap, the KV pool, the tiers' RAM) and file pages (the model's
// weights, mapped from the GGUF). "Memory bounded where the user can see it" means the anonymous
// part: the weights are the same whatever the KV cache does.
//
// Thread-safety: free of shared state.
#pragma once

#include <cstdint>
#include <optional>
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

}  // namespace kvl
