// A JSON Schema `pattern` (an ECMAScript regex) as GBNF for the inside of a JSON string: the
// regex's structure maps one to one onto GBNF (groups, |, postfix quantifiers), and each
// character is written as JSON would carry it, so the decoded string is what the regex sees.
// Characters JSON must escape (quote, backslash, controls) are written as their escapes where a
// literal or a class names them, and left out of what `.` and negated classes allow.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "json_schema_parts.h"

namespace kvl::json_schema {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

bool NeedsJsonEscape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

// The JSON text of one character inside a string.
std::string JsonChar(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: break;
  }
  if (cp < 0x20) return fmt::format("\\u{:04x}", cp);
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// A code point inside a GBNF character class.
std::string ClassChar(uint32_t cp) {
  if (cp == ']' || cp == '[' || cp == '\\' || cp == '-' || cp == '^' || cp == '"') {
    return std::string("\\") + static_cast<char>(cp);
  }
  if (cp < 0x20 || cp == 0x7F) return fmt::format("\\x{:02X}", cp);
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp) : fmt::format("\\U{:08X}", cp);
}

std::string ClassGbnf(const Ranges& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const auto& [lo, hi] : ranges) {
    out += ClassChar(lo);
    if (hi != lo) {
      out.push_back('-');
      out += ClassChar(hi);
    }
  }
  return out + "]";
}

// What a negated class or `.` must never let through: characters JSON escapes.
const Ranges kJsonEscaped = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};

class RegexTranslator {
 public:
  explicit RegexTranslator(std::string_view pattern) : p_(pattern) {}

  StatusOr<std::string> Translate(std::string_view char_rule) {
    const bool anchored_start = !p_.empty() && p_.front() == '^';
    size_t end = p_.size();
    bool anchored_end = false;
    if (end > 0 && p_[end - 1] == '$') {
      size_t backslashes = 0;
      while (backslashes + 2 <= end && p_[end - 2 - backslashes] == '\\') ++backslashes;
      anchored_end = backslashes % 2 == 0;
    }
    if (anchored_end) --end;
    p_ = p_.substr(0, end);
    i_ = anchored_start ? 1 : 0;
    std::string body = Alternatives();
    if (!error_.ok()) return error_;
    if (i_ < p_.size()) {
      Error("an unbalanced ')'");
      return error_;
    }
    std::string out;
    if (!anchored_start) {
      out.append(char_rule);
      out.append("* ");
    }
    out.push_back('(');
    out.append(body);
    out.push_back(')');
    if (!anchored_end) {
      out.push_back(' ');
      out.append(char_rule);
      out.push_back('*');
    }
    return out;
  }

 private:
  // Records the first error; the translation unwinds returning empty text.
  void Error(std::string_view what) {
    if (error_.ok()) {
      error_ = InvalidArgumentError(fmt::format(
          "pattern '{}': {} is not supported (at offset {})", p_, what, i_));
    }
  }
  char Peek() const { return i_ < p_.size() ? p_[i_] : '\0'; }

  uint32_t ReadUtf8() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const int length = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    uint32_t cp = length == 1 ? b : b & (0x7F >> length);
    ++i_;
    for (int k = 1; k < length && i_ < p_.size(); ++k, ++i_) {
      cp = (cp << 6) | (static_cast<unsigned char>(p_[i_]) & 0x3F);
    }
    return cp;
  }

  std::string Alternatives() {
    std::string out = Sequence();
    while (error_.ok() && Peek() == '|') {
      ++i_;
      out += " | " + Sequence();
    }
    return out;
  }

  std::string Sequence() {
    std::string out;
    while (error_.ok() && i_ < p_.size() && Peek() != '|' && Peek() != ')') {
      std::string atom = Atom();
      if (!error_.ok()) return out;
      atom += Quantifier();
      if (!out.empty()) out += " ";
      out += atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string Quantifier() {
    std::string q;
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      q = std::string(1, c);
      ++i_;
    } else if (c == '{') {
      // {m}, {m,}, {m,n}; anything else is a literal '{' (as ECMAScript without the u flag).
      size_t j = i_ + 1;
      auto digits = [&] {
        const size_t from = j;
        while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') ++j;
        return p_.substr(from, j - from);
      };
      const std::string_view min = digits();
      std::string_view max = min;
      bool open = false;
      if (j < p_.size() && p_[j] == ',') {
        ++j;
        max = digits();
        open = max.empty();
      }
      if (min.empty() || j >= p_.size() || p_[j] != '}') return "";
      i_ = j + 1;
      q = open ? fmt::format("{{{},}}", min) : fmt::format("{{{},{}}}", min, max);
    } else {
      return "";
    }
    if (Peek() == '?') ++i_;  // lazy: the same strings
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' ||
        (Peek() == '{' && i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9')) {
      Error("a quantifier after a quantifier");
    }
    return q;
  }

  // \d, \w, \s (and their capitals) as ranges; false for other escapes.
  static bool ShorthandRanges(char c, Ranges* ranges, bool* negated) {
    switch (c) {
      case 'd': case 'D': *ranges = {{'0', '9'}}; break;
      case 'w': case 'W': *ranges = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; break;
      // (ASCII whitespace only: what \s means beyond it depends on the regex engine.)
      case 's': case 'S': *ranges = {{'\t', '\r'}, {' ', ' '}}; break;
      default: return false;
    }
    *negated = c == 'D' || c == 'W' || c == 'S';
    return true;
  }

  // The character an escape names (\n, \t, \., \/, \uHHHH, ...), or sets the error.
  uint32_t EscapedChar() {
    const char c = Peek();
    ++i_;
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'u': case 'x': {
        const size_t n = c == 'u' ? 4 : 2;
        if (i_ + n > p_.size()) break;
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = p_[i_ + k];
          const int digit = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
          if (digit < 0) {
            Error("a malformed hex escape");
            return 0;
          }
          cp = cp * 16 + static_cast<uint32_t>(digit);
        }
        i_ += n;
        return cp;
      }
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
          Error(fmt::format("the escape '\\{}'", c));
          return 0;
        }
        return static_cast<unsigned char>(c);
    }
    Error("a malformed escape");
    return 0;
  }

  std::string Atom() {
    const char c = Peek();
    if (c == '(') {
      ++i_;
      if (Peek() == '?') {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
          i_ += 2;
        } else {
          Error("a lookaround or named group '(?'");
          return "";
        }
      }
      std::string inner = Alternatives();
      if (!error_.ok()) return "";
      if (Peek() != ')') {
        Error("an unclosed '('");
        return "";
      }
      ++i_;
      return "(" + inner + ")";
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++i_;
      Ranges excluded = kJsonEscaped;
      excluded.push_back({0x2028, 0x2029});  // line terminators `.` does not match
      return ClassGbnf(excluded, true);
    }
    if (c == '^' || c == '$') {
      Error(fmt::format("an anchor '{}' inside the pattern", c));
      return "";
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      Error(fmt::format("a quantifier '{}' with nothing before it", c));
      return "";
    }
    if (c == '\\') {
      ++i_;
      if (i_ >= p_.size()) {
        Error("a trailing backslash");
        return "";
      }
      Ranges ranges;
      bool negated = false;
      if (ShorthandRanges(Peek(), &ranges, &negated)) {
        ++i_;
        return ClassFor(ranges, negated);
      }
      if (Peek() == 'b' || Peek() == 'B') {
        Error("a word boundary '\\b'");
        return "";
      }
      const uint32_t cp = EscapedChar();
      return error_.ok() ? GbnfLiteral(JsonChar(cp)) : "";
    }
    return GbnfLiteral(JsonChar(ReadUtf8()));
  }

  // A positive or negated set of code points as JSON string content.
  static std::string ClassFor(const Ranges& ranges, bool negated) {
    if (negated) {
      Ranges all = ranges;
      all.insert(all.end(), kJsonEscaped.begin(), kJsonEscaped.end());
      return ClassGbnf(all, true);
    }
    // Plain characters stay a class; the ones JSON escapes become their escapes beside it.
    Ranges plain;
    std::vector<uint32_t> escaped;
    for (auto [lo, hi] : ranges) {
      for (uint32_t cp = lo; cp <= hi && cp < 0x80; ++cp) {
        if (NeedsJsonEscape(cp)) escaped.push_back(cp);
      }
      // Split the range around the escaped characters.
      uint32_t from = lo;
      for (uint32_t cp = lo; cp <= hi && cp < 0x80; ++cp) {
        if (NeedsJsonEscape(cp)) {
          if (cp > from) plain.push_back({from, cp - 1});
          from = cp + 1;
        }
      }
      if (from <= hi) plain.push_back({from, hi});
    }
    std::string out;
    if (!plain.empty()) out = ClassGbnf(plain, false);
    for (uint32_t cp : escaped) out += (out.empty() ? "" : " | ") + GbnfLiteral(JsonChar(cp));
    return escaped.empty() ? out : "(" + out + ")";
  }

  std::string Class() {
    ++i_;  // '['
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++i_;
    }
    Ranges ranges;
    bool first = true;
    while (i_ < p_.size() && (Peek() != ']' || first)) {
      first = false;
      uint32_t lo;
      if (Peek() == '\\') {
        ++i_;
        Ranges shorthand;
        bool shorthand_negated = false;
        if (ShorthandRanges(Peek(), &shorthand, &shorthand_negated)) {
          if (shorthand_negated) {
            Error("a negated shorthand inside a class");
            return "";
          }
          ++i_;
          ranges.insert(ranges.end(), shorthand.begin(), shorthand.end());
          continue;
        }
        lo = Peek() == 'b' ? (++i_, '\b') : EscapedChar();
      } else {
        lo = ReadUtf8();
      }
      if (!error_.ok()) return "";
      uint32_t hi = lo;
      if (Peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (Peek() == '\\') {
          ++i_;
          hi = EscapedChar();
        } else {
          hi = ReadUtf8();
        }
        if (!error_.ok()) return "";
        if (hi < lo) {
          Error("a class range whose end is below its start");
          return "";
        }
      }
      ranges.push_back({lo, hi});
    }
    if (Peek() != ']') {
      Error("an unclosed '['");
      return "";
    }
    ++i_;
    if (ranges.empty()) {
      Error("an empty class");
      return "";
    }
    return ClassFor(ranges, negated);
  }

  std::string_view p_;
  size_t i_ = 0;
  Status error_;
};

}  // namespace

std::string GbnfLiteral(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += fmt::format("\\x{:02X}", c);
        } else {
          out.push_back(ch);
        }
    }
  }
  return out + "\"";
}

StatusOr<std::string> RegexToGbnf(std::string_view pattern, std::string_view char_rule) {
  return RegexTranslator(pattern).Translate(char_rule);
}

}  // namespace kvl::json_schema
