// libFuzzer target for the tokenizer: any text must encode to ids inside the vocabulary, in any
// mode (BOS / EOS, parse_special), and any ids must decode without reading outside a token; on a
// byte-level BPE vocabulary, valid UTF-8 must come back byte for byte from its ids.
//
// The vocabularies: two small hand-made ones (SentencePiece with byte fallback, byte-level BPE
// with merges and special tokens), plus every GGUF named in $KVL_FUZZ_VOCABS (colon-separated;
// scripts/run-fuzz.sh passes llama.cpp's ggml-vocab-*.gguf files when it can fetch them).
// Input: byte 0 picks the vocabulary, byte 1 the mode, the rest is the text (or, in decode mode,
// little-endian int32 ids).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"

namespace {

using kvl::TokenId;
using kvl::Tokenizer;
using kvl::TokenizerVocab;
using kvl::TokenType;

std::unique_ptr<Tokenizer> Make(TokenizerVocab v) {
  auto tok = Tokenizer::FromVocab(std::move(v));
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_fuzzer: %s\n", tok.status().ToString().c_str());
    std::abort();
  }
  return std::move(*tok);
}

std::unique_ptr<Tokenizer> SentencePieceVocab() {
  TokenizerVocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "<|im_start|>", "<user>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl, TokenType::kControl,
             TokenType::kUserDefined};
  for (int b = 0; b < 256; ++b) {
    char text[8];
    std::snprintf(text, sizeof(text), "<0x%02X>", b);
    v.tokens.push_back(text);
    v.types.push_back(TokenType::kByte);
  }
  for (const char* piece : {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "<s", "\xC3\xA9"}) {
    v.tokens.push_back(piece);
    v.types.push_back(TokenType::kNormal);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 0; i < v.scores.size(); ++i) v.scores[i] = -static_cast<float>(i % 7);
  return Make(std::move(v));
}

// GPT-2's alphabet: the UTF-8 of each byte's stand-in character.
std::vector<std::string> ByteAlphabet() {
  std::vector<std::string> alphabet;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cpt = printable ? static_cast<uint32_t>(b) : 256 + extra++;
    std::string text;
    if (cpt < 0x80) {
      text.push_back(static_cast<char>(cpt));
    } else {
      text.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
      text.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
    }
    alphabet.push_back(text);
  }
  return alphabet;
}

// The whole alphabet, a few merges, two special tokens.
std::unique_ptr<Tokenizer> BytePairVocab(const char* pre) {
  TokenizerVocab v;
  v.model = kvl::TokenizerModel::kBytePairEncoding;
  v.pre = pre;
  v.tokens = ByteAlphabet();
  const std::string space = "\xC4\xA0";  // Ġ, the stand-in of ' '
  for (const std::string& merged : {space + "a", std::string("ab"), space + "ab", std::string("12")}) {
    v.tokens.push_back(merged);
  }
  v.merges = {space + " a", "a b", space + "a b", "1 2"};
  v.tokens.push_back("<|endoftext|>");
  v.tokens.push_back("<tool>");
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types[v.tokens.size() - 2] = TokenType::kControl;
  v.types[v.tokens.size() - 1] = TokenType::kUserDefined;
  v.bos = v.eos = static_cast<TokenId>(v.tokens.size() - 2);
  v.unk = -1;
  v.add_bos = false;
  return Make(std::move(v));
}

struct Vocab {
  std::unique_ptr<kvl::GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  // Byte-level BPE with a token for every byte: any valid UTF-8 comes back from its ids. (Some
  // real vocabularies lack the bytes UTF-8 never uses, or rare ones: llama.cpp drops those bytes
  // too.)
  bool round_trips = false;
};

bool HasEveryByte(const Tokenizer& tok) {
  if (tok.model() != kvl::TokenizerModel::kBytePairEncoding) return false;
  for (const std::string& c : ByteAlphabet()) {
    if (tok.FindToken(c) < 0) return false;
  }
  return true;
}

std::vector<Vocab>& Vocabs() {
  static std::vector<Vocab> vocabs = [] {
    std::vector<Vocab> v;
    v.push_back({nullptr, SentencePieceVocab()});
    for (const char* pre : {"llama-bpe", "qwen2", "gpt-2", "starcoder", "deepseek-llm",
                            "deepseek-v3", "tekken", "default"}) {
      v.push_back({nullptr, BytePairVocab(pre)});
    }
    if (const char* list = std::getenv("KVL_FUZZ_VOCABS"); list != nullptr) {
      std::string paths = list;
      for (size_t start = 0; start <= paths.size();) {
        size_t end = paths.find(':', start);
        if (end == std::string::npos) end = paths.size();
        const std::string path = paths.substr(start, end - start);
        start = end + 1;
        if (path.empty()) continue;
        auto file = kvl::GgufFile::Open(path);
        if (!file.ok()) continue;
        auto tok = Tokenizer::FromGguf(**file);
        if (tok.ok()) v.push_back({std::move(*file), std::move(*tok)});
      }
    }
    for (Vocab& vocab : v) vocab.round_trips = HasEveryByte(*vocab.tokenizer);
    return v;
  }();
  return vocabs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::vector<Vocab>& vocabs = Vocabs();
  const Vocab& vocab = vocabs[data[0] % vocabs.size()];
  const Tokenizer& tok = *vocab.tokenizer;
  const uint8_t mode = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);

  if (mode & 0x80) {  // decode arbitrary ids
    std::vector<TokenId> ids(rest.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
    const std::string text = tok.Decode(ids, (mode & 1) != 0);
    volatile size_t sink = text.size();
    (void)sink;
    for (TokenId id : ids) sink = tok.TokenPiece(id).size();
    return 0;
  }
  const kvl::EncodeOptions options{(mode & 1) != 0, (mode & 2) != 0};
  const std::vector<TokenId> ids = tok.Encode(rest, options);
  for (TokenId id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  const std::string decoded = tok.Decode(ids, /*special=*/true);
  if (vocab.round_trips && !options.add_special && !options.parse_special &&
      kvl::IsValidUtf8(rest) && decoded != rest) {
    std::fprintf(stderr, "byte-level BPE round trip differs: %zu bytes in, %zu out\n", rest.size(),
                 decoded.size());
    std::abort();
  }
  return 0;
}
