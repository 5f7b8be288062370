// Grammar-constrained sampling (issue 42): a request's grammar compiled at Submit against the
// engine's vocabulary, and the one call the step runner makes per sampled token, which applies
// the grammar's mask before the sampler's chain and advances the grammar past the token.
//
// Thread-safety: GrammarVocabularyOnce may be asked from any thread (Submit); a sequence's
// GrammarConstraint is used only by the step loop.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>

#include "kvl/status.h"
#include "kvl/token_mask.h"
#include "kvl/tokenizer.h"

namespace kvl {

struct Sequence;

// The vocabulary as grammars see it (each token's bytes in a trie), built on the first
// constrained request and shared by all: a request without a grammar never pays for it.
class GrammarVocabularyOnce {
 public:
  // `vocab_size` is the model's (its logits' length), which may exceed the tokenizer's.
  std::shared_ptr<const GrammarVocabulary> Get(const Tokenizer& tokenizer, int32_t vocab_size);

 private:
  std::once_flag once_;
  std::shared_ptr<const GrammarVocabulary> vocabulary_;
};

// The request's GBNF grammar over `vocabulary`; INVALID_ARGUMENT ("grammar: ...") where it does
// not parse.
StatusOr<std::unique_ptr<GrammarConstraint>> CompileRequestGrammar(
    std::string_view gbnf, std::shared_ptr<const GrammarVocabulary> vocabulary);

// The sequence's next token from `logits`: its sampler's choice among the tokens its grammar
// allows (all tokens where it has none), the grammar advanced past it. -1 when the grammar
// allows no token at all (a dead end: the caller ends the request with GrammarDeadEnd's error).
int32_t SampleNextToken(Sequence& seq, const float* logits);

// Why a constrained request ended without finishing its grammar.
Status GrammarDeadEnd(const Sequence& seq);

}  // namespace kvl
