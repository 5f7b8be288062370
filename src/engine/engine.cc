#include "kvl/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace kvl {
namespace {

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

StatusOr<ops::Isa> ChooseIsa(const std::string& name) {
  const ops::Isa best = ops::BestIsa();
  if (name == "auto") return best;
  for (ops::Isa isa : ops::RunnableIsas()) {
    if (ops::IsaName(isa) == name) return isa;
  }
  return InvalidArgumentError(fmt::format(
      "ISA '{}' is not available on this CPU/build (best here: {})", name, ops::IsaName(best)));
}

}  // namespace

Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.batch_size < 1) return InvalidArgumentError("batch size (-b) must be at least 1");
  if (options.num_threads < 0) return InvalidArgumentError("threads (-t) must be positive");
  if (options.context_length < 0) return InvalidArgumentError("context (-c) must be positive");
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  KVL_ASSIGN_OR_RETURN(ops::Isa isa, ChooseIsa(options.isa));
  KVL_ASSIGN_OR_RETURN(e->model_, Model::Load(options.model_path));
  KVL_ASSIGN_OR_RETURN(e->tokenizer_, Tokenizer::FromGguf(e->model_->file()));
  const ModelConfig& c = e->model_->config();
  if (e->tokenizer_->vocab_size() != c.vocab_size) {
    return DataLossError(fmt::format("{}: the tokenizer has {} tokens but token_embd.weight has {}",
                                     options.model_path, e->tokenizer_->vocab_size(), c.vocab_size));
  }
  e->context_length_ =
      options.context_length > 0 ? options.context_length : std::min<int64_t>(c.context_length, 4096);

  int threads = options.num_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  e->pool_ = std::make_unique<ThreadPool>(threads);
  e->ops_ = std::make_unique<ops::OpsContext>(isa, e->pool_.get());
  KVL_ASSIGN_OR_RETURN(e->kv_, ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1,
                                                         e->context_length_));
  ForwardOptions fo;
  fo.max_batch_tokens = std::min(options.batch_size, e->context_length_);
  fo.max_logit_rows = 1;
  fo.max_context = e->context_length_;
  e->forward_ = std::make_unique<Forward>(*e->model_, *e->ops_, fo);
  e->batch_.tokens.reserve(static_cast<size_t>(fo.max_batch_tokens));
  return e;
}

StatusOr<const float*> Engine::Evaluate(std::span<const int32_t> ids, int64_t start_pos) {
  const int64_t vocab = model_->config().vocab_size;
  if (ids.empty()) return InvalidArgumentError("nothing to evaluate: no tokens");
  if (start_pos < 0 || start_pos + static_cast<int64_t>(ids.size()) > context_length_) {
    return OutOfRangeError(fmt::format("{} tokens from position {} exceed the context of {} (-c)",
                                       ids.size(), start_pos, context_length_));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(
          fmt::format("token id {} at index {} is outside the vocabulary [0, {})", ids[i], i, vocab));
    }
  }
  const int64_t chunk = forward_->options().max_batch_tokens;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    batch_.Clear();
    for (int64_t i = begin; i < end; ++i) {
      batch_.Add(ids[static_cast<size_t>(i)], start_pos + i, 0, i == n - 1);
    }
    forward_->Run(batch_, *kv_);
  }
  return forward_->logits(0);
}

StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                          const TokenCallback& on_token) {
  KVL_RETURN_IF_ERROR(request.sampling.Validate());
  GenerateResult result;
  result.prompt_ids = request.prompt_ids.empty()
                          ? tokenizer_->Encode(request.prompt, request.add_bos)
                          : request.prompt_ids;
  if (result.prompt_ids.empty()) {
    return InvalidArgumentError("the prompt is empty and no BOS was requested");
  }
  const int64_t prompt_len = static_cast<int64_t>(result.prompt_ids.size());
  if (prompt_len >= context_length_) {
    return OutOfRangeError(fmt::format("the prompt has {} tokens but the context holds {} (-c)",
                                       prompt_len, context_length_));
  }

  auto start = std::chrono::steady_clock::now();
  KVL_ASSIGN_OR_RETURN(const float* logits, Evaluate(result.prompt_ids, 0));
  result.stats.prompt_tokens = prompt_len;
  result.stats.prompt_ms = MillisecondsSince(start);

  Sampler sampler(request.sampling, static_cast<int32_t>(model_->config().vocab_size));
  std::vector<int32_t> history = result.prompt_ids;
  history.reserve(static_cast<size_t>(context_length_));
  int32_t prev = history.back();
  result.stop_reason = "length";
  start = std::chrono::steady_clock::now();
  for (int64_t step = 0; request.max_new_tokens < 0 || step < request.max_new_tokens; ++step) {
    const int32_t next = sampler.Sample(logits, history);
    if (request.stop_at_eos && next == tokenizer_->eos()) {
      result.stop_reason = "eos";
      break;
    }
    history.push_back(next);
    result.output_ids.push_back(next);
    const std::string piece = tokenizer_->DecodeToken(prev, next);
    result.text += piece;
    prev = next;
    if (on_token && !on_token(next, piece)) {
      result.stop_reason = "callback";
      break;
    }
    const int64_t pos = static_cast<int64_t>(history.size()) - 1;
    if (pos + 1 >= context_length_) {
      result.stop_reason = "context";
      break;
    }
    if (request.max_new_tokens >= 0 && step + 1 == request.max_new_tokens) break;
    KVL_ASSIGN_OR_RETURN(logits, Evaluate(std::span<const int32_t>(&next, 1), pos));
  }
  result.stats.generated_tokens = static_cast<int64_t>(result.output_ids.size());
  result.stats.generate_ms = MillisecondsSince(start);
  return result;
}

}  // namespace kvl
