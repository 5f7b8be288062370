// One greedy request run to its end on an engine driven by the test (RunUntilIdle): the tokens it
// generated and the prompt tokens it found cached. Shared by the engine tests that compare runs.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvl/engine.h"

namespace kvl::testing {

struct GreedyReply {
  std::vector<int32_t> tokens;
  int64_t cached_prompt_tokens = -1;  // -1: the request never finished
  bool ok = true;                     // no event carried an error (each one also fails the test)
};

inline GreedyReply GenerateGreedy(Engine& e, const std::vector<int32_t>& prompt, int32_t n) {
  Request r;
  r.prompt_ids = prompt;
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  GreedyReply out;
  const StatusOr<RequestId> id = e.Submit(r, [&](const TokenEvent& ev) {
    if (!ev.error.ok()) out.ok = false;
    EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
    if (ev.token >= 0) out.tokens.push_back(ev.token);
    if (ev.finished) out.cached_prompt_tokens = ev.cached_prompt_tokens;
  });
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  e.RunUntilIdle();
  return out;
}

// Engine::Create, its error a test failure (nullptr then).
inline std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

}  // namespace kvl::testing
