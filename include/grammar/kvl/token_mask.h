// Which tokens a grammar allows next, over a whole vocabulary, without a pass over every token's
// text at each step.
//
// GrammarVocabulary holds each token's bytes in a trie laid out in preorder (a node's subtree is
// the index range that follows it), built once per vocabulary and shared by every constrained
// sequence. GrammarConstraint walks that trie from the sequence's grammar state: a node's state
// is its parent's state advanced by one byte (a DFA table lookup once the state is known,
// kvl/grammar_matcher.h), a token is allowed when its node's state is alive, and a node whose
// state is dead skips its whole subtree. Tokens with no text (control tokens) are never allowed,
// except the end-of-generation tokens, which are allowed exactly when the grammar may end.
//
// A walk's result is kept per grammar state (a few slots), so the states a JSON output returns
// to again and again (inside a string, between values) cost a lookup, not a walk.
//
// Thread-safety: GrammarVocabulary is immutable and shared; a GrammarConstraint belongs to one
// sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvl/grammar.h"
#include "kvl/grammar_matcher.h"
#include "kvl/status.h"

namespace kvl {

class GrammarVocabulary {
 public:
  // pieces[id]: the bytes token `id` adds to the output (empty: a control token, never matched
  // against a grammar); end_of_generation: the ids that end the output (EOS, end of turn).
  GrammarVocabulary(std::vector<std::string> pieces, std::vector<int32_t> end_of_generation);

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  bool IsEndOfGeneration(int32_t id) const { return is_eog_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& end_of_generation() const { return eog_ids_; }
  size_t num_trie_nodes() const { return nodes_.size(); }

 private:
  friend class GrammarConstraint;
  struct TrieNode {
    uint8_t byte;           // the byte that leads here from the parent
    uint16_t depth;         // 1 for the root's children
    uint32_t subtree_end;   // one past the last node of this node's subtree
    uint32_t tokens_begin;  // tokens whose text ends here: node_tokens_[begin, end)
    uint32_t tokens_end;
  };

  std::vector<std::string> pieces_;
  std::vector<uint8_t> is_eog_;
  std::vector<int32_t> eog_ids_;
  std::vector<TrieNode> nodes_;       // preorder, without the root
  std::vector<int32_t> node_tokens_;
  size_t max_depth_ = 0;
};

// One sequence's grammar state over a vocabulary.
class GrammarConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                    std::shared_ptr<const GrammarVocabulary> vocabulary);

  // The tokens allowed next: bit (t % 64) of word t / 64 set for an allowed token t. Valid until
  // the next Accept. Sets *any_allowed to false where no token is (a dead end: the vocabulary
  // cannot spell any continuation the grammar allows).
  const uint64_t* AllowedTokens(bool* any_allowed);
  // Advances past `token`. INVALID_ARGUMENT when the grammar does not allow it.
  Status Accept(int32_t token);

  bool IsAccepting() const { return matcher_.IsAccepting(matcher_.current()); }
  // The output is complete: only an end-of-generation token may follow.
  bool IsFinished() const { return matcher_.IsFinished(matcher_.current()); }
  const GrammarMatcher& matcher() const { return matcher_; }
  GrammarMatcher& matcher() { return matcher_; }

 private:
  // One cached walk: the state it was computed for and its mask.
  struct MaskSlot {
    GrammarMatcher::StateId state = GrammarMatcher::kDead;
    uint64_t generation = 0;
    bool any_allowed = false;
    std::vector<uint64_t> words;
  };
  static constexpr size_t kMaskSlots = 8;

  void Walk(GrammarMatcher::StateId state, MaskSlot* slot);

  std::shared_ptr<const GrammarVocabulary> vocab_;
  GrammarMatcher matcher_;
  std::vector<MaskSlot> slots_;
  size_t next_slot_ = 0;
  std::vector<GrammarMatcher::StateId> depth_states_;  // [depth] the walk's state at each depth
};

}  // namespace kvl
