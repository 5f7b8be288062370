// A request's state from admission to its last token: its tokens, where its KV pages are, the
// text it has released, and the events it sends.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/engine.h"
#include "kvl/kv_memory.h"  // KvSequencePages, KvPageFate, KvStats
#include "kvl/sampling.h"
#include "kvl/token_mask.h"
#include "spec_state.h"

namespace kvl {

// Why a request ended; FinishReasonName is TokenEvent::finish_reason's text. kKvPressure: the
// sequence outgrew what the KV budget and its tiers could hold and was stopped where it got to,
// its text so far kept ("kv_pressure": not "length", so that a client can tell a cut from
// max_tokens and retry with a larger budget or a lossy kv_quality).
enum class FinishReason : uint8_t {
  kEos,
  kStop,
  kLength,
  kContext,
  kCancelled,
  kError,
  kKvPressure
};
std::string_view FinishReasonName(FinishReason reason);
// It ran to a natural end (eos, stop, length): no error, not cancelled, not cut by the context.
inline bool Completed(FinishReason reason) {
  return reason == FinishReason::kEos || reason == FinishReason::kStop ||
         reason == FinishReason::kLength;
}

using Clock = std::chrono::steady_clock;

inline double MillisecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Releases generated text while holding back whatever could still turn into a stop string, so a
// stop string is never streamed out before it is recognized.
class StopTextFilter {
 public:
  explicit StopTextFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds a piece; returns the text that is now safe to emit. Sets *stopped when a stop string
  // completed (the text before it is emitted, the stop string and anything after it is dropped).
  std::string Push(std::string_view piece, bool* stopped);
  // Whatever is held back, at the end of generation.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

// One request from submission to its last token.
struct Sequence {
  RequestId id = 0;
  SeqId slot = -1;                 // KV manager sequence id while admitted
  Request request;
  EventCallback on_event;
  std::vector<int32_t> tokens;     // prompt, then generated tokens (reserved for the context)
  int64_t num_prompt = 0;
  int64_t num_computed = 0;        // leading tokens whose K/V is in the cache
  int64_t cached_prompt_tokens = -1;  // prefix hit at first admission (-1: not admitted yet)
  int32_t num_generated = 0;
  int32_t prev_token = -1;         // for DecodeToken's leading-space rule
  std::unique_ptr<Sampler> sampler;
  // Its request's grammar (issue 42; constrained_sampling.h), or null: unconstrained.
  std::unique_ptr<GrammarConstraint> grammar;
  StopTextFilter stop_filter{{}};
  Clock::time_point submitted;
  Clock::time_point first_token;
  Clock::time_point last_token;
  bool finished = false;
  bool stream_failed = false;      // this step read a streamed page that failed its checksum
  // Steps thrown away since its last token because a KV page outside the pool could not be read:
  // the progress check (StepRunner) recomputes it without the store, then gives up.
  int32_t failed_reads_in_a_row = 0;
  // Where each of its KV pages is (pool, slab, tier, checkpoints, dropped); it outlives a
  // preemption, when the kept pages wait in tiers for the resume.
  KvSequencePages kv_pages;
  bool store_checked = false;      // its prompt was looked up in the KV store
  int32_t preemptions = 0;
  // Its request's kv_quality, or the engine's where the request left it unset.
  KvQuality kv_quality = KvQuality::kLossless;
  int64_t kv_lossy_pages = 0;      // its pages compressed or evicted so far
  // Finished, but its slot and lossy KV are kept for a next turn to continue (Scheduler).
  bool parked = false;
  SpecSequenceState spec;          // speculative decoding (issue 26): its draft and acceptance

  // The finished event (reason, error, counts, the text still held back); marks it finished.
  TokenEvent FinishEvent(FinishReason reason, Status error);
  // The most steps it may still take, the next one included: a token a step until max_tokens or
  // the context is reached (an EOS or a stop string may end it sooner). What the KV reuse
  // forecast knows of a running sequence's future reads.
  int64_t MaxStepsLeft(int64_t context_tokens) const;
};

}  // namespace kvl
