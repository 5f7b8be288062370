// What KvMemory records of its pages for a page-access trace (--kv-trace): every step's reads,
// the pages that left the pool and the pages that came back, told to a recorder it is handed.
// The runtime writes no trace itself: the trace library (kvl_kv_trace: kvl/kv_trace.h, the file
// format and its writer, and kvl/kv_trace_replay.h, the offline replay) implements the recorder,
// and only what links it (the CLI, the trace tools, tests) hands KvMemory an opener.
//
// Thread-safety: a recorder belongs to the engine's step loop.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kvl/kv_manager.h"
#include "kvl/kv_policy.h"
#include "kvl/status.h"

namespace kvl {

// What a leaving or return names: a KvAction, or a cached block reused for new contents.
inline constexpr int kKvTracePoolReuse = kNumKvActions;

// Prices a trace's header holds at the least: one per action up to evict (traces written before
// demote-redis was an action).
inline constexpr size_t kKvTraceOldestPriceCount = 8;

enum class KvTraceCause : uint8_t { kRelief, kPreempt, kReuse };

struct KvTraceHeader {
  int64_t block_tokens = 16;
  int64_t pool_blocks = 0;  // the engine's pool, in pages
  int64_t sink_tokens = 4;
  int64_t recent_tokens = 64;
  // The cost model's bring-back time of one page per action (ms); < 0: not available there.
  // A trace written before an action existed has fewer (kKvTraceOldestPriceCount: before
  // demote-redis); the ones it lacks read as not available.
  std::array<double, kNumKvActions> price_ms{};

  KvTraceHeader() { price_ms.fill(-1); }
  bool operator==(const KvTraceHeader&) const = default;
};

class KvTraceRecorder {
 public:
  virtual ~KvTraceRecorder() = default;

  virtual void Step() = 0;  // the next step begins
  // Attention read blocks [0, contents.size()) of `request`; contents[b] is block b's content id
  // ({} for none); blocks from `computed_from` on were computed in this step; `outside` and
  // `evicted` list the blocks read from outside the pool and those that were gone (ascending);
  // `steps_left` is the most steps the request may still take after this one (-1: unknown).
  virtual void Read(int64_t request, std::span<const KvContentId> contents,
                    int64_t computed_from, std::span<const int64_t> outside = {},
                    std::span<const int64_t> evicted = {}, int64_t steps_left = -1) = 0;
  // A page of a request left the pool (a page never read is not recorded).
  virtual void Leave(int64_t request, int64_t block, int action, KvTraceCause cause,
                     double predicted_ms) = 0;
  // A cached pool block with this content was given new contents.
  virtual void LeaveReused(KvContentId content) = 0;
  virtual void Back(int64_t request, int64_t block, int action, double predicted_ms,
                    double measured_ms) = 0;
  // Ends the trace: the first error met while recording, if any.
  virtual Status Close() = 0;
};

// Opens a recorder for the trace at `path`, which starts with `header` (the trace library's
// OpenKvTraceFile).
using KvTraceOpener = std::function<StatusOr<std::unique_ptr<KvTraceRecorder>>(
    const std::string& path, const KvTraceHeader& header)>;

}  // namespace kvl
