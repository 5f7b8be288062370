// A page-access trace of the KV pool. The engine writes one with --kv-trace FILE (KvTraceWriter,
// KvMemory's recorder: kvl/kv_trace_recorder.h; this library is not part of the runtime):
// for every step, the pages attention read, the pages that left the pool and by which action, and
// the pages that came back. `kvl bench replay` reads it (ReadKvTrace) and replays it offline, with
// no model, against eviction policies (kvl/kv_trace_replay.h).
//
// The file is text, one event a line, fields separated by single spaces:
//   kvl-trace 1 block_tokens=16 pool_blocks=40 sink_tokens=4 recent_tokens=64
//       price_ms=<one per KvAction, comma-separated; - where the action was not available>
//   S <step>                          a step begins (steps count from 0)
//   P <page> <request> <block> <content>  page id <page> is block <block> of request <request>,
//                                     its content id 32 hex digits (hi then lo), or - without one;
//                                     pages of equal content ids are one page (shared prefixes)
//   R <request> <count> <from> <outside> <evicted> <left>
//                                     attention read blocks [0, count) of the request: its full
//                                     pages (the partial last page is always resident and left
//                                     out), every one named by a P line before; blocks from
//                                     <from> on got their tokens computed in this step (new, or
//                                     recomputed), the ones before it were there already; of
//                                     those, <outside> were read from outside the pool (a tier,
//                                     or rebuilt from checkpoints) and <evicted> were gone, each a
//                                     list of blocks and ranges ("3,5-9") or - for none. The two
//                                     lists may be left off together (none). <left>: the most
//                                     steps the request may still take after this one (its
//                                     max_tokens, its context), what the engine's reuse forecast
//                                     knows of it; - or left off: unknown.
//   L <page> <request> <action> <cause> <ms>  the page left the pool: the request whose page it
//                                     was (-1 for a cached block), the action's name (KvActionName,
//                                     or pool-reuse for a cached block given new contents), the
//                                     cause (relief: a running page; preempt; reuse), and the cost
//                                     model's predicted bring-back time
//   B <page> <action> <predicted> <measured>  the page came back into the pool (promoted or
//                                     rebuilt): the cost model's bring-back time for it, and the
//                                     time it took (ms)
//
// Thread-safety: a writer belongs to the engine's step loop; the rest are pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvl/kv_manager.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_trace_recorder.h"
#include "kvl/status.h"

namespace kvl {

// The names of what an L or B line names (a KvAction, or kKvTracePoolReuse) and of its cause.
std::string_view KvTraceActionName(int action);
std::string_view KvTraceCauseName(KvTraceCause cause);

struct KvTraceEvent {
  enum class Kind : uint8_t { kStep, kPage, kRead, kLeave, kBack };
  Kind kind = Kind::kStep;
  int64_t step = 0;              // kStep
  int64_t page = 0;              // kPage, kLeave, kBack
  int64_t request = 0;           // kPage, kRead, kLeave (-1: a cached block reused)
  int64_t block = 0;             // kPage: its index; kRead: how many blocks were read
  int64_t from = 0;              // kRead: the first block whose tokens were computed in this step
  std::vector<int64_t> outside;  // kRead: blocks read from outside the pool, ascending
  std::vector<int64_t> evicted;  // kRead: blocks attention skipped (evicted), ascending
  int64_t steps_left = -1;       // kRead: the most steps the request may still take; -1: unknown
  KvContentId content;           // kPage
  int action = 0;                // kLeave, kBack: a KvAction or kKvTracePoolReuse
  KvTraceCause cause = KvTraceCause::kRelief;  // kLeave
  double predicted_ms = 0;                     // kLeave, kBack: the cost model's bring-back time
  double measured_ms = 0;                      // kBack: the time it took
  bool operator==(const KvTraceEvent&) const = default;
};

struct KvTrace {
  KvTraceHeader header;
  std::vector<KvTraceEvent> events;
  int64_t num_pages = 0;  // page ids are 0 .. num_pages-1
};

// Writes a trace as the engine runs (KvMemory's recorder). Page ids are given on first sight of
// a (request, block), shared by every block of the same content id; pages not seen before are
// named first. Write errors are kept and reported by Close.
class KvTraceWriter final : public KvTraceRecorder {
 public:
  static StatusOr<std::unique_ptr<KvTraceWriter>> Open(const std::string& path,
                                                       const KvTraceHeader& header);
  ~KvTraceWriter() override;
  KvTraceWriter(const KvTraceWriter&) = delete;
  KvTraceWriter& operator=(const KvTraceWriter&) = delete;

  // KvTraceRecorder.
  void Step() override;
  void Read(int64_t request, std::span<const KvContentId> contents, int64_t computed_from,
            std::span<const int64_t> outside = {}, std::span<const int64_t> evicted = {},
            int64_t steps_left = -1) override;
  void Leave(int64_t request, int64_t block, int action, KvTraceCause cause,
             double predicted_ms) override;
  void LeaveReused(KvContentId content) override;
  void Back(int64_t request, int64_t block, int action, double predicted_ms,
            double measured_ms) override;
  // Flushes and closes the file: the first write error, if any.
  Status Close() override;

  int64_t steps() const { return step_; }

 private:
  KvTraceWriter(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {}
  int64_t PageOf(int64_t request, int64_t block) const;
  void Line(const char* text, size_t n);

  std::FILE* file_;
  std::string path_;
  int64_t step_ = -1;
  int64_t num_pages_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, int64_t> page_of_content_;
  std::unordered_map<int64_t, std::vector<int64_t>> pages_of_request_;  // by block index
  std::string line_;
  int error_ = 0;  // errno of the first failed write
};

// A KvTraceOpener that writes the trace to its file (EngineOptions::kv_trace_opener).
StatusOr<std::unique_ptr<KvTraceRecorder>> OpenKvTraceFile(const std::string& path,
                                                           const KvTraceHeader& header);

// Parses a trace; INVALID_ARGUMENT naming the line for anything malformed (a page read before it
// was named, an unknown action, a count out of range).
StatusOr<KvTrace> ParseKvTrace(std::string_view text);
StatusOr<KvTrace> ReadKvTrace(const std::string& path);

}  // namespace kvl
