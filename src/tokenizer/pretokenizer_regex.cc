// The pre-tokenizer stages llama.cpp runs through std::regex, written out as matchers. A stage
// finds the leftmost match, then the next one after it, as std::regex_iterator does; the text
// between matches is a piece of its own. At one position the alternatives are tried in order and
// quantifiers are greedy with backtracking, as in ECMAScript. None of these regexes can match the
// empty string.
//
// std::regex sees non-ASCII text through llama.cpp's "collapsed" form: every code point of 128 or
// more becomes one byte standing for its category, white space becoming \v. So \p{L} is any letter,
// [^a-z] is true of every non-ASCII letter, and a literal range of non-ASCII characters never
// matches a white-space character inside it.
#include <algorithm>

#include "pretokenizer.h"
#include "unicode.h"

namespace kvl {
namespace {

struct CodepointRange {
  uint32_t first;
  uint32_t last;
};

template <size_t N>
bool InRanges(uint32_t c, const CodepointRange (&ranges)[N]) {
  for (const CodepointRange& r : ranges) {
    if (c < r.first) return false;  // sorted
    if (c <= r.last) return true;
  }
  return false;
}

bool IsLetter(uint16_t f) { return f & kUnicodeLetter; }
bool IsNumber(uint16_t f) { return f & kUnicodeNumber; }
bool IsSpace(uint16_t f) { return f & kUnicodeWhitespace; }
bool IsCrOrLf(uint32_t c) { return c == '\r' || c == '\n'; }

// Runs `match` (length of the match at pos, or 0) over [begin, end) as std::regex_iterator does.
template <typename Match>
void SplitByMatches(size_t begin, size_t end, std::vector<uint32_t>* out, Match match) {
  size_t gap_start = begin;
  for (size_t pos = begin; pos < end;) {
    const size_t n = match(pos);
    if (n == 0) {
      ++pos;
      continue;
    }
    if (pos > gap_start) out->push_back(static_cast<uint32_t>(pos - gap_start));
    out->push_back(static_cast<uint32_t>(n));
    pos += n;
    gap_start = pos;
  }
  if (end > gap_start) out->push_back(static_cast<uint32_t>(end - gap_start));
}

// A run of code points with `pred` from pos: its length.
template <typename Pred>
size_t Run(size_t pos, size_t end, Pred pred) {
  size_t e = pos;
  while (e < end && pred(e)) ++e;
  return e - pos;
}

// The shared tail of several regexes: \s*[\r\n]+|\s+(?!\S)|\s+ at pos.
size_t MatchWhitespaceTail(const CodepointText& t, size_t pos, size_t end) {
  size_t spaces = 0;
  size_t after_last_newline = 0;
  while (pos + spaces < end && IsSpace(t.flags[pos + spaces])) {
    if (IsCrOrLf(t.cpts[pos + spaces])) after_last_newline = pos + spaces + 1;
    ++spaces;
  }
  if (spaces == 0) return 0;
  if (after_last_newline > 0) return after_last_newline - pos;  // \s*[\r\n]+
  // \s+(?!\S) keeps the last space for the word after it; a lone space falls to \s+.
  return pos + spaces == end || spaces == 1 ? spaces : spaces - 1;
}

// Characters of a DeepSeek-LLM letter word (cased scripts: Latin, Greek, Cyrillic, ...), as its
// tokenizer.json lists them.
constexpr CodepointRange kDeepseekLetters[] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00B5, 0x00B5}, {0x00C0, 0x00D6}, {0x00D8, 0x00F6},
    {0x00F8, 0x01BA}, {0x01BC, 0x01BF}, {0x01C4, 0x0293}, {0x0295, 0x02AF}, {0x0370, 0x0373},
    {0x0376, 0x0377}, {0x037B, 0x037D}, {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A},
    {0x038C, 0x038C}, {0x038E, 0x03A1}, {0x03A3, 0x03F5}, {0x03F7, 0x0481}, {0x048A, 0x052F},
    {0x0531, 0x0556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F},
    {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3},
    {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

// [!-/:-~！-／：-～‘-‟　-。]: ASCII and full-width punctuation, curly quotes, CJK marks. U+3000 is
// in the written range but never matches: std::wregex sees white space as \v.
constexpr CodepointRange kDeepseekPunctuation[] = {
    {0x0021, 0x002F}, {0x003A, 0x007E}, {0x2018, 0x201F},
    {0x3001, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

// [一-龥ࠀ-一가-퟿]: CJK ideographs, everything from U+0800 to them, Hangul (white space excluded, as
// above).
constexpr CodepointRange kDeepseekCjk[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};

// [一-龥぀-ゟ゠-ヿ]: CJK ideographs, Hiragana, Katakana.
constexpr CodepointRange kDeepseekV3Kana[] = {{0x3040, 0x309F}, {0x30A0, 0x30FF},
                                             {0x4E00, 0x9FA5}};

// \s?[class]+ with a class that holds no white space.
template <typename InClass>
void SplitSpaceThenRun(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out,
                       InClass in_class) {
  SplitByMatches(begin, end, out, [&](size_t pos) -> size_t {
    const auto is_in = [&](size_t i) { return in_class(i); };
    if (IsSpace(t.flags[pos]) && pos + 1 < end && is_in(pos + 1)) {
      return 1 + Run(pos + 1, end, is_in);
    }
    return Run(pos, end, is_in);
  });
}

template <size_t N>
void SplitRangeRuns(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out,
                    const CodepointRange (&ranges)[N]) {
  SplitByMatches(begin, end, out, [&](size_t pos) {
    return Run(pos, end, [&](size_t i) { return !IsSpace(t.flags[i]) && InRanges(t.cpts[i], ranges); });
  });
}

bool IsAsciiLower(uint32_t c) { return c >= 'a' && c <= 'z'; }
bool IsAsciiUpper(uint32_t c) { return c >= 'A' && c <= 'Z'; }
bool IsAsciiLetter(uint32_t c) { return IsAsciiLower(c) || IsAsciiUpper(c); }

}  // namespace

void SplitNumberRuns(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitByMatches(begin, end, out,
                 [&](size_t pos) { return Run(pos, end, [&](size_t i) { return IsNumber(t.flags[i]); }); });
}

void SplitEachNumber(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitByMatches(begin, end, out, [&](size_t pos) -> size_t { return IsNumber(t.flags[pos]); });
}

void SplitNumbersUpTo3(const CodepointText& t, size_t begin, size_t end,
                       std::vector<uint32_t>* out) {
  SplitByMatches(begin, end, out, [&](size_t pos) {
    return Run(pos, std::min(end, pos + 3), [&](size_t i) { return IsNumber(t.flags[i]); });
  });
}

void SplitAsciiDigitTriples(const CodepointText& t, size_t begin, size_t end,
                            std::vector<uint32_t>* out) {
  const auto digit = [&](size_t i) { return t.cpts[i] >= '0' && t.cpts[i] <= '9'; };
  SplitByMatches(begin, end, out, [&](size_t pos) -> size_t {
    return pos + 3 <= end && digit(pos) && digit(pos + 1) && digit(pos + 2) ? 3 : 0;
  });
}

// [\p{P}\$\+<=>\^~\|]+ (and with ` for Falcon).
void SplitDefaultPunctuation(const CodepointText& t, size_t begin, size_t end,
                             std::vector<uint32_t>* out) {
  SplitByMatches(begin, end, out, [&](size_t pos) {
    return Run(pos, end, [&](size_t i) {
      const uint32_t c = t.cpts[i];
      return (t.flags[i] & kUnicodePunctuation) || c == '$' || c == '+' || c == '<' || c == '=' ||
             c == '>' || c == '^' || c == '~' || c == '|';
    });
  });
}

void SplitFalconPunctuation(const CodepointText& t, size_t begin, size_t end,
                            std::vector<uint32_t>* out) {
  SplitByMatches(begin, end, out, [&](size_t pos) {
    return Run(pos, end, [&](size_t i) {
      const uint32_t c = t.cpts[i];
      return (t.flags[i] & kUnicodePunctuation) || c == '$' || c == '+' || c == '<' || c == '=' ||
             c == '>' || c == '^' || c == '~' || c == '|' || c == '`';
    });
  });
}

void SplitEachNewline(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitByMatches(begin, end, out, [&](size_t pos) -> size_t { return IsCrOrLf(t.cpts[pos]); });
}

void SplitDeepseekLlmLetters(const CodepointText& t, size_t begin, size_t end,
                             std::vector<uint32_t>* out) {
  SplitSpaceThenRun(t, begin, end, out,
                    [&](size_t i) { return InRanges(t.cpts[i], kDeepseekLetters); });
}

void SplitDeepseekLlmPunctuation(const CodepointText& t, size_t begin, size_t end,
                                 std::vector<uint32_t>* out) {
  SplitSpaceThenRun(t, begin, end, out, [&](size_t i) {
    return !IsSpace(t.flags[i]) && InRanges(t.cpts[i], kDeepseekPunctuation);
  });
}

// \s+$: the white space that ends the piece, if any. (Written directly: a search from every
// position of a long run of spaces inside the piece would be quadratic.)
void SplitTrailingSpace(const CodepointText& t, size_t begin, size_t end,
                        std::vector<uint32_t>* out) {
  size_t start = end;
  while (start > begin && IsSpace(t.flags[start - 1])) --start;
  if (start > begin) out->push_back(static_cast<uint32_t>(start - begin));
  if (end > start) out->push_back(static_cast<uint32_t>(end - start));
}

void SplitDeepseekCjk(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitRangeRuns(t, begin, end, out, kDeepseekCjk);
}

void SplitDeepseekV3Kana(const CodepointText& t, size_t begin, size_t end,
                         std::vector<uint32_t>* out) {
  SplitRangeRuns(t, begin, end, out, kDeepseekV3Kana);
}

// \s?\p{L}+ and \s?\p{P}+ (DeepSeek-Coder).
void SplitSpaceThenLetters(const CodepointText& t, size_t begin, size_t end,
                           std::vector<uint32_t>* out) {
  SplitSpaceThenRun(t, begin, end, out, [&](size_t i) { return IsLetter(t.flags[i]); });
}

void SplitSpaceThenPunctuation(const CodepointText& t, size_t begin, size_t end,
                               std::vector<uint32_t>* out) {
  SplitSpaceThenRun(t, begin, end, out,
                    [&](size_t i) { return (t.flags[i] & kUnicodePunctuation) != 0; });
}

// DeepSeek-V3: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void SplitDeepseekV3Main(const CodepointText& t, size_t begin, size_t end,
                         std::vector<uint32_t>* out) {
  constexpr uint16_t kPunctOrSymbol = kUnicodePunctuation | kUnicodeSymbol;
  constexpr uint16_t kLetterOrMark = kUnicodeLetter | kUnicodeMark;
  const auto letter_or_mark = [&](size_t i) { return (t.flags[i] & kLetterOrMark) != 0; };
  const auto punct_or_symbol = [&](size_t i) { return (t.flags[i] & kPunctOrSymbol) != 0; };
  SplitByMatches(begin, end, out, [&](size_t pos) -> size_t {
    const uint32_t c = t.cpts[pos];
    const bool ascii_punct = (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
                             (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
    if (ascii_punct && pos + 1 < end && IsAsciiLetter(t.cpts[pos + 1])) {
      return 1 + Run(pos + 1, end, [&](size_t i) { return IsAsciiLetter(t.cpts[i]); });
    }
    const bool prefix = !IsCrOrLf(c) && !(t.flags[pos] & (kUnicodeLetter | kPunctOrSymbol));
    if (prefix && pos + 1 < end && letter_or_mark(pos + 1)) {
      return 1 + Run(pos + 1, end, letter_or_mark);
    }
    if (letter_or_mark(pos)) return Run(pos, end, letter_or_mark);
    const size_t q = c == ' ' && pos + 1 < end && punct_or_symbol(pos + 1) ? pos + 1 : pos;
    if (punct_or_symbol(q)) {
      const size_t e = q + Run(q, end, punct_or_symbol);
      return e - pos + Run(e, end, [&](size_t i) { return IsCrOrLf(t.cpts[i]); });
    }
    return MatchWhitespaceTail(t, pos, end);
  });
}

// Tekken (Mistral-Nemo), as llama.cpp rewrote its case classes for std::regex:
// [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|
// [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}|
//  ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// "Upper" is a letter other than a-z, "lower" a letter other than A-Z: a non-ASCII letter is both.
void SplitTekken(const CodepointText& t, size_t begin, size_t end, std::vector<uint32_t>* out) {
  const auto upper = [&](size_t i) { return IsLetter(t.flags[i]) && !IsAsciiLower(t.cpts[i]); };
  const auto lower = [&](size_t i) { return IsLetter(t.flags[i]) && !IsAsciiUpper(t.cpts[i]); };
  SplitByMatches(begin, end, out, [&](size_t pos) -> size_t {
    const uint32_t c = t.cpts[pos];
    const uint16_t f = t.flags[pos];
    const bool prefix = !IsCrOrLf(c) && !(f & (kUnicodeLetter | kUnicodeNumber));
    // The optional prefix is tried taken, then not; "upper*" backs off one letter at a time
    // until "lower+" can start.
    for (size_t q : {prefix ? pos + 1 : end + 1, pos}) {
      if (q > end) continue;
      const size_t upper_end = q + Run(q, end, upper);
      for (size_t r = upper_end + 1; r-- > q;) {
        if (r < end && lower(r)) return r + Run(r, end, lower) - pos;
      }
    }
    for (size_t q : {prefix ? pos + 1 : end + 1, pos}) {
      if (q >= end || !upper(q)) continue;
      const size_t upper_end = q + Run(q, end, upper);
      return upper_end + Run(upper_end, end, lower) - pos;
    }
    if (IsNumber(f)) return 1;
    const auto other = [&](size_t i) {
      return !(t.flags[i] & (kUnicodeWhitespace | kUnicodeLetter | kUnicodeNumber));
    };
    const size_t q = c == ' ' && pos + 1 < end && other(pos + 1) ? pos + 1 : pos;
    if (other(q)) {
      const size_t e = q + Run(q, end, other);
      return e - pos + Run(e, end, [&](size_t i) { return IsCrOrLf(t.cpts[i]) || t.cpts[i] == '/'; });
    }
    return MatchWhitespaceTail(t, pos, end);
  });
}

}  // namespace kvl
