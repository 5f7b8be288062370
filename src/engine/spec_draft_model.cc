#include "spec_draft_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "kvl/sampling.h"

namespace kvl {
namespace {

// The draft pool's hash chains are its own: no other pool ever sees its blocks.
constexpr uint64_t kDraftPoolIdentity = 0x6472616674ull;  // "draft"

// INVALID_ARGUMENT naming the first difference between the two vocabularies, or OK.
Status CheckSameVocabulary(const std::string& path, const Tokenizer& draft,
                           const Tokenizer& target) {
  if (draft.vocab_size() != target.vocab_size()) {
    return InvalidArgumentError(fmt::format(
        "-md {}: the draft model has {} tokens, the model {}: a draft model needs the model's "
        "vocabulary",
        path, draft.vocab_size(), target.vocab_size()));
  }
  for (int32_t id = 0; id < target.vocab_size(); ++id) {
    if (draft.token_text(id) != target.token_text(id)) {
      return InvalidArgumentError(fmt::format(
          "-md {}: token {} is '{}' in the draft model and '{}' in the model: a draft model "
          "needs the model's vocabulary",
          path, id, draft.token_text(id), target.token_text(id)));
    }
  }
  if (draft.bos() != target.bos() || draft.eos() != target.eos()) {
    return InvalidArgumentError(fmt::format(
        "-md {}: the draft model's BOS / EOS are {} / {}, the model's {} / {}", path, draft.bos(),
        draft.eos(), target.bos(), target.eos()));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    const DraftModelOptions& options, const Tokenizer& target_vocab, ops::OpsContext& ops) {
  std::unique_ptr<DraftModelDrafter> d(new DraftModelDrafter());
  d->options_ = options;
  StatusOr<std::unique_ptr<Model>> model = Model::Load(options.path);
  if (!model.ok()) {
    return Status(model.status().code(), fmt::format("-md: {}", model.status().message()));
  }
  d->model_ = std::move(model).value();
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> vocab, Tokenizer::FromGguf(d->model_->file()));
  KVL_RETURN_IF_ERROR(CheckSameVocabulary(options.path, *vocab, target_vocab));
  const ModelConfig& c = d->model_->config();

  // Every slot's whole context and a draft past it, within the budget.
  const int64_t seq_tokens = options.context_length + options.draft_max + 1;
  KvManagerOptions kvo;
  kvo.layout.block_tokens = options.block_tokens;
  kvo.layout.num_layers = c.num_layers;
  kvo.layout.kv_dim = c.kv_dim();
  kvo.model_identity = kDraftPoolIdentity;
  kvo.enable_prefix_cache = true;  // a slot let go and admitted again finds its valid prefix
  kvo.max_seqs = options.max_seqs;
  kvo.max_seq_tokens = seq_tokens;
  const int64_t blocks_per_seq = (seq_tokens + options.block_tokens - 1) / options.block_tokens + 1;
  kvo.budget_bytes = std::min(options.budget_bytes,
                              blocks_per_seq * options.max_seqs * kvo.layout.block_bytes());
  KVL_ASSIGN_OR_RETURN(d->manager_, KvManager::Create(kvo));
  KVL_ASSIGN_OR_RETURN(d->storage_, KvBlockStorage::Create(kvo.layout, d->manager_->num_blocks()));
  d->cache_ = std::make_unique<PagedKvCache>(*d->manager_, *d->storage_);

  ForwardOptions fo;
  fo.max_batch_tokens = std::max<int64_t>(options.max_batch_tokens, options.max_seqs);
  fo.max_logit_rows = options.max_seqs;
  fo.max_context = seq_tokens;
  d->forward_ = std::make_unique<Forward>(*d->model_, ops, fo);

  const auto slots = static_cast<size_t>(options.max_seqs);
  d->step_tokens_.resize(slots);
  for (std::vector<int32_t>& t : d->step_tokens_) t.reserve(static_cast<size_t>(seq_tokens));
  d->last_used_.assign(slots, -1);
  d->busy_.assign(slots, false);
  d->steps_.reserve(slots);
  d->logit_owner_.reserve(slots);
  return d;
}

int64_t DraftModelDrafter::tokens_held(int32_t key) const {
  return manager_->Contains(key) ? manager_->num_tokens(key) : 0;
}

void DraftModelDrafter::Forget(int32_t key) {
  if (key >= 0 && key < options_.max_seqs && manager_->Contains(key)) manager_->Free(key);
}

int64_t DraftModelDrafter::Sync(int32_t key, std::span<const int32_t> context) {
  if (!manager_->Contains(key)) return 0;
  const std::vector<int32_t>& held = manager_->tokens(key);
  const size_t common = static_cast<size_t>(
      std::mismatch(held.begin(), held.end(), context.begin(), context.end()).first -
      held.begin());
  // The last token is always run again: its logits give the first draft token.
  const auto keep = static_cast<int64_t>(std::min(common, context.size() - 1));
  const auto held_tokens = static_cast<int64_t>(held.size());
  if (keep == held_tokens) return keep;
  const int64_t full_blocks_end = held_tokens / options_.block_tokens * options_.block_tokens;
  if (keep >= full_blocks_end) {
    manager_->TruncateTail(key, keep);  // a rejected draft: only the last block's tail goes
    return keep;
  }
  // The cut reaches into full blocks (another request took the slot, or an older draft's block
  // filled up): the slot is let go, its full blocks stay cached, and the admission finds those
  // still valid.
  manager_->Free(key);
  return 0;
}

void DraftModelDrafter::FreeIdleSlots(int64_t blocks) {
  while (manager_->stats().blocks_free < blocks) {
    int32_t oldest = -1;
    for (int32_t slot = 0; slot < options_.max_seqs; ++slot) {
      const auto s = static_cast<size_t>(slot);
      if (busy_[s] || !manager_->Contains(slot)) continue;
      if (oldest < 0 || last_used_[s] < last_used_[static_cast<size_t>(oldest)]) oldest = slot;
    }
    if (oldest < 0) return;
    manager_->Free(oldest);
  }
}

bool DraftModelDrafter::RunBatch() {
  manager_->Plan(steps_, &plan_);
  if (!plan_.fits) {
    FreeIdleSlots(plan_.blocks_needed + plan_.blocks_reused_free);
    manager_->Plan(steps_, &plan_);
    if (!plan_.fits) return false;
  }
  for (const KvBlockCopy& copy : plan_.copies) storage_->CopyBlock(copy.src, copy.dst);
  manager_->Commit(plan_);
  return true;
}

void DraftModelDrafter::Draft(std::span<const int32_t> context, int32_t max_tokens,
                              std::vector<int32_t>* draft) {
  const DraftRequest one{0, context, max_tokens, draft};
  DraftAll({&one, 1});
}

void DraftModelDrafter::DraftAll(std::span<const DraftRequest> requests) {
  ++calls_;
  std::fill(busy_.begin(), busy_.end(), false);
  for (const DraftRequest& r : requests) {
    r.draft->clear();
    busy_[static_cast<size_t>(r.key)] = true;
    last_used_[static_cast<size_t>(r.key)] = calls_;
  }

  // 1. Catch up: each slot's KV made to hold its sequence's tokens, all in one plan (an absent
  // slot is admitted with the whole context: the prefix cache supplies what it still holds).
  steps_.clear();
  for (const DraftRequest& r : requests) {
    if (r.context.empty() || r.max_tokens <= 0) continue;
    const int64_t held = Sync(r.key, r.context);
    std::vector<int32_t>& tokens = step_tokens_[static_cast<size_t>(r.key)];
    tokens.assign(r.context.begin() + held, r.context.end());
    steps_.push_back({r.key, tokens});
  }
  if (steps_.empty() || !RunBatch()) return;
  // The tokens each slot still has to run, from where the plan says its new part starts, in
  // passes of at most max_batch_tokens rows; each slot's last row gives its first draft token.
  const int64_t max_rows = forward_->options().max_batch_tokens;
  const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
  size_t step = 0;
  std::vector<const DraftRequest*>& logit_owner = logit_owner_;
  logit_owner.clear();
  batch_.Clear();
  auto run = [&] {
    if (batch_.size() == 0) return;
    forward_->Run(batch_, *cache_);
    for (size_t row = 0; row < logit_owner.size(); ++row) {
      logit_owner[row]->draft->push_back(
          Sampler::Argmax(forward_->logits(static_cast<int64_t>(row)), vocab));
    }
    batch_.Clear();
    logit_owner.clear();
  };
  for (const DraftRequest& r : requests) {
    if (r.context.empty() || r.max_tokens <= 0) continue;
    const KvPlan::SeqPlan& sp = plan_.seqs[step++];
    const auto len = static_cast<int64_t>(r.context.size());
    for (int64_t pos = sp.first_new_pos; pos < len; ++pos) {
      if (batch_.size() == max_rows) run();
      const bool last = pos == len - 1;
      batch_.Add(r.context[static_cast<size_t>(pos)], pos, r.key, last);
      if (last) logit_owner.push_back(&r);
    }
  }
  run();

  // 2. Draft: one pass per token, every sequence that wants more in the same pass.
  for (;;) {
    steps_.clear();
    for (const DraftRequest& r : requests) {
      if (r.draft->empty() || static_cast<int32_t>(r.draft->size()) >= r.max_tokens) continue;
      std::vector<int32_t>& tokens = step_tokens_[static_cast<size_t>(r.key)];
      tokens.assign(1, r.draft->back());
      steps_.push_back({r.key, tokens});
      batch_.Add(r.draft->back(), manager_->num_tokens(r.key), r.key, true);
      logit_owner.push_back(&r);
    }
    if (steps_.empty()) return;
    const auto started = std::chrono::steady_clock::now();
    if (!RunBatch()) {  // no room in the pool: the drafts stay as long as they are
      batch_.Clear();
      return;
    }
    run();
    // As the step cost curve does: the median of the recent passes.
    pass_window_[passes_++ % kCostWindow] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    pass_ms_ = MedianOfWindow(pass_window_, std::min(passes_, kCostWindow));
  }
}

}  // namespace kvl
