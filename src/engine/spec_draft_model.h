// Speculative decoding (issue 26, item 2): drafts from a small model of the same vocabulary
// (`-md DRAFT.gguf`, `--spec draft`), run in the same engine beside the target: its own forward
// pass over its own small paged KV pool (a KvManager, its block storage and a PagedKvCache),
// sharing the engine's thread pool and kernels.
//
// The draft model's KV follows each target sequence's tokens: every DraftAll first compares what
// the draft pool holds for the sequence with the sequence's tokens, keeps the common part (a
// rejected draft is cut off with KvManager::TruncateTail, or the sequence is let go and admitted
// again, when the cut reaches into full blocks, so the draft pool's prefix cache finds what stays
// valid), runs the tokens it lacks in one batched pass, then drafts greedily, one batched pass
// per draft token for all sequences at once. Greedy drafts are deterministic, so the verifier's
// rule (step_runner_spec.cc) keeps the target distribution for sampled requests too.
//
// The draft pool's KV of a token is the draft model's K/V for exactly those tokens, whether the
// target accepted them or not, so its blocks carry identities (the draft's prefix cache) without
// the unverified marking the target's pool needs.
//
// Thread-safety: owned by the step loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvl/forward.h"
#include "kvl/kv_manager.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/status.h"
#include "kvl/tokenizer.h"
#include "spec_cost.h"
#include "spec_drafter.h"

namespace kvl {

struct DraftModelOptions {
  std::string path;             // -md
  int32_t max_seqs = 16;        // the target's sequence slots (DraftRequest::key's range)
  int64_t context_length = 0;   // the target's context (the draft needs one as long)
  int32_t draft_max = 8;        // draft tokens per sequence and step
  int64_t max_batch_tokens = 512;  // rows of one draft pass (catch-up runs in chunks)
  int32_t block_tokens = 16;    // the draft pool's block (attention reads a block per run)
  // The draft pool's bytes: at most this, less where every slot's whole context fits in less.
  // The engine carves what the pool takes from the KV budget (pool_bytes()).
  int64_t budget_bytes = int64_t{256} << 20;
};

class DraftModelDrafter final : public Drafter {
 public:
  // Loads the draft model and checks its vocabulary against the target's tokenizer: the same
  // number of tokens, the same text for each and the same BOS / EOS, or INVALID_ARGUMENT naming
  // -md and the first difference.
  static StatusOr<std::unique_ptr<DraftModelDrafter>> Create(const DraftModelOptions& options,
                                                             const Tokenizer& target_vocab,
                                                             ops::OpsContext& ops);

  void Draft(std::span<const int32_t> context, int32_t max_tokens,
             std::vector<int32_t>* draft) override;
  void DraftAll(std::span<const DraftRequest> requests) override;
  void Forget(int32_t key) override;
  bool costly() const override { return true; }
  // The median of the last draft passes' times (one token for every sequence drafting): a
  // draft token's cost; the catch-up (a whole prompt, the first time) is paid once, not per
  // token.
  double pass_ms() const override { return pass_ms_; }

  // Tokens the draft pool holds for a sequence slot (tests).
  int64_t tokens_held(int32_t key) const;
  const KvManager& kv_manager() const { return *manager_; }
  // The draft pool's bytes, allocated at Create (the KV budget holds them).
  int64_t pool_bytes() const { return storage_->num_blocks() * storage_->layout().block_bytes(); }

 private:
  DraftModelDrafter() = default;
  // The slot's KV made to hold a prefix of `context`: what it holds beyond their common part is
  // cut (or the slot freed, when that part reaches into its full blocks). Returns the tokens of
  // `context` the slot now holds.
  int64_t Sync(int32_t key, std::span<const int32_t> context);
  // Appends the batch's tokens to their slots' KV (plan, block copies, commit) and runs the
  // forward pass; false when the pool has no room for them even after freeing idle slots.
  bool RunBatch();
  // Frees the slots not drafting this step, least recently used first, until `blocks` are free.
  void FreeIdleSlots(int64_t blocks);

  DraftModelOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Forward> forward_;
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<PagedKvCache> cache_;

  // Reused every call (no allocation once they reached their size).
  TokenBatch batch_;
  std::vector<KvSeqStep> steps_;
  std::vector<std::vector<int32_t>> step_tokens_;  // [slot] tokens the batch appends
  KvPlan plan_;
  std::vector<const DraftRequest*> logit_owner_;  // the request of each logits row of a pass
  std::vector<int64_t> last_used_;  // [slot] the call that last drafted for it
  std::vector<bool> busy_;          // [slot] drafting in this call
  int64_t calls_ = 0;
  double pass_window_[kCostWindow] = {};  // the last draft passes' ms
  size_t passes_ = 0;
  double pass_ms_ = 0;
};

}  // namespace kvl
