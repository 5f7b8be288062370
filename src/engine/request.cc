#include "request.h"

#include <algorithm>

namespace kvl {

std::string StopTextFilter::Push(std::string_view piece, bool* stopped) {
  *stopped = false;
  pending_.append(piece);
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    if (stop.empty()) continue;
    const size_t at = pending_.find(stop);
    if (at != std::string::npos) {
      *stopped = true;
      std::string out = pending_.substr(0, at);
      pending_.clear();
      return out;
    }
    // Hold back the longest tail of pending_ that is a prefix of this stop string.
    for (size_t len = std::min(stop.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopTextFilter::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

int64_t Sequence::MaxStepsLeft(int64_t context_tokens) const {
  // The step that completes the prompt samples the first token: one step for the rest of the
  // prompt (a few where it outgrows a step's token budget), then one a token.
  int64_t left = std::max<int64_t>(1, context_tokens - static_cast<int64_t>(tokens.size()));
  if (request.max_new_tokens >= 0) {
    left = std::min<int64_t>(left, std::max<int64_t>(1, request.max_new_tokens - num_generated));
  }
  return left;
}

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kKvPressure:
      return "kv_pressure";
  }
  return "error";
}

TokenEvent Sequence::FinishEvent(FinishReason reason, Status error) {
  finished = true;
  TokenEvent event;
  event.request = id;
  event.finished = true;
  event.finish_reason = std::string(FinishReasonName(reason));
  event.error = std::move(error);
  if (reason != FinishReason::kStop) event.text = stop_filter.Flush();
  event.time_to_first_token_ms =
      num_generated > 0 ? MillisecondsBetween(submitted, first_token) : 0.0;
  event.prompt_tokens = num_prompt;
  event.cached_prompt_tokens = std::max<int64_t>(0, cached_prompt_tokens);
  event.generated_tokens = num_generated;
  event.kv_lossy_pages = kv_lossy_pages;
  return event;
}

}  // namespace kvl
