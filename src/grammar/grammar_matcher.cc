// The grammar's pushdown matcher with its states interned into a lazily built byte DFA. See
// kvl/grammar_matcher.h for the representation; the expansion is llama.cpp's advance_stack.
#include "kvl/grammar_matcher.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

namespace kvl {
namespace {

bool EndsAlternative(GrammarElemType type) {
  return type == GrammarElemType::kEnd || type == GrammarElemType::kAlt;
}

// Frames already expanded in one expansion: a grammar whose alternatives share continuations
// (a? b? c? ...) would otherwise expand the same frame again on every path to it.
thread_local std::unordered_set<uint64_t> expanded_frames;

}  // namespace

bool GrammarMatcher::CharClass::Matches(uint32_t cp) const {
  bool found = false;
  for (const auto& [lo, hi] : ranges) {
    if (cp >= lo && cp <= hi) {
      found = true;
      break;
    }
  }
  return found != negated;
}

bool GrammarMatcher::CharClass::MayMatch(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto& [a, b] : ranges) {
      if (a <= hi && b >= lo) return true;
    }
    return false;
  }
  // ranges are sorted and merged (Flatten): is [lo, hi] wholly inside them?
  uint32_t next = lo;
  for (const auto& [a, b] : ranges) {
    if (a > next) break;
    if (b >= next) {
      if (b >= hi) return false;
      next = b + 1;
    }
  }
  return true;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)) {
  Flatten(*grammar_);
  current_ = InitialState();
}

void GrammarMatcher::Flatten(const Grammar& grammar) {
  std::vector<uint32_t> rule_start(grammar.rules.size());
  for (size_t r = 0; r < grammar.rules.size(); ++r) {
    rule_start[r] = static_cast<uint32_t>(elems_.size());
    elems_.insert(elems_.end(), grammar.rules[r].begin(), grammar.rules[r].end());
  }
  rule_alts_.resize(grammar.rules.size());
  for (size_t r = 0; r < grammar.rules.size(); ++r) {
    rule_alts_[r].push_back(rule_start[r]);
    for (size_t i = 0; i < grammar.rules[r].size(); ++i) {
      if (grammar.rules[r][i].type == GrammarElemType::kAlt) {
        rule_alts_[r].push_back(rule_start[r] + static_cast<uint32_t>(i) + 1);
      }
    }
  }
  // Every class start: its ranges (sorted and merged, for MayMatch) and the element after it.
  class_index_.assign(elems_.size(), -1);
  for (size_t pos = 0; pos < elems_.size(); ++pos) {
    const GrammarElemType type = elems_[pos].type;
    if (type != GrammarElemType::kChar && type != GrammarElemType::kCharNot &&
        type != GrammarElemType::kCharAny) {
      continue;
    }
    // A kChar inside a class is a kCharAlt, so a kChar/kCharNot/kCharAny always starts one.
    CharClass cls;
    cls.negated = type == GrammarElemType::kCharNot;
    size_t i = pos;
    do {
      if (elems_[i].type == GrammarElemType::kCharAny) {
        cls.ranges.push_back({0, 0x10FFFF});
        ++i;
      } else if (i + 1 < elems_.size() &&
                 elems_[i + 1].type == GrammarElemType::kCharRangeUpper) {
        cls.ranges.push_back({elems_[i].value, elems_[i + 1].value});
        i += 2;
      } else {
        cls.ranges.push_back({elems_[i].value, elems_[i].value});
        ++i;
      }
    } while (i < elems_.size() && elems_[i].type == GrammarElemType::kCharAlt);
    std::sort(cls.ranges.begin(), cls.ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& range : cls.ranges) {
      if (!merged.empty() && range.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, range.second);
      } else {
        merged.push_back(range);
      }
    }
    cls.ranges = std::move(merged);
    cls.next = static_cast<uint32_t>(i);
    class_index_[pos] = static_cast<int32_t>(classes_.size());
    classes_.push_back(std::move(cls));
    pos = i - 1;  // the class's own elements start nothing
  }
}

int32_t GrammarMatcher::InternNode(uint32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | static_cast<uint32_t>(parent);
  const auto [it, inserted] = node_ids_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarMatcher::Expand(uint32_t pos, int32_t parent, std::vector<int32_t>* out) {
  const uint64_t key = (static_cast<uint64_t>(pos) << 32) | static_cast<uint32_t>(parent);
  if (!expanded_frames.insert(key).second) return;
  const GrammarElem elem = elems_[pos];
  if (EndsAlternative(elem.type)) {
    // This frame's rule is done: continue in the frame below, or the whole stack is.
    if (parent < 0) {
      out->push_back(kEmptyStack);
    } else {
      const StackNode below = nodes_[static_cast<size_t>(parent)];
      Expand(below.pos, below.parent, out);
    }
  } else if (elem.type == GrammarElemType::kRuleRef) {
    // A call in tail position returns straight to the caller's caller (llama.cpp skips it too),
    // so a right-recursive repetition does not grow the stack.
    const uint32_t cont = pos + 1;
    const int32_t cont_parent =
        EndsAlternative(elems_[cont].type) ? parent : InternNode(cont, parent);
    for (const uint32_t alt : rule_alts_[elem.value]) Expand(alt, cont_parent, out);
  } else {
    out->push_back(InternNode(pos, parent));
  }
}

GrammarMatcher::StateId GrammarMatcher::InternState(std::vector<int32_t>* tops, uint32_t partial,
                                                    uint8_t partial_left) {
  std::sort(tops->begin(), tops->end());
  tops->erase(std::unique(tops->begin(), tops->end()), tops->end());
  std::string key(tops->size() * sizeof(int32_t) + 5, '\0');
  std::memcpy(key.data(), tops->data(), tops->size() * sizeof(int32_t));
  std::memcpy(key.data() + tops->size() * sizeof(int32_t), &partial, 4);
  key.back() = static_cast<char>(partial_left);
  const auto [it, inserted] = state_ids_.try_emplace(std::move(key), 0);
  if (!inserted) return it->second;
  const auto id = static_cast<StateId>(states_.size());
  it->second = id;
  State state;
  state.tops = *tops;
  state.partial = partial;
  state.partial_left = partial_left;
  const bool emptied = !tops->empty() && tops->front() == kEmptyStack;
  state.accepting = emptied && partial_left == 0;
  state.finished = state.accepting && tops->size() == 1;
  states_.push_back(std::move(state));
  std::array<int32_t, 256> unknown;
  unknown.fill(kUnknown);
  transitions_.push_back(unknown);
  return id;
}

GrammarMatcher::StateId GrammarMatcher::InitialState() {
  expanded_frames.clear();
  std::vector<int32_t> tops;
  for (const uint32_t alt : rule_alts_[grammar_->root]) Expand(alt, -1, &tops);
  return InternState(&tops, 0, 0);
}

GrammarMatcher::StateId GrammarMatcher::AdvanceCodePoint(StateId state, uint32_t cp) {
  expanded_frames.clear();
  scratch_.clear();
  // A copy: expansion interns nodes and states, which may move states_.
  const std::vector<int32_t> tops = states_[static_cast<size_t>(state)].tops;
  for (const int32_t top : tops) {
    if (top == kEmptyStack) continue;
    const StackNode node = nodes_[static_cast<size_t>(top)];
    const CharClass& cls = classes_[static_cast<size_t>(class_index_[node.pos])];
    if (cls.Matches(cp)) Expand(cls.next, node.parent, &scratch_);
  }
  if (scratch_.empty()) return kDead;
  return InternState(&scratch_, 0, 0);
}

GrammarMatcher::StateId GrammarMatcher::ComputeNext(StateId state, uint8_t byte) {
  const State& s = states_[static_cast<size_t>(state)];
  StateId next = kDead;
  uint32_t partial = 0;
  uint8_t left = 0;
  bool complete = false;
  // The second byte after E0, ED, F0 or F4 may not start an overlong form, a surrogate or a
  // code point past U+10FFFF.
  const bool second_byte_bad =
      (s.partial_left == 2 && s.partial == 0x0 && byte < 0xA0) ||
      (s.partial_left == 2 && s.partial == 0xD && byte >= 0xA0) ||
      (s.partial_left == 3 && s.partial == 0x0 && byte < 0x90) ||
      (s.partial_left == 3 && s.partial == 0x4 && byte >= 0x90);
  if (s.partial_left > 0) {
    if ((byte & 0xC0) == 0x80 && !second_byte_bad) {
      partial = (s.partial << 6) | (byte & 0x3F);
      left = static_cast<uint8_t>(s.partial_left - 1);
      complete = left == 0;
    } else {
      left = 0xFF;  // not a continuation byte: invalid UTF-8
    }
  } else if (byte < 0x80) {
    partial = byte;
    complete = true;
  } else if (byte >= 0xC2 && byte <= 0xDF) {
    partial = byte & 0x1F;
    left = 1;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    partial = byte & 0x0F;
    left = 2;
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    partial = byte & 0x07;
    left = 3;
  } else {
    left = 0xFF;  // a continuation byte with nothing to continue, or never valid in UTF-8
  }
  if (complete) {
    next = AdvanceCodePoint(state, partial);
  } else if (left != 0xFF) {
    // Incomplete: live only if some stack's class can match a character it may complete to.
    uint32_t lo = partial << (6 * left);
    uint32_t hi = std::min<uint32_t>(lo | ((1u << (6 * left)) - 1), 0x10FFFF);
    // E0 and F0 carry no bits of their own: their characters start at U+0800 and U+10000;
    // ED's stop before the surrogates.
    if (left == 2 && partial == 0) lo = 0x800;
    if (left == 3 && partial == 0) lo = 0x10000;
    if (left == 2 && partial == 0xD) hi = 0xD7FF;
    bool possible = false;
    for (const int32_t top : s.tops) {
      if (top == kEmptyStack) continue;
      const StackNode node = nodes_[static_cast<size_t>(top)];
      if (classes_[static_cast<size_t>(class_index_[node.pos])].MayMatch(lo, hi)) {
        possible = true;
        break;
      }
    }
    if (possible) {
      std::vector<int32_t> tops = s.tops;
      std::erase(tops, kEmptyStack);  // the grammar cannot end inside a character
      next = InternState(&tops, partial, left);
    }
  }
  transitions_[static_cast<size_t>(state)][byte] = next;
  return next;
}

GrammarMatcher::StateId GrammarMatcher::NextBytes(StateId state, std::string_view bytes) {
  for (const char c : bytes) {
    state = Next(state, static_cast<uint8_t>(c));
    if (state == kDead) return kDead;
  }
  return state;
}

void GrammarMatcher::CompactIfLarge(size_t max_states, size_t max_nodes) {
  if (states_.size() <= max_states && nodes_.size() <= max_nodes) return;
  const State keep = states_[static_cast<size_t>(current_)];
  // Each stack of the current state as its frames' positions, top first.
  std::vector<std::vector<uint32_t>> stacks;
  for (const int32_t top : keep.tops) {
    std::vector<uint32_t> frames;
    for (int32_t n = top; n >= 0; n = nodes_[static_cast<size_t>(n)].parent) {
      frames.push_back(nodes_[static_cast<size_t>(n)].pos);
    }
    stacks.push_back(std::move(frames));
  }
  nodes_.clear();
  node_ids_.clear();
  states_.clear();
  transitions_.clear();
  state_ids_.clear();
  std::vector<int32_t> tops;
  for (size_t i = 0; i < stacks.size(); ++i) {
    if (keep.tops[i] == kEmptyStack) {
      tops.push_back(kEmptyStack);
      continue;
    }
    int32_t parent = -1;
    for (auto it = stacks[i].rbegin(); it != stacks[i].rend(); ++it) {
      parent = InternNode(*it, parent);
    }
    tops.push_back(parent);
  }
  current_ = InternState(&tops, keep.partial, keep.partial_left);
  ++generation_;
}

}  // namespace kvl
