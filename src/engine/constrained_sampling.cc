// Grammar-constrained sampling: see constrained_sampling.h.
#include "constrained_sampling.h"

#include <fmt/format.h>

#include <algorithm>

#include "request.h"

namespace kvl {

std::shared_ptr<const GrammarVocabulary> GrammarVocabularyOnce::Get(const Tokenizer& tokenizer,
                                                                    int32_t vocab_size) {
  std::call_once(once_, [&] {
    // Control tokens have no text a grammar could match (their markup is not output); the
    // end-of-generation ones are allowed where the grammar may end. Ids past the tokenizer's
    // vocabulary (padded embeddings) have no text either.
    std::vector<std::string> pieces(static_cast<size_t>(vocab_size));
    for (int32_t id = 0; id < std::min(vocab_size, tokenizer.vocab_size()); ++id) {
      const TokenType type = tokenizer.type(id);
      if (type == TokenType::kControl || type == TokenType::kUnknown ||
          type == TokenType::kUnused) {
        continue;
      }
      pieces[static_cast<size_t>(id)] = tokenizer.TokenPiece(id, /*special=*/false);
    }
    vocabulary_ = std::make_shared<const GrammarVocabulary>(std::move(pieces),
                                                            tokenizer.end_of_generation_ids());
  });
  return vocabulary_;
}

StatusOr<std::unique_ptr<GrammarConstraint>> CompileRequestGrammar(
    std::string_view gbnf, std::shared_ptr<const GrammarVocabulary> vocabulary) {
  StatusOr<std::shared_ptr<const Grammar>> grammar = ParseGbnf(gbnf);
  if (!grammar.ok()) return grammar.status();
  return std::make_unique<GrammarConstraint>(std::move(*grammar), std::move(vocabulary));
}

int32_t SampleNextToken(Sequence& seq, const float* logits) {
  if (seq.grammar == nullptr) return seq.sampler->Sample(logits, seq.tokens);
  bool any_allowed = false;
  const uint64_t* allowed = seq.grammar->AllowedTokens(&any_allowed);
  if (!any_allowed) return -1;
  const int32_t token = seq.sampler->Sample(logits, seq.tokens, allowed);
  // The sampler picked from the mask, so the grammar takes the token.
  const Status accepted = seq.grammar->Accept(token);
  KVL_CHECK_MSG(accepted.ok(), "the grammar refused a token its own mask allowed");
  return token;
}

Status GrammarDeadEnd(const Sequence& seq) {
  return InvalidArgumentError(fmt::format(
      "request {}: after {} generated tokens the grammar allows no token of this vocabulary (no "
      "token spells a continuation it accepts); the output is incomplete",
      seq.id, seq.num_generated));
}

}  // namespace kvl
