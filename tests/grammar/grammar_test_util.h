// What the grammar tests share: a whole-string check through the matcher, a reference matcher
// written the plain way (llama.cpp's original vectors of stacks, no interning, no DFA), and a
// random string generator that derives strings from a grammar.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kvl/grammar.h"
#include "kvl/grammar_matcher.h"

namespace kvl::testing {

inline std::shared_ptr<const Grammar> MustParse(std::string_view gbnf) {
  auto grammar = ParseGbnf(gbnf);
  EXPECT_TRUE(grammar.ok()) << grammar.status().ToString() << "\n" << gbnf;
  return grammar.ok() ? *grammar : nullptr;
}

// The matcher takes the whole text and may end after it.
inline bool MatcherAccepts(GrammarMatcher& matcher, std::string_view text) {
  const GrammarMatcher::StateId end = matcher.NextBytes(matcher.current(), text);
  return end != GrammarMatcher::kDead && matcher.IsAccepting(end);
}

inline std::vector<uint32_t> DecodeUtf8(std::string_view text) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    for (int k = 1; k < n && i + static_cast<size_t>(k) < text.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(text[i + static_cast<size_t>(k)]) & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

inline void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// llama.cpp's first matcher, kept simple: a stack is a vector of (rule, element index) frames,
// the top last; each code point maps the set of stacks to the next.
class ReferenceMatcher {
 public:
  explicit ReferenceMatcher(const Grammar& g) : g_(g) {}

  bool Accepts(std::string_view text) const {
    std::vector<Stack> stacks;
    for (size_t alt : AltStarts(g_.root)) Advance({{g_.root, alt}}, &stacks);
    for (uint32_t cp : DecodeUtf8(text)) {
      std::vector<Stack> next;
      for (const Stack& s : stacks) {
        if (s.empty()) continue;
        const auto [rule, at] = s.back();
        size_t end = 0;
        if (!MatchClass(rule, at, cp, &end)) continue;
        Stack popped = s;
        popped.back().second = end;
        Advance(popped, &next);
      }
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      stacks = std::move(next);
      if (stacks.empty()) return false;
    }
    return std::any_of(stacks.begin(), stacks.end(), [](const Stack& s) { return s.empty(); });
  }

 private:
  using Stack = std::vector<std::pair<uint32_t, size_t>>;

  std::vector<size_t> AltStarts(uint32_t rule) const {
    std::vector<size_t> starts = {0};
    const auto& r = g_.rules[rule];
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i].type == GrammarElemType::kAlt) starts.push_back(i + 1);
    }
    return starts;
  }

  // Expands the top frame until it is a character class (or the stack is empty).
  void Advance(Stack s, std::vector<Stack>* out) const {
    if (s.empty()) {
      out->push_back(s);
      return;
    }
    const auto [rule, at] = s.back();
    const GrammarElem e = g_.rules[rule][at];
    if (e.type == GrammarElemType::kEnd || e.type == GrammarElemType::kAlt) {
      s.pop_back();
      if (!s.empty()) {
        // The caller continues after its reference.
        ++s.back().second;
      }
      Advance(s, out);
    } else if (e.type == GrammarElemType::kRuleRef) {
      for (size_t alt : AltStarts(e.value)) {
        Stack pushed = s;
        pushed.push_back({e.value, alt});
        Advance(pushed, out);
      }
    } else {
      out->push_back(s);
    }
  }

  bool MatchClass(uint32_t rule, size_t at, uint32_t cp, size_t* end) const {
    const auto& r = g_.rules[rule];
    const bool negated = r[at].type == GrammarElemType::kCharNot;
    bool found = false;
    size_t i = at;
    do {
      if (r[i].type == GrammarElemType::kCharAny) {
        found = true;
        ++i;
      } else if (r[i + 1].type == GrammarElemType::kCharRangeUpper) {
        found = found || (r[i].value <= cp && cp <= r[i + 1].value);
        i += 2;
      } else {
        found = found || r[i].value == cp;
        ++i;
      }
    } while (r[i].type == GrammarElemType::kCharAlt);
    *end = i;
    return found != negated;
  }

  const Grammar& g_;
};

// Random strings derived from a grammar: an alternative at random while shallow, the shortest
// way out past `max_depth` (so every derivation ends).
class GrammarSampler {
 public:
  GrammarSampler(const Grammar& g, uint64_t seed) : g_(g), rng_(seed) { ComputeMinLengths(); }

  std::string Generate(size_t max_depth = 12) {
    std::string out;
    Derive(g_.root, 0, max_depth, &out);
    return out;
  }

 private:
  static constexpr size_t kInfinite = 1 << 30;

  std::vector<std::pair<size_t, size_t>> Alternatives(uint32_t rule) const {
    std::vector<std::pair<size_t, size_t>> alts;
    size_t begin = 0;
    const auto& r = g_.rules[rule];
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i].type == GrammarElemType::kAlt || r[i].type == GrammarElemType::kEnd) {
        alts.push_back({begin, i});
        begin = i + 1;
      }
    }
    return alts;
  }

  size_t AltMinLength(uint32_t rule, std::pair<size_t, size_t> alt) const {
    size_t total = 0;
    const auto& r = g_.rules[rule];
    for (size_t i = alt.first; i < alt.second; ++i) {
      const GrammarElemType t = r[i].type;
      if (t == GrammarElemType::kRuleRef) {
        total += min_length_[r[i].value];
      } else if (t == GrammarElemType::kChar || t == GrammarElemType::kCharNot ||
                 t == GrammarElemType::kCharAny) {
        total += 1;
      }
      total = std::min(total, kInfinite);
    }
    return total;
  }

  void ComputeMinLengths() {
    min_length_.assign(g_.rules.size(), kInfinite);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < g_.rules.size(); ++r) {
        for (const auto& alt : Alternatives(r)) {
          const size_t len = AltMinLength(r, alt);
          if (len < min_length_[r]) {
            min_length_[r] = len;
            changed = true;
          }
        }
      }
    }
  }

  uint32_t RandomCodePoint(const std::vector<GrammarElem>& r, size_t at, size_t* end) {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    const bool negated = r[at].type == GrammarElemType::kCharNot;
    size_t i = at;
    do {
      if (r[i].type == GrammarElemType::kCharAny) {
        ranges.push_back({0, 0x10FFFF});
        ++i;
      } else if (r[i + 1].type == GrammarElemType::kCharRangeUpper) {
        ranges.push_back({r[i].value, r[i + 1].value});
        i += 2;
      } else {
        ranges.push_back({r[i].value, r[i].value});
        ++i;
      }
    } while (r[i].type == GrammarElemType::kCharAlt);
    *end = i;
    auto inside = [&](uint32_t cp) {
      for (auto [lo, hi] : ranges) {
        if (cp >= lo && cp <= hi) return true;
      }
      return false;
    };
    if (!negated && r[at].type != GrammarElemType::kCharAny) {
      const auto [lo, hi] = ranges[rng_() % ranges.size()];
      return lo + static_cast<uint32_t>(rng_() % (hi - lo + 1));
    }
    // Candidates from ASCII and a few wider characters, skipping surrogates.
    static const uint32_t kWide[] = {0xE9, 0x3B1, 0x4E2D, 0x1F600, 0x20AC};
    for (int tries = 0; tries < 1000; ++tries) {
      const uint32_t cp = rng_() % 4 == 0 ? kWide[rng_() % 5] : 0x20 + rng_() % 0x5F;
      if (inside(cp) != negated) return cp;
    }
    ADD_FAILURE() << "no character found for a class";
    return 'x';
  }

  void Derive(uint32_t rule, size_t depth, size_t max_depth, std::string* out) {
    const auto alts = Alternatives(rule);
    std::pair<size_t, size_t> alt = alts[rng_() % alts.size()];
    if (depth > max_depth || AltMinLength(rule, alt) >= kInfinite) {
      alt = *std::min_element(alts.begin(), alts.end(), [&](auto a, auto b) {
        return AltMinLength(rule, a) < AltMinLength(rule, b);
      });
    }
    const auto& r = g_.rules[rule];
    for (size_t i = alt.first; i < alt.second;) {
      const GrammarElemType t = r[i].type;
      if (t == GrammarElemType::kRuleRef) {
        Derive(r[i].value, depth + 1, max_depth, out);
        ++i;
      } else {
        size_t end = i + 1;
        AppendUtf8(RandomCodePoint(r, i, &end), out);
        i = end;
      }
    }
  }

  const Grammar& g_;
  std::mt19937_64 rng_;
  std::vector<size_t> min_length_;
};

}  // namespace kvl::testing
