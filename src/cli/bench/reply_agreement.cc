#include "reply_agreement.h"

#include <algorithm>

namespace kvl::cli {

double LeadingAgreement(const std::vector<int32_t>& run, const std::vector<int32_t>& reference) {
  if (reference.empty()) return run.empty() ? 1 : 0;
  const auto [mismatch, unused] =
      std::mismatch(run.begin(), run.end(), reference.begin(), reference.end());
  return static_cast<double>(mismatch - run.begin()) / static_cast<double>(reference.size());
}

}  // namespace kvl::cli
