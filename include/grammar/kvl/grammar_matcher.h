// A pushdown matcher for a Grammar over bytes, with its states cached as a lazily built DFA.
//
// A match position is a set of stacks of rule positions, as llama.cpp's llama-grammar keeps
// them: each stack's top is the character class the next code point must match, the frames
// under it the places to continue in the calling rules. Stacks are stored as shared tails (a
// node is a position and its parent node), interned, so that two stacks with the same frames
// are the same node and a set of stacks is a sorted list of node ids. That set, plus a UTF-8
// character still incomplete, is a DFA state: its transition on each byte is computed once and
// kept, so walking a token trie (kvl/token_mask.h) costs one table lookup per trie node once the
// grammar's common states have been seen.
//
// Bytes are taken one at a time, a multi-byte character completing over several of them (and
// several tokens); a partial character already impossible under every stack is refused at once.
// Invalid UTF-8 is refused.
//
// The cache grows with the states visited; past its limit it is dropped and rebuilt from the
// current state (Compact), which keeps a long constrained output's memory bounded.
//
// Thread-safety: one matcher per sequence; not shared.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvl/grammar.h"

namespace kvl {

class GrammarMatcher {
 public:
  using StateId = int32_t;
  static constexpr StateId kDead = -1;

  // The matcher at the start of the grammar's root rule.
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // The state after `byte` from `state`, or kDead. Cached; computes and caches it the first time.
  StateId Next(StateId state, uint8_t byte) {
    const int32_t cached = transitions_[static_cast<size_t>(state)][byte];
    return cached != kUnknown ? cached : ComputeNext(state, byte);
  }
  // The state after `bytes` from `state` (kDead as soon as one is refused).
  StateId NextBytes(StateId state, std::string_view bytes);

  StateId current() const { return current_; }
  // Moves the current state; `state` must be a live state of this matcher. Between tokens, the
  // caches may be rebuilt (Compact), which renumbers states: hold no StateId across that.
  void set_current(StateId state) { current_ = state; }

  // The grammar may end here: a stack has emptied and no UTF-8 character is pending.
  bool IsAccepting(StateId state) const { return states_[static_cast<size_t>(state)].accepting; }
  // Nothing but the end may follow (every stack emptied).
  bool IsFinished(StateId state) const { return states_[static_cast<size_t>(state)].finished; }

  // How many states and stack nodes the caches hold (tests; the limit's check).
  size_t num_states() const { return states_.size(); }
  size_t num_stack_nodes() const { return nodes_.size(); }
  // When the caches have grown past their limits: drops them and keeps only the current state
  // (renumbered). Call only between tokens, when no other StateId is held.
  void CompactIfLarge(size_t max_states = 4096, size_t max_nodes = 1 << 20);
  // Tells the owner of per-state caches that states were renumbered.
  uint64_t generation() const { return generation_; }

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kEmptyStack = -1;  // a stack with no frames left: the grammar ended

  // A stack frame: the element to match next in some rule, and the frame below it (-1: none).
  struct StackNode {
    uint32_t pos;
    int32_t parent;
  };
  // A character class starting at an element: its ranges, and the element after it.
  struct CharClass {
    bool negated = false;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive
    uint32_t next = 0;
    bool Matches(uint32_t cp) const;
    // Some code point in [lo, hi] matches (for a partial UTF-8 character).
    bool MayMatch(uint32_t lo, uint32_t hi) const;
  };
  struct State {
    std::vector<int32_t> tops;   // sorted node ids; kEmptyStack first where present
    uint32_t partial = 0;        // the bits of an incomplete UTF-8 character
    uint8_t partial_left = 0;    // its continuation bytes still to come
    bool accepting = false;
    bool finished = false;
  };

  void Flatten(const Grammar& grammar);
  int32_t InternNode(uint32_t pos, int32_t parent);
  // Every stack top reachable from frame (pos, parent) without consuming a character: class
  // positions, or kEmptyStack where the whole stack completes.
  void Expand(uint32_t pos, int32_t parent, std::vector<int32_t>* out);
  StateId InternState(std::vector<int32_t>* tops, uint32_t partial, uint8_t partial_left);
  StateId ComputeNext(StateId state, uint8_t byte);
  StateId AdvanceCodePoint(StateId state, uint32_t cp);
  StateId InitialState();

  std::shared_ptr<const Grammar> grammar_;
  std::vector<GrammarElem> elems_;               // every rule, one after another
  std::vector<std::vector<uint32_t>> rule_alts_;  // [rule] where each alternative starts
  std::vector<int32_t> class_index_;              // [elem] index into classes_, or -1
  std::vector<CharClass> classes_;

  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::vector<std::array<int32_t, 256>> transitions_;  // [state][byte]
  std::unordered_map<std::string, StateId> state_ids_;  // key: the state's bytes
  std::vector<int32_t> scratch_;
  StateId current_ = kDead;
  uint64_t generation_ = 0;
};

}  // namespace kvl
