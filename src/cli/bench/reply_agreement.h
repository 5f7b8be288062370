// How far a reply run under a KV configuration agrees with the reference reply (keep-all's): the
// one definition every bench that compares replies uses (bench turns, bench lattice,
// bench/long_conversation_bench).
#pragma once

#include <cstdint>
#include <vector>

namespace kvl::cli {

// The fraction of `reference` that `run` reproduces before their first difference: 1 for equal
// replies, 0 when the first tokens differ. An empty reference is reproduced whole by an empty run
// (1) and contradicted by any token (0): a reply where the reference stopped at once is a
// difference, never a vacuous agreement.
double LeadingAgreement(const std::vector<int32_t>& run, const std::vector<int32_t>& reference);

}  // namespace kvl::cli
