// The pre-tokenizers by name, and the three stages llama.cpp runs with matchers of its own
// (GPT-2's regex, and Llama-3's and Qwen2's, which differ only in how many digits a number piece
// holds). Those matchers decide a few edge cases their regexes would decide otherwise; they are
// followed here, since they are what llama.cpp's ids come from.
#include "pretokenizer.h"

#include <fmt/format.h>

#include <algorithm>

#include "unicode.h"

namespace kvl {
namespace {

constexpr uint16_t kLetter = kUnicodeLetter;
constexpr uint16_t kNumber = kUnicodeNumber;
constexpr uint16_t kSpace = kUnicodeWhitespace;

// Positions past the piece read as "no code point": flags 0, code point kNone.
constexpr uint32_t kNone = 0xFFFFFFFF;

// A view of one piece [begin, end) of the text, with the helpers the matchers share.
class Piece {
 public:
  Piece(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out)
      : text_(text), end_(end), last_(begin), out_(out) {}

  uint32_t cpt(size_t pos) const { return pos < end_ ? text_.cpts[pos] : kNone; }
  uint16_t flags(size_t pos) const { return pos < end_ ? text_.flags[pos] : 0; }
  size_t end() const { return end_; }
  // Ends the current word at `pos`; returns its length (0 emits nothing).
  size_t Emit(size_t pos) {
    const size_t length = pos - last_;
    if (length > 0) out_->push_back(static_cast<uint32_t>(length));
    last_ = pos;
    return length;
  }
  // Length of an English contraction ('s 't 'm 'd 're 've 'll) at pos, or 0. Llama-3 and Qwen2
  // match it in any case; GPT-2 in lower case only.
  size_t Contraction(size_t pos, bool any_case) const {
    if (cpt(pos) != '\'' || pos + 1 >= end_) return 0;
    const auto lower = [&](size_t i) {
      const uint32_t c = cpt(i);
      return any_case && c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
    };
    const uint32_t next = lower(pos + 1);
    if (next == 's' || next == 't' || next == 'm' || next == 'd') return 2;
    if (pos + 2 >= end_) return 0;
    const uint32_t after = lower(pos + 2);
    if ((next == 'r' && after == 'e') || (next == 'v' && after == 'e') ||
        (next == 'l' && after == 'l')) {
      return 3;
    }
    return 0;
  }
  size_t WhitespaceRun(size_t pos) const {
    size_t n = 0;
    while (flags(pos + n) & kSpace) ++n;
    return n;
  }

 private:
  const CodepointText& text_;
  size_t end_;
  size_t last_;
  std::vector<uint32_t>* out_;
};

bool IsCrOrLf(uint32_t c) { return c == '\r' || c == '\n'; }

// Llama-3's regex with numbers of at most `max_digits`, words of `word` characters (\p{L}, or
// [\p{L}\p{M}] for Qwen3.5):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void SplitLlama3Like(const CodepointText& text, size_t begin, size_t end, size_t max_digits,
                     uint16_t word, std::vector<uint32_t>* out) {
  Piece p(text, begin, end, out);
  for (size_t pos = begin; pos < end;) {
    const uint32_t c = p.cpt(pos);
    const uint16_t f = p.flags(pos);
    if (const size_t n = p.Contraction(pos, /*any_case=*/true); n > 0) {
      pos += p.Emit(pos + n);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!IsCrOrLf(c) && !(f & kNumber) && ((f & word) || (p.flags(pos + 1) & word))) {
      ++pos;
      while (p.flags(pos) & word) ++pos;
      p.Emit(pos);
      continue;
    }
    // \p{N}{1,max}
    if (f & kNumber) {
      size_t start = pos;
      while (p.flags(pos) & kNumber) {
        if (++pos - start >= max_digits) {
          p.Emit(pos);
          start = pos;
        }
      }
      p.Emit(pos);
      continue;
    }
    // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the flags of pos itself for "any code
    // point here", not those after the space)
    uint16_t f2 = c == ' ' ? p.flags(pos + 1) : f;
    const uint16_t not_other = kSpace | word | kNumber;
    if (!(f2 & not_other) && f != 0) {
      pos += c == ' ';
      while (!(f2 & not_other) && f2 != 0) f2 = p.flags(++pos);
      while (IsCrOrLf(p.cpt(pos))) ++pos;
      p.Emit(pos);
      continue;
    }
    size_t spaces = 0;
    size_t after_last_newline = 0;
    while (p.flags(pos + spaces) & kSpace) {
      if (IsCrOrLf(p.cpt(pos + spaces))) after_last_newline = pos + spaces + 1;
      ++spaces;
    }
    if (after_last_newline > 0) {  // \s*[\r\n]+
      pos = after_last_newline;
    } else if (spaces > 1 && pos + spaces < end) {  // \s+(?!\S)
      pos += spaces - 1;
    } else if (spaces > 0) {  // \s+
      pos += spaces;
    } else {  // no match: one code point on its own
      ++pos;
    }
    p.Emit(pos);
  }
}

struct PreTokenizerEntry {
  std::vector<std::string_view> names;
  std::vector<SplitStage> stages;
  bool ignore_merges = false;
  bool default_add_bos = false;
};

const std::vector<PreTokenizerEntry>& PreTokenizerTable() {
  static const std::vector<PreTokenizerEntry> table = {
      {{"default", ""},
       {SplitDefaultPunctuation, SplitGpt2, SplitNumberRuns, SplitAsciiDigitTriples}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {SplitLlama3},
       /*ignore_merges=*/true,
       /*default_add_bos=*/true},
      {{"dbrx", "smaug-bpe"}, {SplitLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
        "solar-open", "grok-2"},
       {SplitQwen2}},
      {{"qwen35"}, {SplitQwen35}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
        "trillion", "granite-docling", "exaone4"},
       {SplitGpt2}},
      {{"starcoder", "smollm", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       {SplitEachNumber, SplitGpt2}},
      {{"falcon"}, {SplitFalconPunctuation, SplitGpt2, SplitAsciiDigitTriples}},
      {{"deepseek-llm"},
       {SplitEachNewline, SplitDeepseekLlmLetters, SplitDeepseekLlmPunctuation, SplitTrailingSpace,
        SplitDeepseekCjk, SplitNumberRuns}},
      {{"deepseek-coder"},
       {SplitEachNewline, SplitSpaceThenLetters, SplitSpaceThenPunctuation, SplitDeepseekCjk,
        SplitEachNumber}},
      {{"deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"},
       {SplitNumbersUpTo3, SplitDeepseekV3Kana, SplitDeepseekV3Main}},
      {{"tekken"}, {SplitTekken}, /*ignore_merges=*/true, /*default_add_bos=*/true},
  };
  return table;
}

}  // namespace

StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name) {
  for (const PreTokenizerEntry& entry : PreTokenizerTable()) {
    if (std::find(entry.names.begin(), entry.names.end(), name) == entry.names.end()) continue;
    return PreTokenizer{name.empty() ? "default" : std::string(name), entry.stages,
                        entry.ignore_merges, entry.default_add_bos};
  }
  std::string supported;
  for (const PreTokenizerEntry& entry : PreTokenizerTable()) {
    for (std::string_view n : entry.names) {
      if (n.empty()) continue;
      if (!supported.empty()) supported += ", ";
      supported += n;
    }
  }
  return UnimplementedError(fmt::format(
      "pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; supported: {}", name, supported));
}

void SplitWords(const PreTokenizer& pre, const CodepointText& text, std::vector<uint32_t>* lengths,
                std::vector<uint32_t>* scratch) {
  lengths->clear();
  if (text.cpts.empty()) return;
  lengths->push_back(static_cast<uint32_t>(text.cpts.size()));
  for (SplitStage stage : pre.stages) {
    scratch->clear();
    size_t begin = 0;
    for (uint32_t length : *lengths) {
      stage(text, begin, begin + length, scratch);
      begin += length;
    }
    std::swap(*lengths, *scratch);
  }
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out) {
  Piece p(text, begin, end, out);
  for (size_t pos = begin; pos < end;) {
    const uint32_t c = p.cpt(pos);
    if (const size_t n = p.Contraction(pos, /*any_case=*/false); n > 0) {
      pos += p.Emit(pos + n);
      continue;
    }
    uint16_t f2 = c == ' ' ? p.flags(pos + 1) : p.flags(pos);
    if (f2 & kLetter) {  // <space>?\p{L}+
      pos += c == ' ';
      while (f2 & kLetter) f2 = p.flags(++pos);
      p.Emit(pos);
      continue;
    }
    if (f2 & kNumber) {  // <space>?\p{N}+
      pos += c == ' ';
      while (f2 & kNumber) f2 = p.flags(++pos);
      p.Emit(pos);
      continue;
    }
    if (!(f2 & (kSpace | kLetter | kNumber)) && f2 != 0) {  // <space>?[^\s\p{L}\p{N}]+
      pos += c == ' ';
      while (!(f2 & (kSpace | kLetter | kNumber)) && f2 != 0) f2 = p.flags(++pos);
      p.Emit(pos);
      continue;
    }
    const size_t spaces = p.WhitespaceRun(pos);
    if (spaces > 1 && pos + spaces < end) {  // \s+(?!\S)
      pos += spaces - 1;
    } else if (spaces > 0) {  // \s+
      pos += spaces;
    } else {
      ++pos;
    }
    p.Emit(pos);
  }
}

void SplitLlama3(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitLlama3Like(text, begin, end, /*max_digits=*/3, kLetter, out);
}

void SplitQwen2(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitLlama3Like(text, begin, end, /*max_digits=*/1, kLetter, out);
}

void SplitQwen35(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out) {
  SplitLlama3Like(text, begin, end, /*max_digits=*/1, kLetter | kUnicodeMark, out);
}

}  // namespace kvl
