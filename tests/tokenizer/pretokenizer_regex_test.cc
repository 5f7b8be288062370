// The pre-tokenizer stages written as matchers against the regexes they stand for, run the way
// llama.cpp runs them: std::regex over the "collapsed" text (each non-ASCII code point as one byte
// naming its category, white space as \v, \p{..} in the pattern as a class of that byte and the
// ASCII members), or std::wregex over the code points (non-ASCII white space as \v) for patterns
// without \p. Random texts over a pool of hard characters must split identically.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace kvl {
namespace {

// The byte a non-ASCII code point collapses to, by its flags.
char Collapse(uint32_t cpt, uint16_t flags) {
  if (cpt < 128) return static_cast<char>(cpt);
  if (flags & kUnicodeWhitespace) return '\x0B';
  switch (flags & 0xFF) {
    case kUnicodeNumber: return '\xD1';
    case kUnicodeLetter: return '\xD2';
    case kUnicodePunctuation: return '\xD3';
    case kUnicodeMark: return '\xD4';
    case kUnicodeSymbol: return '\xD5';
    default: return '\xD0';
  }
}

// \p{X} as the members of a character class: the collapsed byte, then the ASCII code points of
// that category.
std::string ClassMembers(const std::string& property) {
  if (property == "N") return "\xD1" "0-9";
  if (property == "L") return "\xD2" "A-Za-z";
  if (property == "P") return "\xD3" "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
  if (property == "M") return "\xD4";
  if (property == "S") return "\xD5" "\\$\\+<->\\^`\\|~";
  ADD_FAILURE() << "unknown property " << property;
  return "";
}

std::string CollapsePattern(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size() && pattern[i + 1] == 'p' && i + 2 < pattern.size() &&
        pattern[i + 2] == '{') {
      const size_t close = pattern.find('}', i);
      const std::string members = ClassMembers(pattern.substr(i + 3, close - i - 3));
      out += in_class ? members : "[" + members + "]";
      i = close;
      continue;
    }
    if (c == '\\' && i + 1 < pattern.size()) {  // an escape is copied whole
      out += pattern.substr(i, 2);
      ++i;
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Splits [begin, end) as std::regex_iterator finds matches; gaps are pieces too.
template <typename String, typename Regex>
void RegexSplit(const String& text, const Regex& re, size_t begin, size_t end,
                std::vector<uint32_t>* out) {
  using It = typename String::const_iterator;
  size_t last = 0;
  for (std::regex_iterator<It> it(text.begin() + begin, text.begin() + end, re), stop; it != stop;
       ++it) {
    const size_t pos = static_cast<size_t>(it->position());
    if (pos > last) out->push_back(static_cast<uint32_t>(pos - last));
    out->push_back(static_cast<uint32_t>(it->length()));
    last = pos + static_cast<size_t>(it->length());
  }
  if (end - begin > last) out->push_back(static_cast<uint32_t>(end - begin - last));
}

std::vector<uint32_t> ReferenceSplit(const std::string& pattern, const CodepointText& t) {
  std::vector<uint32_t> out;
  if (pattern.find("\\p{") != std::string::npos) {
    std::string collapsed;
    for (size_t i = 0; i < t.cpts.size(); ++i) collapsed += Collapse(t.cpts[i], t.flags[i]);
    const std::regex re(CollapsePattern(pattern), std::regex::ECMAScript | std::regex::nosubs);
    RegexSplit(collapsed, re, 0, collapsed.size(), &out);
  } else {
    std::vector<uint32_t> pattern_cpts;
    DecodeUtf8(pattern, &pattern_cpts);
    const std::wregex re(std::wstring(pattern_cpts.begin(), pattern_cpts.end()),
                         std::regex::ECMAScript | std::regex::nosubs);
    std::wstring wide;
    for (size_t i = 0; i < t.cpts.size(); ++i) {
      const bool space = t.cpts[i] > 0x7F && (t.flags[i] & kUnicodeWhitespace);
      wide += space ? L'\x0B' : static_cast<wchar_t>(t.cpts[i]);
    }
    RegexSplit(wide, re, 0, wide.size(), &out);
  }
  return out;
}

// Characters that exercise every class of the patterns.
const std::vector<uint32_t> kPool = {
    'a', 'b', 'z', 'A', 'Q', 'Z', '0', '5', '9', ' ', ' ', ' ', '\n', '\r', '\t', '\'', '!', '.',
    ',', '-', '/', '$', '+', '<', '=', '^', '`', '|', '~', '_', '(', '#', '"', 0x01,
    0xE9, 0xC9, 0xDF, 0x4E2D, 0x6587, 0x3042, 0x30AB, 0xAC00, 0x0915, 0x094D, 0x0301, 0x0651,
    0x0663, 0x00B2, 0x00BD, 0x00A0, 0x3000, 0x0085, 0x2028, 0x1F999, 0x200D, 0x20AC, 0x2211,
    0x00AB, 0x2014, 0xFF01, 0xFF21, 0x3001, 0x0391, 0x03B1, 0x0416, 0x0436, 0x10FFFF, 0xE000,
};

CodepointText RandomText(std::mt19937* rng) {
  CodepointText t;
  const size_t length = (*rng)() % 24;
  for (size_t i = 0; i < length; ++i) t.cpts.push_back(kPool[(*rng)() % kPool.size()]);
  for (uint32_t c : t.cpts) t.flags.push_back(UnicodeFlags(c));
  return t;
}

struct StageCase {
  const char* name;
  SplitStage stage;
  std::string pattern;
};

class PreTokenizerRegexTest : public ::testing::TestWithParam<StageCase> {};

TEST_P(PreTokenizerRegexTest, SplitsAsTheRegex) {
  const StageCase& c = GetParam();
  std::mt19937 rng(1234);
  int compared = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const CodepointText t = RandomText(&rng);
    if (t.cpts.empty()) continue;
    std::vector<uint32_t> ours;
    c.stage(t, 0, t.cpts.size(), &ours);
    const std::vector<uint32_t> reference = ReferenceSplit(c.pattern, t);
    std::string text;
    for (uint32_t cpt : t.cpts) AppendUtf8(cpt, &text);
    ASSERT_EQ(ours, reference) << c.name << " on '" << text << "'";
    ++compared;
  }
  EXPECT_GT(compared, 2500);
}

INSTANTIATE_TEST_SUITE_P(
    Stages, PreTokenizerRegexTest,
    ::testing::Values(
        StageCase{"numbers", SplitNumberRuns, "\\p{N}+"},
        StageCase{"each_number", SplitEachNumber, "\\p{N}"},
        StageCase{"numbers_up_to_3", SplitNumbersUpTo3, "\\p{N}{1,3}"},
        StageCase{"ascii_digit_triples", SplitAsciiDigitTriples, "[0-9][0-9][0-9]"},
        StageCase{"default_punctuation", SplitDefaultPunctuation, "[\\p{P}\\$\\+<=>\\^~\\|]+"},
        StageCase{"falcon_punctuation", SplitFalconPunctuation, "[\\p{P}\\$\\+<=>\\^~\\|`]+"},
        StageCase{"each_newline", SplitEachNewline, "[\r\n]"},
        StageCase{"deepseek_llm_letters", SplitDeepseekLlmLetters,
                  "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-"
                  "\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-"
                  "\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
                  "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
                  "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
                  "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
                  "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
                  "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
                  "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
                  "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
                  "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
                  "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
                  "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
                  "\U000118a0-\U000118df\U0001e900-\U0001e943]+"},
        StageCase{"deepseek_llm_punctuation", SplitDeepseekLlmPunctuation,
                  "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"},
        StageCase{"trailing_space", SplitTrailingSpace, "\\s+$"},
        StageCase{"deepseek_cjk", SplitDeepseekCjk, "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"},
        StageCase{"deepseek_v3_kana", SplitDeepseekV3Kana, "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
        StageCase{"space_then_letters", SplitSpaceThenLetters, "\\s?\\p{L}+"},
        StageCase{"space_then_punctuation", SplitSpaceThenPunctuation, "\\s?\\p{P}+"},
        StageCase{"deepseek_v3_main", SplitDeepseekV3Main,
                  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                  "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
        StageCase{"tekken", SplitTekken,
                  "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}"
                  "\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                  "[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvl
