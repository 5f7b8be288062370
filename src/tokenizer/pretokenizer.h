// The pre-tokenizers of byte-level BPE vocabularies: the text is cut into words before BPE merges
// run inside each word. Each `tokenizer.ggml.pre` names a sequence of regular expressions (as in
// llama.cpp's vocabulary code); every stage cuts each piece of the previous one further, and the
// text between two matches is a piece of its own. The regexes are written out here as matchers
// over code-point flags, with the semantics of the engines llama.cpp runs them with (its own
// matchers for the common ones, std::regex's leftmost, first-alternative backtracking for the
// rest), so the words, and therefore the ids, come out the same.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/status.h"

namespace kvl {

// The code points of one text and their Unicode flags, side by side.
struct CodepointText {
  std::vector<uint32_t> cpts;
  std::vector<uint16_t> flags;
};

// One stage: appends the lengths (in code points) of the pieces [begin, end) splits into.
using SplitStage = void (*)(const CodepointText& text, size_t begin, size_t end,
                            std::vector<uint32_t>* lengths);

struct PreTokenizer {
  std::string name;
  std::vector<SplitStage> stages;
  bool ignore_merges = false;  // a word that is a token is taken whole, before any merge
  bool default_add_bos = false;  // add BOS unless the file says otherwise
};

// The pre-tokenizer `tokenizer.ggml.pre` names ("" is llama.cpp's "default"). An unknown name
// is an error that lists the supported ones.
StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name);

// Cuts text into words: the code-point length of each, in order, covering the whole text.
void SplitWords(const PreTokenizer& pre, const CodepointText& text, std::vector<uint32_t>* lengths,
                std::vector<uint32_t>* scratch);

// The stages, exposed for the tests (each is one of llama.cpp's regexes).
void SplitGpt2(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out);
void SplitLlama3(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out);
void SplitQwen2(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out);
void SplitQwen35(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out);
void SplitDeepseekV3Main(const CodepointText& text, size_t begin, size_t end,
                         std::vector<uint32_t>* out);
void SplitTekken(const CodepointText& text, size_t begin, size_t end, std::vector<uint32_t>* out);

// Stages written as a single regex match at a position (see pretokenizer_regex.cc).
void SplitNumberRuns(const CodepointText& text, size_t begin, size_t end,
                     std::vector<uint32_t>* out);
void SplitEachNumber(const CodepointText& text, size_t begin, size_t end,
                     std::vector<uint32_t>* out);
void SplitNumbersUpTo3(const CodepointText& text, size_t begin, size_t end,
                       std::vector<uint32_t>* out);
void SplitAsciiDigitTriples(const CodepointText& text, size_t begin, size_t end,
                            std::vector<uint32_t>* out);
void SplitDefaultPunctuation(const CodepointText& text, size_t begin, size_t end,
                             std::vector<uint32_t>* out);
void SplitFalconPunctuation(const CodepointText& text, size_t begin, size_t end,
                            std::vector<uint32_t>* out);
void SplitEachNewline(const CodepointText& text, size_t begin, size_t end,
                      std::vector<uint32_t>* out);
void SplitDeepseekLlmLetters(const CodepointText& text, size_t begin, size_t end,
                             std::vector<uint32_t>* out);
void SplitDeepseekLlmPunctuation(const CodepointText& text, size_t begin, size_t end,
                                 std::vector<uint32_t>* out);
void SplitTrailingSpace(const CodepointText& text, size_t begin, size_t end,
                        std::vector<uint32_t>* out);
void SplitDeepseekCjk(const CodepointText& text, size_t begin, size_t end,
                      std::vector<uint32_t>* out);
void SplitDeepseekV3Kana(const CodepointText& text, size_t begin, size_t end,
                         std::vector<uint32_t>* out);
void SplitSpaceThenLetters(const CodepointText& text, size_t begin, size_t end,
                           std::vector<uint32_t>* out);
void SplitSpaceThenPunctuation(const CodepointText& text, size_t begin, size_t end,
                               std::vector<uint32_t>* out);

}  // namespace kvl
