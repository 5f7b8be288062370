#include "llama_routes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvl::server {
namespace {

// llama-server's value for a rate over no time: 0, never inf or NaN (invalid JSON).
double PerSecond(int64_t n, double ms) { return ms > 0 ? 1e3 * static_cast<double>(n) / ms : 0; }
double PerToken(double ms, int64_t n) { return n > 0 ? ms / static_cast<double>(n) : 0; }

JsonValue Bytes(std::string_view text) {
  JsonValue bytes = JsonValue::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

std::string Frame(const JsonValue& object) {
  return "data: " + object.dump(-1, ' ', false, JsonValue::error_handler_t::replace) + "\n\n";
}

}  // namespace

JsonValue GenerationSettings(const Request& request, bool stream) {
  const SamplingParams& s = request.sampling;
  JsonValue samplers = JsonValue::array();
  if (s.repeat_penalty != 1.0f || s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f) {
    samplers.push_back("penalties");
  }
  if (s.top_k > 0) samplers.push_back("top_k");
  if (s.top_p < 1.0f) samplers.push_back("top_p");
  if (s.min_p > 0.0f) samplers.push_back("min_p");
  samplers.push_back("temperature");
  const int64_t n_predict = request.max_new_tokens;
  return JsonValue{{"seed", s.seed},
                   {"temperature", s.temperature},
                   {"dynatemp_range", 0.0},
                   {"dynatemp_exponent", 1.0},
                   {"top_k", s.top_k},
                   {"top_p", s.top_p},
                   {"min_p", s.min_p},
                   {"top_n_sigma", -1.0},
                   {"xtc_probability", 0.0},
                   {"xtc_threshold", 0.1},
                   {"typical_p", 1.0},
                   {"repeat_last_n", s.repeat_last_n},
                   {"repeat_penalty", s.repeat_penalty},
                   {"presence_penalty", s.presence_penalty},
                   {"frequency_penalty", s.frequency_penalty},
                   {"dry_multiplier", 0.0},
                   {"mirostat", 0},
                   {"max_tokens", n_predict},
                   {"n_predict", n_predict},
                   {"n_keep", 0},
                   {"ignore_eos", request.ignore_eos},
                   {"stream", stream},
                   {"n_probs", std::max(0, request.top_logprobs)},
                   {"min_keep", 0},
                   {"samplers", std::move(samplers)},
                   {"timings_per_token", false},
                   {"post_sampling_probs", false},
                   {"lora", JsonValue::array()}};
}

JsonValue TimingsJson(const CompletionTimings& t) {
  return JsonValue{{"cache_n", t.cached_tokens},
                   {"prompt_n", t.evaluated_tokens},
                   {"prompt_ms", t.prompt_ms},
                   {"prompt_per_token_ms", PerToken(t.prompt_ms, t.evaluated_tokens)},
                   {"prompt_per_second", PerSecond(t.evaluated_tokens, t.prompt_ms)},
                   {"predicted_n", t.predicted_tokens},
                   {"predicted_ms", t.predicted_ms},
                   {"predicted_per_token_ms", PerToken(t.predicted_ms, t.predicted_tokens)},
                   {"predicted_per_second", PerSecond(t.predicted_tokens, t.predicted_ms)}};
}

JsonValue ProbsJson(const std::vector<TokenProbs>& probs) {
  JsonValue out = JsonValue::array();
  for (const TokenProbs& p : probs) {
    JsonValue top = JsonValue::array();
    for (size_t i = 0; i < p.top_ids.size(); ++i) {
      top.push_back({{"id", p.top_ids[i].first},
                     {"token", p.top_ids[i].second},
                     {"bytes", Bytes(p.top_ids[i].second)},
                     {"logprob", p.top_logprobs[i]}});
    }
    out.push_back({{"id", p.id},
                   {"token", p.text},
                   {"bytes", Bytes(p.text)},
                   {"logprob", p.logprob},
                   {"top_logprobs", std::move(top)}});
  }
  return out;
}

TokenProbs MakeTokenProbs(const Tokenizer& tokenizer, int32_t prev, int32_t token, float logprob,
                          const std::vector<TokenLogprob>& top) {
  TokenProbs p;
  p.id = token;
  p.text = tokenizer.DecodeToken(prev, token);
  p.logprob = logprob;
  for (const TokenLogprob& alt : top) {
    p.top_ids.emplace_back(alt.token, tokenizer.DecodeToken(prev, alt.token));
    p.top_logprobs.push_back(alt.logprob);
  }
  return p;
}

std::string StoppingWord(const Tokenizer& tokenizer, const std::vector<std::string>& stops,
                         int32_t prompt_last, const std::vector<int32_t>& generated,
                         size_t text_bytes) {
  if (stops.size() == 1) return stops[0];
  std::string spelled;
  int32_t prev = prompt_last;
  for (int32_t id : generated) {
    spelled += tokenizer.DecodeToken(prev, id);
    prev = id;
  }
  for (const std::string& stop : stops) {
    if (text_bytes <= spelled.size() && spelled.compare(text_bytes, stop.size(), stop) == 0) {
      return stop;
    }
  }
  return "";
}

JsonValue PropsJson(const ServerProps& props) {
  Request defaults;
  defaults.max_new_tokens = -1;
  return JsonValue{
      {"default_generation_settings",
       {{"params", GenerationSettings(defaults, false)}, {"n_ctx", props.n_ctx}}},
      {"total_slots", props.total_slots},
      {"model_alias", props.model_alias},
      {"model_path", props.model_path},
      {"modalities", {{"vision", false}, {"audio", false}}},
      {"endpoint_slots", true},
      {"endpoint_props", true},
      {"endpoint_metrics", true},
      {"chat_template", props.chat_template},
      {"build_info", props.build_info},
      {"is_sleeping", false}};
}

void FillFromLastEvent(const TokenEvent& last, double predicted_ms, LlamaFinal* f) {
  f->tokens_predicted = last.generated_tokens;
  f->tokens_evaluated = last.prompt_tokens;
  f->tokens_cached = last.cached_prompt_tokens;
  f->stop_type = LlamaStopType(last.finish_reason);
  f->truncated = last.finish_reason == "context";
  f->timings.cached_tokens = last.cached_prompt_tokens;
  f->timings.evaluated_tokens = last.prompt_tokens - last.cached_prompt_tokens;
  f->timings.prompt_ms = last.time_to_first_token_ms;
  f->timings.predicted_tokens = last.generated_tokens;
  f->timings.predicted_ms = predicted_ms;
}

std::string_view LlamaStopType(std::string_view engine_reason) {
  if (engine_reason == "eos") return "eos";
  if (engine_reason == "stop") return "word";
  if (engine_reason == "length" || engine_reason == "context") return "limit";
  return "none";
}

std::string LlamaChunkFrame(std::string_view content, const std::vector<int32_t>& tokens,
                            int32_t id_slot, int64_t tokens_predicted, int64_t tokens_evaluated,
                            const std::vector<TokenProbs>& probs) {
  JsonValue chunk = {{"index", 0},
                     {"content", content},
                     {"tokens", tokens},
                     {"stop", false},
                     {"id_slot", id_slot},
                     {"tokens_predicted", tokens_predicted},
                     {"tokens_evaluated", tokens_evaluated}};
  if (!probs.empty()) chunk["completion_probabilities"] = ProbsJson(probs);
  return Frame(chunk);
}

JsonValue LlamaFinalJson(const LlamaFinal& f) {
  JsonValue out = {{"index", 0},
                   {"content", f.content},
                   {"tokens", f.tokens},
                   {"id_slot", f.id_slot},
                   {"stop", true},
                   {"model", f.model},
                   {"tokens_predicted", f.tokens_predicted},
                   {"tokens_evaluated", f.tokens_evaluated},
                   {"generation_settings", f.generation_settings},
                   {"prompt", f.prompt},
                   {"has_new_line", f.content.find('\n') != std::string::npos},
                   {"truncated", f.truncated},
                   {"stop_type", f.stop_type},
                   {"stopping_word", f.stopping_word},
                   {"tokens_cached", f.tokens_cached},
                   {"timings", TimingsJson(f.timings)}};
  if (!f.probs.empty()) out["completion_probabilities"] = ProbsJson(f.probs);
  return out;
}

SlotTable::SlotTable(int32_t slots) : held_(static_cast<size_t>(slots), false) {
  for (int32_t i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
}

int32_t SlotTable::Acquire(RequestId request, const Request& settings, bool stream) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i]) continue;
    held_[i] = true;
    Slot& slot = *slots_[i];
    slot.id_task = static_cast<int64_t>(request);
    slot.n_decoded = 0;
    slot.n_prompt_tokens = 0;
    slot.n_predict = settings.max_new_tokens;
    slot.params = GenerationSettings(settings, stream);
    return static_cast<int32_t>(i);
  }
  return -1;
}

void SlotTable::Release(int32_t slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  held_[static_cast<size_t>(slot)] = false;
}

JsonValue SlotTable::Json(int64_t n_ctx) const {
  std::lock_guard<std::mutex> lock(mu_);
  JsonValue out = JsonValue::array();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = *slots_[i];
    JsonValue s = {{"id", static_cast<int64_t>(i)},
                   {"n_ctx", n_ctx},
                   {"speculative", false},
                   {"is_processing", static_cast<bool>(held_[i])}};
    // A slot keeps showing its last task once free, as llama-server's does.
    if (slot.id_task.load() >= 0) {
      const int64_t decoded = slot.n_decoded.load();
      s["id_task"] = slot.id_task.load();
      s["n_prompt_tokens"] = slot.n_prompt_tokens.load();
      s["params"] = slot.params;
      s["next_token"] = JsonValue::array(
          {{{"has_next_token", static_cast<bool>(held_[i])},
            {"n_remain", slot.n_predict < 0 ? -1 : std::max<int64_t>(0, slot.n_predict - decoded)},
            {"n_decoded", decoded}}});
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvl::server
