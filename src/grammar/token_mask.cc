// The token trie and the per-step walk over it (kvl/token_mask.h).
#include "kvl/token_mask.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace kvl {

GrammarVocabulary::GrammarVocabulary(std::vector<std::string> pieces,
                                     std::vector<int32_t> end_of_generation)
    : pieces_(std::move(pieces)), is_eog_(pieces_.size(), 0) {
  for (const int32_t id : end_of_generation) {
    if (id < 0 || id >= vocab_size() || is_eog_[static_cast<size_t>(id)]) continue;
    is_eog_[static_cast<size_t>(id)] = 1;
    eog_ids_.push_back(id);
  }
  // The tokens with text, sorted by it: the trie is then built in one pass, each token sharing
  // the path of its common prefix with the one before it, and the nodes come out in preorder.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!pieces_[static_cast<size_t>(id)].empty() && !is_eog_[static_cast<size_t>(id)]) {
      order.push_back(id);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces_[static_cast<size_t>(a)] < pieces_[static_cast<size_t>(b)];
  });
  std::vector<uint32_t> path;  // node index at each depth - 1 of the previous token's path
  const std::string* previous = nullptr;
  for (const int32_t id : order) {
    const std::string& text = pieces_[static_cast<size_t>(id)];
    size_t common = 0;
    if (previous != nullptr) {
      const size_t limit = std::min(previous->size(), text.size());
      while (common < limit && (*previous)[common] == text[common]) ++common;
    }
    // Close the nodes below the common prefix: their subtrees end here.
    while (path.size() > common) {
      nodes_[path.back()].subtree_end = static_cast<uint32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < text.size(); ++d) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back({static_cast<uint8_t>(text[d]), static_cast<uint16_t>(d + 1), 0,
                        static_cast<uint32_t>(node_tokens_.size()),
                        static_cast<uint32_t>(node_tokens_.size())});
    }
    // The token ends at the last node of its path (tokens with the same text are adjacent).
    TrieNode& last = nodes_[path.back()];
    if (last.tokens_end != node_tokens_.size()) {
      last.tokens_begin = static_cast<uint32_t>(node_tokens_.size());
    }
    node_tokens_.push_back(id);
    last.tokens_end = static_cast<uint32_t>(node_tokens_.size());
    max_depth_ = std::max(max_depth_, text.size());
    previous = &text;
  }
  while (!path.empty()) {
    nodes_[path.back()].subtree_end = static_cast<uint32_t>(nodes_.size());
    path.pop_back();
  }
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                                     std::shared_ptr<const GrammarVocabulary> vocabulary)
    : vocab_(std::move(vocabulary)),
      matcher_(std::move(grammar)),
      slots_(kMaskSlots),
      depth_states_(vocab_->max_depth_ + 1, GrammarMatcher::kDead) {
  const size_t words = (static_cast<size_t>(vocab_->vocab_size()) + 63) / 64;
  for (MaskSlot& slot : slots_) slot.words.assign(words, 0);
}

void GrammarConstraint::Walk(GrammarMatcher::StateId state, MaskSlot* slot) {
  std::fill(slot->words.begin(), slot->words.end(), 0);
  bool any = false;
  const std::vector<GrammarVocabulary::TrieNode>& nodes = vocab_->nodes_;
  const int32_t* node_tokens = vocab_->node_tokens_.data();
  uint64_t* words = slot->words.data();
  depth_states_[0] = state;
  const size_t n = nodes.size();
  for (size_t i = 0; i < n;) {
    const GrammarVocabulary::TrieNode& node = nodes[i];
    const GrammarMatcher::StateId next = matcher_.Next(depth_states_[node.depth - 1], node.byte);
    if (next == GrammarMatcher::kDead) {
      i = node.subtree_end;  // no token below this prefix can be allowed
      continue;
    }
    depth_states_[node.depth] = next;
    for (uint32_t t = node.tokens_begin; t < node.tokens_end; ++t) {
      const auto id = static_cast<uint32_t>(node_tokens[t]);
      words[id >> 6] |= uint64_t{1} << (id & 63);
      any = true;
    }
    ++i;
  }
  if (matcher_.IsAccepting(state)) {
    for (const int32_t id : vocab_->eog_ids_) {
      words[static_cast<uint32_t>(id) >> 6] |= uint64_t{1} << (static_cast<uint32_t>(id) & 63);
      any = true;
    }
  }
  slot->state = state;
  slot->generation = matcher_.generation();
  slot->any_allowed = any;
}

const uint64_t* GrammarConstraint::AllowedTokens(bool* any_allowed) {
  const GrammarMatcher::StateId state = matcher_.current();
  for (const MaskSlot& slot : slots_) {
    if (slot.state == state && slot.generation == matcher_.generation()) {
      *any_allowed = slot.any_allowed;
      return slot.words.data();
    }
  }
  MaskSlot& slot = slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % slots_.size();
  Walk(state, &slot);
  *any_allowed = slot.any_allowed;
  return slot.words.data();
}

Status GrammarConstraint::Accept(int32_t token) {
  if (token < 0 || token >= vocab_->vocab_size()) {
    return InvalidArgumentError(fmt::format("token {} is outside the vocabulary", token));
  }
  const GrammarMatcher::StateId state = matcher_.current();
  if (vocab_->IsEndOfGeneration(token)) {
    if (!matcher_.IsAccepting(state)) {
      return InvalidArgumentError("the grammar does not allow the output to end here");
    }
    return Status::Ok();
  }
  const std::string& piece = vocab_->piece(token);
  const GrammarMatcher::StateId next =
      piece.empty() ? GrammarMatcher::kDead : matcher_.NextBytes(state, piece);
  if (next == GrammarMatcher::kDead) {
    return InvalidArgumentError(fmt::format("the grammar does not allow token {} here", token));
  }
  matcher_.set_current(next);
  matcher_.CompactIfLarge();
  return Status::Ok();
}

}  // namespace kvl
