// GBNF parsing as llama.cpp's llama_grammar_parser does it: a recursive descent over the text
// that emits flat elements, groups and repetitions becoming generated rules. Errors are Status
// values with the line and column of the offending character, never exceptions.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "kvl/grammar.h"

namespace kvl {
namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// The largest count a {m,n} repetition may name; the element limit bounds what it expands to.
constexpr uint64_t kMaxRepetition = 100000;

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  StatusOr<std::shared_ptr<const Grammar>> Parse(std::string_view root);

 private:
  // A parse error at byte offset `at`, with its line and column (both from 1).
  Status ErrorAt(size_t at, std::string_view what) const;
  char Peek(size_t at) const { return at < text_.size() ? text_[at] : '\0'; }
  // Skips spaces, tabs and comments; newlines too where `newline_ok` (inside groups).
  size_t SkipSpace(size_t at, bool newline_ok) const;
  size_t ParseName(size_t at) const;
  uint32_t SymbolId(std::string_view name);
  uint32_t GenerateSymbolId(std::string_view base);
  void AddRule(uint32_t id, std::vector<GrammarElem> rule);
  // A UTF-8 character or an escape; sets *error on a bad escape.
  std::optional<uint32_t> ParseChar(size_t* at);
  // Each returns the offset after what it parsed, or sets error_.
  size_t ParseAlternates(size_t at, std::string_view rule_name, uint32_t rule_id, bool nested);
  size_t ParseSequence(size_t at, std::string_view rule_name, std::vector<GrammarElem>* out,
                       bool nested);
  bool Repeat(size_t at, std::string_view rule_name, size_t last_sym_start, uint64_t min,
              std::optional<uint64_t> max, std::vector<GrammarElem>* out);
  bool CountElements(size_t at, size_t added);
  Status CheckLeftRecursion() const;

  std::string_view text_;
  std::map<std::string, uint32_t, std::less<>> symbol_ids_;
  std::vector<std::string> names_;
  std::vector<std::vector<GrammarElem>> rules_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;  // where each symbol was first referenced, for errors
  size_t num_elements_ = 0;
  Status error_;
};

Status GbnfParser::ErrorAt(size_t at, std::string_view what) const {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < at && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return InvalidArgumentError(fmt::format("grammar: line {}, column {}: {}", line, column, what));
}

size_t GbnfParser::SkipSpace(size_t at, bool newline_ok) const {
  while (at < text_.size()) {
    const char c = text_[at];
    if (c == ' ' || c == '\t' || ((c == '\r' || c == '\n') && newline_ok)) {
      ++at;
    } else if (c == '#') {
      while (at < text_.size() && text_[at] != '\n' && text_[at] != '\r') ++at;
    } else {
      break;
    }
  }
  return at;
}

size_t GbnfParser::ParseName(size_t at) const {
  while (at < text_.size() && IsWordChar(text_[at])) ++at;
  return at;
}

uint32_t GbnfParser::SymbolId(std::string_view name) {
  if (auto it = symbol_ids_.find(name); it != symbol_ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(names_.size());
  symbol_ids_.emplace(std::string(name), id);
  names_.emplace_back(name);
  rules_.emplace_back();
  defined_.push_back(false);
  first_use_.push_back(0);
  return id;
}

uint32_t GbnfParser::GenerateSymbolId(std::string_view base) {
  const auto id = static_cast<uint32_t>(names_.size());
  return SymbolId(fmt::format("{}_{}", base, id));
}

void GbnfParser::AddRule(uint32_t id, std::vector<GrammarElem> rule) {
  rules_[id] = std::move(rule);
  defined_[id] = true;
}

bool GbnfParser::CountElements(size_t at, size_t added) {
  num_elements_ += added;
  if (num_elements_ <= kMaxGrammarElements) return true;
  error_ = ErrorAt(at, fmt::format("the grammar expands to more than {} elements",
                                   kMaxGrammarElements));
  return false;
}

std::optional<uint32_t> GbnfParser::ParseChar(size_t* at) {
  const size_t start = *at;
  const auto byte = static_cast<unsigned char>(Peek(start));
  if (byte == '\\') {
    const char e = Peek(start + 1);
    int hex_digits = 0;
    switch (e) {
      case 'x': hex_digits = 2; break;
      case 'u': hex_digits = 4; break;
      case 'U': hex_digits = 8; break;
      case 't': *at = start + 2; return '\t';
      case 'r': *at = start + 2; return '\r';
      case 'n': *at = start + 2; return '\n';
      case '\\': case '"': case '[': case ']': case '-': case '^': case '/':
        *at = start + 2;
        return static_cast<uint32_t>(e);
      default:
        error_ = ErrorAt(start, fmt::format("unknown escape '\\{}'", e));
        return std::nullopt;
    }
    uint32_t value = 0;
    for (int i = 0; i < hex_digits; ++i) {
      const char h = Peek(start + 2 + static_cast<size_t>(i));
      uint32_t digit;
      if (h >= '0' && h <= '9') digit = static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') digit = static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') digit = static_cast<uint32_t>(h - 'A' + 10);
      else {
        error_ = ErrorAt(start, fmt::format("'\\{}' needs {} hex digits", e, hex_digits));
        return std::nullopt;
      }
      value = value * 16 + digit;
    }
    if (value > 0x10FFFF) {
      error_ = ErrorAt(start, fmt::format("code point {:#x} is past U+10FFFF", value));
      return std::nullopt;
    }
    *at = start + 2 + static_cast<size_t>(hex_digits);
    return value;
  }
  if (byte == 0 && start >= text_.size()) {
    error_ = ErrorAt(start, "unexpected end of the grammar");
    return std::nullopt;
  }
  // One UTF-8 character; a malformed byte is taken as itself (as llama.cpp's decode_utf8).
  int length = byte < 0x80 ? 1 : byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
  uint32_t value = length == 1 ? byte : byte & (0x7F >> length);
  size_t i = 1;
  for (; i < static_cast<size_t>(length) && start + i < text_.size(); ++i) {
    const auto cont = static_cast<unsigned char>(text_[start + i]);
    if ((cont & 0xC0) != 0x80) break;
    value = (value << 6) | (cont & 0x3F);
  }
  if (i != static_cast<size_t>(length)) {
    value = byte;
    i = 1;
  }
  *at = start + i;
  return value;
}

size_t GbnfParser::ParseAlternates(size_t at, std::string_view rule_name, uint32_t rule_id,
                                   bool nested) {
  std::vector<GrammarElem> rule;
  at = ParseSequence(at, rule_name, &rule, nested);
  if (!error_.ok()) return at;
  while (Peek(at) == '|') {
    rule.push_back({GrammarElemType::kAlt, 0});
    at = SkipSpace(at + 1, true);
    at = ParseSequence(at, rule_name, &rule, nested);
    if (!error_.ok()) return at;
  }
  rule.push_back({GrammarElemType::kEnd, 0});
  if (!CountElements(at, rule.size())) return at;
  AddRule(rule_id, std::move(rule));
  return at;
}

size_t GbnfParser::ParseSequence(size_t at, std::string_view rule_name,
                                 std::vector<GrammarElem>* out, bool nested) {
  size_t last_sym_start = out->size();
  bool has_symbol = false;
  while (at < text_.size()) {
    const char c = text_[at];
    if (c == '"') {  // a literal: one element per character
      last_sym_start = out->size();
      has_symbol = true;
      ++at;
      while (Peek(at) != '"') {
        if (at >= text_.size()) {
          error_ = ErrorAt(at, "the literal is not closed (missing '\"')");
          return at;
        }
        const std::optional<uint32_t> ch = ParseChar(&at);
        if (!ch) return at;
        out->push_back({GrammarElemType::kChar, *ch});
      }
      at = SkipSpace(at + 1, nested);
    } else if (c == '[') {  // a character class
      last_sym_start = out->size();
      has_symbol = true;
      ++at;
      GrammarElemType start_type = GrammarElemType::kChar;
      if (Peek(at) == '^') {
        ++at;
        start_type = GrammarElemType::kCharNot;
      }
      bool first = true;
      while (Peek(at) != ']') {
        if (at >= text_.size()) {
          error_ = ErrorAt(at, "the character class is not closed (missing ']')");
          return at;
        }
        const std::optional<uint32_t> lo = ParseChar(&at);
        if (!lo) return at;
        out->push_back({first ? start_type : GrammarElemType::kCharAlt, *lo});
        first = false;
        if (Peek(at) == '-' && Peek(at + 1) != ']') {
          const size_t range_at = at;
          ++at;
          const std::optional<uint32_t> hi = ParseChar(&at);
          if (!hi) return at;
          if (*hi < *lo) {
            error_ = ErrorAt(range_at, "the range's upper bound is below its lower bound");
            return at;
          }
          out->push_back({GrammarElemType::kCharRangeUpper, *hi});
        }
      }
      if (first) {
        // [] matches nothing and [^] everything: written as a class that says so.
        if (start_type == GrammarElemType::kChar) {
          error_ = ErrorAt(at, "an empty character class '[]' can never match");
          return at;
        }
        out->push_back({GrammarElemType::kCharAny, 0});
      }
      at = SkipSpace(at + 1, nested);
    } else if (IsWordChar(c)) {  // a rule reference
      const size_t name_end = ParseName(at);
      const std::string_view name = text_.substr(at, name_end - at);
      // "name ::=" starts the next rule: this sequence ended at the line break before it.
      const size_t after = SkipSpace(name_end, nested);
      if (text_.substr(after, 3) == "::=") {
        error_ = ErrorAt(at, fmt::format("'{}' ::= starts a rule inside another rule (a missing "
                                         "line break?)", name));
        return at;
      }
      const uint32_t ref = SymbolId(name);
      if (first_use_[ref] == 0) first_use_[ref] = at + 1;
      last_sym_start = out->size();
      has_symbol = true;
      out->push_back({GrammarElemType::kRuleRef, ref});
      at = after;
    } else if (c == '(') {  // a group: a generated rule
      at = SkipSpace(at + 1, true);
      const uint32_t sub = GenerateSymbolId(rule_name);
      at = ParseAlternates(at, rule_name, sub, true);
      if (!error_.ok()) return at;
      last_sym_start = out->size();
      has_symbol = true;
      out->push_back({GrammarElemType::kRuleRef, sub});
      if (Peek(at) != ')') {
        error_ = ErrorAt(at, "expected ')' to close the group");
        return at;
      }
      at = SkipSpace(at + 1, nested);
    } else if (c == '.') {
      last_sym_start = out->size();
      has_symbol = true;
      out->push_back({GrammarElemType::kCharAny, 0});
      at = SkipSpace(at + 1, nested);
    } else if (c == '*' || c == '+' || c == '?') {
      if (!has_symbol || last_sym_start == out->size()) {
        error_ = ErrorAt(at, fmt::format("'{}' follows nothing it could repeat", c));
        return at;
      }
      const uint64_t min = c == '+' ? 1 : 0;
      const std::optional<uint64_t> max = c == '?' ? std::optional<uint64_t>(1) : std::nullopt;
      if (!Repeat(at, rule_name, last_sym_start, min, max, out)) return at;
      has_symbol = false;
      at = SkipSpace(at + 1, nested);
    } else if (c == '{') {
      const size_t brace = at;
      if (!has_symbol || last_sym_start == out->size()) {
        error_ = ErrorAt(at, "'{' follows nothing it could repeat");
        return at;
      }
      auto read_int = [&](size_t* p) -> std::optional<uint64_t> {
        const size_t begin = *p;
        uint64_t value = 0;
        while (Peek(*p) >= '0' && Peek(*p) <= '9') {
          value = value * 10 + static_cast<uint64_t>(Peek(*p) - '0');
          if (value > kMaxRepetition) {
            error_ = ErrorAt(begin, fmt::format("a repetition count above {}", kMaxRepetition));
            return std::nullopt;
          }
          ++*p;
        }
        if (*p == begin) {
          error_ = ErrorAt(begin, "expected a number in '{m,n}'");
          return std::nullopt;
        }
        return value;
      };
      at = SkipSpace(at + 1, nested);
      const std::optional<uint64_t> min = read_int(&at);
      if (!min) return at;
      at = SkipSpace(at, nested);
      std::optional<uint64_t> max = min;
      if (Peek(at) == ',') {
        at = SkipSpace(at + 1, nested);
        if (Peek(at) == '}') {
          max.reset();
        } else {
          max = read_int(&at);
          if (!max) return at;
          if (*max < *min) {
            error_ = ErrorAt(brace, "in '{m,n}' n is below m");
            return at;
          }
        }
        at = SkipSpace(at, nested);
      }
      if (Peek(at) != '}') {
        error_ = ErrorAt(at, "expected '}' to close the repetition");
        return at;
      }
      if (!Repeat(brace, rule_name, last_sym_start, *min, max, out)) return at;
      has_symbol = false;
      at = SkipSpace(at + 1, nested);
    } else {
      break;
    }
  }
  return at;
}

// llama.cpp's expansion: x{m,n} is m copies of x, then n - m nested optional rules
// (r1 ::= x | ; r2 ::= x r1 | ; ...); x{m,} ends with a rule r ::= x r | .
bool GbnfParser::Repeat(size_t at, std::string_view rule_name, size_t last_sym_start,
                        uint64_t min, std::optional<uint64_t> max,
                        std::vector<GrammarElem>* out) {
  const std::vector<GrammarElem> item(out->begin() + static_cast<std::ptrdiff_t>(last_sym_start),
                                      out->end());
  const uint64_t optional = max ? *max - min : 1;
  if (!CountElements(at, item.size() * (min + optional) + 3 * optional)) return false;
  if (min == 0) {
    out->resize(last_sym_start);
  } else {
    for (uint64_t i = 1; i < min; ++i) out->insert(out->end(), item.begin(), item.end());
  }
  uint32_t last_rule = 0;
  for (uint64_t i = 0; i < optional; ++i) {
    std::vector<GrammarElem> rule = item;
    const uint32_t id = GenerateSymbolId(rule_name);
    if (i > 0 || !max) rule.push_back({GrammarElemType::kRuleRef, max ? last_rule : id});
    rule.push_back({GrammarElemType::kAlt, 0});
    rule.push_back({GrammarElemType::kEnd, 0});
    AddRule(id, std::move(rule));
    last_rule = id;
  }
  if (optional > 0) out->push_back({GrammarElemType::kRuleRef, last_rule});
  return true;
}

// A rule that can reach itself before consuming a character would make the matcher expand
// forever: refused, naming the rule (llama.cpp refuses it too).
Status GbnfParser::CheckLeftRecursion() const {
  const size_t n = rules_.size();
  // nullable[r]: r can match the empty string (fixed point).
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      bool alt_nullable = true;
      for (const GrammarElem& e : rules_[r]) {
        if (e.type == GrammarElemType::kAlt || e.type == GrammarElemType::kEnd) {
          if (alt_nullable) {
            nullable[r] = true;
            changed = true;
            break;
          }
          alt_nullable = true;
        } else if (e.type == GrammarElemType::kRuleRef) {
          alt_nullable = alt_nullable && nullable[e.value];
        } else if (e.type != GrammarElemType::kCharRangeUpper &&
                   e.type != GrammarElemType::kCharAlt) {
          alt_nullable = false;
        }
      }
    }
  }
  // left[r]: the rules r can start with (directly, or after nullable ones).
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    bool at_start = true;
    for (const GrammarElem& e : rules_[r]) {
      if (e.type == GrammarElemType::kAlt || e.type == GrammarElemType::kEnd) {
        at_start = true;
      } else if (e.type == GrammarElemType::kRuleRef) {
        if (at_start) left[r].push_back(e.value);
        at_start = at_start && nullable[e.value];
      } else if (e.type != GrammarElemType::kCharRangeUpper &&
                 e.type != GrammarElemType::kCharAlt) {
        at_start = false;
      }
    }
  }
  // A cycle in the "starts with" graph: depth-first search with colours.
  std::vector<uint8_t> colour(n, 0);  // 0 unseen, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;
  for (size_t start = 0; start < n; ++start) {
    if (colour[start] != 0) continue;
    path.push_back({static_cast<uint32_t>(start), 0});
    colour[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == left[r].size()) {
        colour[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t to = left[r][next++];
      if (colour[to] == 1) {
        return InvalidArgumentError(fmt::format(
            "grammar: rule '{}' is left-recursive (it can reach itself before matching a "
            "character); rewrite it with a repetition",
            names_[to]));
      }
      if (colour[to] == 0) {
        colour[to] = 1;
        path.push_back({to, 0});
      }
    }
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<const Grammar>> GbnfParser::Parse(std::string_view root) {
  size_t at = SkipSpace(0, true);
  while (at < text_.size()) {
    const size_t name_end = ParseName(at);
    if (name_end == at) return ErrorAt(at, "expected a rule name");
    const std::string_view name = text_.substr(at, name_end - at);
    const uint32_t id = SymbolId(name);
    if (defined_[id]) return ErrorAt(at, fmt::format("rule '{}' is defined twice", name));
    at = SkipSpace(name_end, false);
    if (text_.substr(at, 3) != "::=") return ErrorAt(at, "expected '::=' after the rule name");
    at = SkipSpace(at + 3, true);
    at = ParseAlternates(at, name, id, false);
    if (!error_.ok()) return error_;
    // A rule ends at a line break (or the end of the text).
    if (Peek(at) == '\r') at += Peek(at + 1) == '\n' ? 2 : 1;
    else if (Peek(at) == '\n') ++at;
    else if (at < text_.size()) {
      return ErrorAt(at, fmt::format("unexpected '{}' (expected a line break)", Peek(at)));
    }
    at = SkipSpace(at, true);
  }
  for (size_t r = 0; r < names_.size(); ++r) {
    if (!defined_[r]) {
      return ErrorAt(first_use_[r] - 1, fmt::format("rule '{}' is used but never defined",
                                                    names_[r]));
    }
  }
  const auto root_it = symbol_ids_.find(root);
  if (root_it == symbol_ids_.end()) {
    return InvalidArgumentError(fmt::format("grammar: no rule named '{}' (the root)", root));
  }
  KVL_RETURN_IF_ERROR(CheckLeftRecursion());
  auto grammar = std::make_shared<Grammar>();
  grammar->rules = std::move(rules_);
  grammar->rule_names = std::move(names_);
  grammar->root = root_it->second;
  return std::shared_ptr<const Grammar>(std::move(grammar));
}

void AppendCodePoint(uint32_t cp, std::string* out) {
  if (cp == '"' || cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^') {
    out->push_back('\\');
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x20 || cp == 0x7F || cp > 0x7E) {
    *out += cp <= 0xFF ? fmt::format("\\x{:02X}", cp)
            : cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp)
                           : fmt::format("\\U{:08X}", cp);
  } else {
    out->push_back(static_cast<char>(cp));
  }
}

}  // namespace

StatusOr<std::shared_ptr<const Grammar>> ParseGbnf(std::string_view text, std::string_view root) {
  return GbnfParser(text).Parse(root);
}

std::string GrammarToGbnf(const Grammar& grammar) {
  std::string out;
  for (size_t r = 0; r < grammar.rules.size(); ++r) {
    out += grammar.rule_names[r] + " ::=";
    const std::vector<GrammarElem>& rule = grammar.rules[r];
    bool alt_empty = true;  // an empty alternative is written "" (a bare "|" at a line's end
                            // would join the next line)
    for (size_t i = 0; i < rule.size(); ++i) {
      const GrammarElem& e = rule[i];
      if (e.type == GrammarElemType::kEnd || e.type == GrammarElemType::kAlt) {
        if (alt_empty) out += " \"\"";
        if (e.type == GrammarElemType::kAlt) out += " |";
        alt_empty = true;
        continue;
      }
      alt_empty = false;
      switch (e.type) {
        case GrammarElemType::kRuleRef: out += " " + grammar.rule_names[e.value]; break;
        case GrammarElemType::kCharAny: out += " ."; break;
        case GrammarElemType::kChar:
        case GrammarElemType::kCharNot: {
          out += e.type == GrammarElemType::kChar ? " [" : " [^";
          AppendCodePoint(e.value, &out);
          while (i + 1 < rule.size() && (rule[i + 1].type == GrammarElemType::kCharAlt ||
                                         rule[i + 1].type == GrammarElemType::kCharRangeUpper ||
                                         rule[i + 1].type == GrammarElemType::kCharAny)) {
            ++i;
            if (rule[i].type == GrammarElemType::kCharRangeUpper) out += "-";
            if (rule[i].type == GrammarElemType::kCharAny) {
              out += "\\x00-\\U0010FFFF";
            } else {
              AppendCodePoint(rule[i].value, &out);
            }
          }
          out += "]";
          break;
        }
        default: break;
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace kvl
