// Tokenizer::FromGguf: reads the tokenizer.ggml.* metadata into a TokenizerVocab. The GGUF layer
// already names the key in its errors; this file adds the checks only the tokenizer knows
// (array lengths, id ranges, supported models) and llama.cpp's defaults per model.
#include <fmt/format.h>

#include <string>
#include <utility>

#include "kvl/tokenizer.h"
#include "pretokenizer.h"

namespace kvl {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";
constexpr std::string_view kBosKey = "tokenizer.ggml.bos_token_id";
constexpr std::string_view kEosKey = "tokenizer.ggml.eos_token_id";
constexpr std::string_view kEotKey = "tokenizer.ggml.eot_token_id";
constexpr std::string_view kEomKey = "tokenizer.ggml.eom_token_id";
constexpr std::string_view kUnkKey = "tokenizer.ggml.unknown_token_id";
constexpr std::string_view kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kAddEosKey = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";
constexpr std::string_view kNameKey = "general.name";

// A special token id: absent keys keep the model's default; present ones must name a token.
Status ReadTokenId(const GgufFile& file, std::string_view key, size_t vocab_size, TokenId* id) {
  if (file.Find(key) == nullptr) return Status::Ok();
  KVL_ASSIGN_OR_RETURN(const int64_t value, file.GetInt(key));
  if (value == -1 || value == 0xFFFFFFFF) {  // "none", as some converters write it
    *id = -1;
    return Status::Ok();
  }
  if (value < 0 || static_cast<uint64_t>(value) >= vocab_size) {
    return InvalidArgumentError(fmt::format("metadata key '{}' = {} is outside the {}-token vocab",
                                            key, value, vocab_size));
  }
  *id = static_cast<TokenId>(value);
  return Status::Ok();
}

Status ReadFlag(const GgufFile& file, std::string_view key, bool* flag) {
  if (file.Find(key) == nullptr) return Status::Ok();
  KVL_ASSIGN_OR_RETURN(*flag, file.GetBool(key));
  return Status::Ok();
}

Status WrongLength(std::string_view key, uint64_t count, size_t vocab_size) {
  return InvalidArgumentError(fmt::format("metadata key '{}' has {} entries, but {} has {}", key,
                                          count, kTokensKey, vocab_size));
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  KVL_ASSIGN_OR_RETURN(const std::string model, file.GetString(kModelKey));
  TokenizerVocab vocab;
  if (model == "llama") {
    vocab.model = TokenizerModel::kSentencePiece;
  } else if (model == "gpt2") {
    vocab.model = TokenizerModel::kBytePairEncoding;
  } else {
    return UnimplementedError(fmt::format(
        "tokenizer model '{}' ({}) is not supported; supported: 'llama' (SentencePiece BPE), "
        "'gpt2' (byte-level BPE)",
        model, kModelKey));
  }

  KVL_ASSIGN_OR_RETURN(const GgufValue* tokens, file.GetArray(kTokensKey, GgufValueType::kString));
  if (tokens->strings.empty()) {
    return InvalidArgumentError(fmt::format("metadata key '{}' is empty", kTokensKey));
  }
  const size_t n = tokens->strings.size();
  vocab.tokens.reserve(n);
  for (std::string_view token : tokens->strings) vocab.tokens.emplace_back(token);

  // Scores and types are optional in llama.cpp too (all 0 / inferred), but when present they must
  // describe every token.
  if (file.Find(kScoresKey) != nullptr) {
    KVL_ASSIGN_OR_RETURN(const GgufValue* scores, file.GetArray(kScoresKey, GgufValueType::kFloat32));
    if (scores->array_count != n) return WrongLength(kScoresKey, scores->array_count, n);
    vocab.scores.resize(n);
    for (size_t i = 0; i < n; ++i) vocab.scores[i] = scores->ArrayFloat(i);
  }
  if (file.Find(kTypesKey) != nullptr) {
    KVL_ASSIGN_OR_RETURN(const GgufValue* types, file.GetArray(kTypesKey, GgufValueType::kInt32));
    if (types->array_count != n) return WrongLength(kTypesKey, types->array_count, n);
    vocab.types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t type = types->ArrayInt(i);
      if (type < 0 || type > static_cast<int64_t>(TokenType::kByte)) {
        return InvalidArgumentError(fmt::format("metadata key '{}': token {} has unknown type {}",
                                                kTypesKey, i, type));
      }
      vocab.types[i] = static_cast<TokenType>(type);
    }
  }

  if (vocab.model == TokenizerModel::kBytePairEncoding) {
    // llama.cpp's defaults for byte-level BPE; BOS follows the pre-tokenizer (Llama-3 and Tekken
    // add one) unless the file says.
    if (file.Find(kPreKey) != nullptr) {
      KVL_ASSIGN_OR_RETURN(vocab.pre, file.GetString(kPreKey));
    }
    KVL_ASSIGN_OR_RETURN(const PreTokenizer pre, PreTokenizerFromName(vocab.pre));
    KVL_ASSIGN_OR_RETURN(const GgufValue* merges,
                         file.GetArray(kMergesKey, GgufValueType::kString));
    vocab.merges.reserve(merges->strings.size());
    for (std::string_view merge : merges->strings) vocab.merges.emplace_back(merge);
    vocab.bos = n > 11 ? 11 : -1;
    vocab.eos = n > 11 ? 11 : -1;
    vocab.unk = -1;
    vocab.add_bos = pre.default_add_bos;
    vocab.add_space_prefix = false;
  } else {
    // SentencePiece: <unk> <s> </s> are the first three tokens unless the file says otherwise.
    vocab.bos = n > 1 ? 1 : -1;
    vocab.eos = n > 2 ? 2 : -1;
    vocab.unk = 0;
  }

  KVL_RETURN_IF_ERROR(ReadTokenId(file, kBosKey, n, &vocab.bos));
  KVL_RETURN_IF_ERROR(ReadTokenId(file, kEosKey, n, &vocab.eos));
  KVL_RETURN_IF_ERROR(ReadTokenId(file, kEotKey, n, &vocab.eot));
  KVL_RETURN_IF_ERROR(ReadTokenId(file, kEomKey, n, &vocab.eom));
  KVL_RETURN_IF_ERROR(ReadTokenId(file, kUnkKey, n, &vocab.unk));
  KVL_RETURN_IF_ERROR(ReadFlag(file, kAddBosKey, &vocab.add_bos));
  KVL_RETURN_IF_ERROR(ReadFlag(file, kAddEosKey, &vocab.add_eos));
  if (vocab.model == TokenizerModel::kSentencePiece) {
    KVL_RETURN_IF_ERROR(ReadFlag(file, kAddSpacePrefixKey, &vocab.add_space_prefix));
  }
  if (vocab.add_bos && vocab.bos < 0) {
    return InvalidArgumentError(fmt::format("vocab of {} tokens adds a BOS token but has no {}",
                                            n, kBosKey));
  }
  if (file.Find(kNameKey) != nullptr) {
    if (StatusOr<std::string> name = file.GetString(kNameKey); name.ok()) vocab.name = *name;
  }
  return FromVocab(std::move(vocab));
}

}  // namespace kvl
