// llama-server's own API beside the OpenAI one: the bodies of POST /completion (plain and
// streamed), GET /props and GET /slots, in the shapes its README (tools/server/README.md)
// documents. The server (server.cc) feeds them; nothing here touches the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "json_body.h"
#include "kvl/engine.h"
#include "kvl/tokenizer.h"

namespace kvl::server {

// /completion's generation_settings (and /props' default_generation_settings.params): the
// request's sampling as llama-server names it, the samplers kvlattice does not have at their
// off values.
JsonValue GenerationSettings(const Request& request, bool stream);

// How long the two phases took, as llama-server's "timings" reports them.
struct CompletionTimings {
  int64_t cached_tokens = 0;     // cache_n
  int64_t evaluated_tokens = 0;  // prompt_n: the prompt's tokens not found in the cache
  double prompt_ms = 0;
  int64_t predicted_tokens = 0;
  double predicted_ms = 0;
};
JsonValue TimingsJson(const CompletionTimings& timings);

// A generated token's probabilities, for "completion_probabilities" (n_probs > 0).
struct TokenProbs {
  int32_t id = -1;
  std::string text;
  double logprob = 0;
  std::vector<std::pair<int32_t, std::string>> top_ids;  // with top_logprobs, most likely first
  std::vector<double> top_logprobs;
};
JsonValue ProbsJson(const std::vector<TokenProbs>& probs);
// `token`'s entry, its text and its alternatives' decoded after `prev` (the token before it).
TokenProbs MakeTokenProbs(const Tokenizer& tokenizer, int32_t prev, int32_t token, float logprob,
                          const std::vector<TokenLogprob>& top);

// The stop string a request ended at. The engine names none: with one stop string it is that
// one, else the one the generated tokens (decoded after the prompt's last token) spell where the
// released text (`text_bytes` long) ends.
std::string StoppingWord(const Tokenizer& tokenizer, const std::vector<std::string>& stops,
                         int32_t prompt_last, const std::vector<int32_t>& generated,
                         size_t text_bytes);

// GET /props' body. default_generation_settings are /completion's defaults.
struct ServerProps {
  int64_t n_ctx = 0;
  int32_t total_slots = 0;
  std::string model_alias;
  std::string model_path;
  std::string chat_template;
  std::string build_info;
};
JsonValue PropsJson(const ServerProps& props);

// llama-server's stop_type for an engine finish reason: eos, word (a stop string), limit
// (n_predict or the context), none.
std::string_view LlamaStopType(std::string_view engine_reason);

// One streamed chunk: "data: {content, tokens, stop: false, id_slot, tokens_predicted,
// tokens_evaluated}\n\n".
std::string LlamaChunkFrame(std::string_view content, const std::vector<int32_t>& tokens,
                            int32_t id_slot, int64_t tokens_predicted, int64_t tokens_evaluated,
                            const std::vector<TokenProbs>& probs);

// The final object: the whole answer unstreamed, or a stream's last frame (content and tokens
// empty: they went out in the chunks).
struct LlamaFinal {
  std::string content;
  std::vector<int32_t> tokens;  // sent where return_tokens was asked for
  int32_t id_slot = -1;
  std::string model;
  std::string prompt;
  int64_t tokens_predicted = 0;
  int64_t tokens_evaluated = 0;
  int64_t tokens_cached = 0;
  std::string_view stop_type;
  std::string stopping_word;
  bool truncated = false;
  CompletionTimings timings;
  JsonValue generation_settings;
  std::vector<TokenProbs> probs;  // unstreamed, with n_probs
};
// The counts, stop type and timings of `last`, a request's last event; predicted_ms is the
// time from its first token to its last.
void FillFromLastEvent(const TokenEvent& last, double predicted_ms, LlamaFinal* final);
JsonValue LlamaFinalJson(const LlamaFinal& final);

// The server's slots (-np of them): which request holds each, for /slots and a completion's
// id_slot. A request takes the lowest free slot when it is submitted and frees it with its
// last event; requests beyond the slots wait in the engine's queue with no slot, as
// llama-server's tasks wait for one. Thread-safe.
class SlotTable {
 public:
  struct Slot {
    std::atomic<int64_t> id_task{-1};     // the engine's request id; -1: free
    std::atomic<int64_t> n_decoded{0};
    std::atomic<int64_t> n_prompt_tokens{0};
    int64_t n_predict = -1;
    JsonValue params;                     // under the table's mutex
  };

  explicit SlotTable(int32_t slots);
  // The lowest free slot's index, now held by `request`; -1 when every slot is held.
  int32_t Acquire(RequestId request, const Request& settings, bool stream);
  void Release(int32_t slot);
  Slot* at(int32_t slot) { return slot >= 0 ? slots_[static_cast<size_t>(slot)].get() : nullptr; }
  int32_t size() const { return static_cast<int32_t>(slots_.size()); }
  // GET /slots' body.
  JsonValue Json(int64_t n_ctx) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<bool> held_;  // under mu_
};

}  // namespace kvl::server
