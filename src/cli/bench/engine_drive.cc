#include "engine_drive.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <chrono>

namespace kvl::cli {

StatusOr<std::vector<DrivenReply>> DriveRequests(
    Engine& engine, std::vector<Request> requests,
    const std::function<void(int64_t step)>& after_step) {
  using Clock = std::chrono::steady_clock;
  std::vector<DrivenReply> replies(requests.size());
  const Clock::time_point start = Clock::now();
  auto since_start = [start] {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    DrivenReply* reply = &replies[i];
    auto on_event = [reply, &since_start](const TokenEvent& ev) {
      if (ev.token >= 0) {
        if (reply->tokens.empty()) reply->ttft_ms = since_start();
        reply->tokens.push_back(ev.token);
        if (!ev.top_logprobs.empty()) reply->top_logprobs.push_back(ev.top_logprobs);
      }
      if (ev.finished) {
        reply->end_ms = since_start();
        if (reply->tokens.empty()) reply->ttft_ms = reply->end_ms;
        reply->finish_reason = ev.finish_reason;
        reply->cached_prompt_tokens = ev.cached_prompt_tokens;
        reply->error = ev.error;
      }
    };
    KVL_RETURN_IF_ERROR(engine.Submit(std::move(requests[i]), on_event).status());
  }
  for (int64_t step = 0; engine.Step(); ++step) {
    if (after_step) after_step(step);
  }
  return replies;
}

StatusOr<BenchModel> LoadBenchModel(const std::string& path) {
  BenchModel m;
  KVL_ASSIGN_OR_RETURN(m.model, Model::Load(path));
  KVL_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::FromGguf(m.model->file()));
  return m;
}

Status WarmUpEngine(Engine& engine, int32_t id_a, int32_t id_b) {
  Request warm;
  warm.prompt_ids = {engine.tokenizer().bos(), id_a, id_b};
  warm.max_new_tokens = 2;
  warm.ignore_eos = true;
  warm.sampling.temperature = 0;
  KVL_RETURN_IF_ERROR(engine.Submit(std::move(warm), [](const TokenEvent&) {}).status());
  engine.RunUntilIdle();
  return Status::Ok();
}

ActionPages ActionPagesBetween(const EngineMetrics& before, const EngineMetrics& after) {
  ActionPages pages{};
  for (size_t a = 0; a < pages.size(); ++a) {
    pages[a] = after.kv_actions[a].pages - before.kv_actions[a].pages;
  }
  return pages;
}

std::string ActionPagesText(const ActionPages& pages) {
  std::string out;
  for (size_t a = 0; a < pages.size(); ++a) {
    if (pages[a] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", KvActionName(static_cast<KvAction>(a)), pages[a]);
  }
  return out.empty() ? "-" : out;
}

nlohmann::json ActionPagesJson(const ActionPages& pages) {
  nlohmann::json actions = nlohmann::json::object();
  for (size_t a = 0; a < pages.size(); ++a) {
    if (pages[a] != 0) actions[std::string(KvActionName(static_cast<KvAction>(a)))] = pages[a];
  }
  return actions;
}

}  // namespace kvl::cli
