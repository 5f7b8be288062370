// What a request produced, recorded to the bit: its tokens and, per token, its log-probability and
// its top alternatives'. Lossless KV paths are held to keep-all's RecordedOutput with ==; shared
// by the engine tests that compare runs that way.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "kvl/engine.h"

namespace kvl::testing {

struct RecordedOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // per token: its own, then its top_logprobs'
  bool operator==(const RecordedOutput&) const = default;
};

// The event callback that records a request's tokens into `out` (which must outlive the
// request); an event carrying an error fails the test.
inline EventCallback RecordInto(RecordedOutput& out) {
  return [&out](const TokenEvent& ev) {
    EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
    if (ev.token < 0) return;
    out.tokens.push_back(ev.token);
    out.logprobs.push_back(ev.logprob);
    for (const TokenLogprob& t : ev.top_logprobs) out.logprobs.push_back(t.logprob);
  };
}

}  // namespace kvl::testing
