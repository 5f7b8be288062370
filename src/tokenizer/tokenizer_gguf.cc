// Tokenizer::FromGguf: reads the tokenizer.ggml.* metadata into a TokenizerVocab. The GGUF layer
// already names the key in its errors; this file adds the checks only the tokenizer knows
// (array lengths, id ranges, supported models).
#include <string>
#include <utility>

#include "kvl/tokenizer.h"

namespace kvl {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kBosKey = "tokenizer.ggml.bos_token_id";
constexpr std::string_view kEosKey = "tokenizer.ggml.eos_token_id";
constexpr std::string_view kUnkKey = "tokenizer.ggml.unknown_token_id";
constexpr std::string_view kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";

// A special token id: absent keys keep the SentencePiece default; present ones must name a token.
Status ReadTokenId(const GgufFile& file, std::string_view key, size_t vocab_size, bool allow_none,
                   TokenId* id) {
  if (file.Find(key) == nullptr) return Status::Ok();
  KVL_ASSIGN_OR_RETURN(const int64_t value, file.GetInt(key));
  if (allow_none && value == -1) {
    *id = -1;
    return Status::Ok();
  }
  if (value < 0 || static_cast<uint64_t>(value) >= vocab_size) {
    return InvalidArgumentError("metadata key '" + std::string(key) + "' = " +
                                std::to_string(value) + " is outside the " +
                                std::to_string(vocab_size) + "-token vocab");
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
  return InvalidArgumentError("metadata key '" + std::string(key) + "' has " +
                              std::to_string(count) + " entries, but " + std::string(kTokensKey) +
                              " has " + std::to_string(vocab_size));
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  KVL_ASSIGN_OR_RETURN(const std::string model, file.GetString(kModelKey));
  if (model == "gpt2") {
    return UnimplementedError("tokenizer model 'gpt2' (" + std::string(kModelKey) +
                              "): gpt2 byte-level BPE is not supported yet");
  }
  if (model != "llama") {
    return UnimplementedError("tokenizer model '" + model + "' (" + std::string(kModelKey) +
                              ") is not supported; only 'llama' (SentencePiece BPE) is");
  }

  TokenizerVocab vocab;
  KVL_ASSIGN_OR_RETURN(const GgufValue* tokens, file.GetArray(kTokensKey, GgufValueType::kString));
  if (tokens->strings.empty()) {
    return InvalidArgumentError("metadata key '" + std::string(kTokensKey) + "' is empty");
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
        return InvalidArgumentError("metadata key '" + std::string(kTypesKey) + "': token " +
                                    std::to_string(i) + " has unknown type " +
                                    std::to_string(type));
      }
      vocab.types[i] = static_cast<TokenType>(type);
    }
  }

  KVL_RETURN_IF_ERROR(ReadTokenId(file, kBosKey, n, /*allow_none=*/false, &vocab.bos));
  KVL_RETURN_IF_ERROR(ReadTokenId(file, kEosKey, n, /*allow_none=*/false, &vocab.eos));
  KVL_RETURN_IF_ERROR(ReadTokenId(file, kUnkKey, n, /*allow_none=*/true, &vocab.unk));
  // Defaults that do not fit a tiny vocab are an error of the file, not of ours.
  if (static_cast<size_t>(vocab.bos) >= n || static_cast<size_t>(vocab.eos) >= n) {
    return InvalidArgumentError("vocab of " + std::to_string(n) + " tokens needs " +
                                std::string(kBosKey) + " and " + std::string(kEosKey));
  }
  KVL_RETURN_IF_ERROR(ReadFlag(file, kAddBosKey, &vocab.add_bos));
  KVL_RETURN_IF_ERROR(ReadFlag(file, kAddSpacePrefixKey, &vocab.add_space_prefix));
  return FromVocab(std::move(vocab));
}

}  // namespace kvl
