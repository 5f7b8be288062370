#include "lattice_verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kvl::cli {
namespace {

// Whether two cells made the same page choices: the same pages per action, the same pages brought
// back, the same preemptions. Then their work differs by what the engine does around the
// choices (nothing the policy decides), and their tok/s by the machine's run-to-run spread.
bool SameChoices(const Cell& a, const Cell& b) {
  return a.action_pages == b.action_pages && a.restored_pages == b.restored_pages &&
         a.preemptions == b.preemptions;
}

// Actions that took at least 10% of the pages a cell acted on.
int MixedActions(const Cell& c) {
  int64_t total = 0;
  for (int64_t pages : c.action_pages) total += pages;
  int mixed = 0;
  for (int64_t pages : c.action_pages) {
    if (total > 0 && pages * 10 >= total) ++mixed;
  }
  return mixed;
}

}  // namespace

Verdict JudgeAuto(const std::vector<Cell>& cells, double fraction) {
  Verdict v;
  v.budget_fraction = fraction;
  const Cell* automatic = nullptr;
  for (const Cell& c : cells) {
    if (c.policy == "auto" && c.budget_fraction == fraction) automatic = &c;
  }
  if (automatic == nullptr) return v;
  v.has_auto = true;
  v.budget_bytes = automatic->budget_bytes;
  if (!automatic->error.empty()) return v;
  v.auto_tok_s = automatic->tok_s;
  v.mixed_actions = MixedActions(*automatic);
  v.strictly_best = true;
  for (const Cell& c : cells) {
    if (c.budget_fraction != fraction || c.policy == "auto" || !c.error.empty()) continue;
    if (c.tok_s >= automatic->tok_s) v.strictly_best = false;
    if (SameChoices(c, *automatic)) {
      v.strictly_best = false;
      v.same_choices_as.push_back(c.policy);
    }
    const bool as_good =
        c.top1 >= automatic->top1 - 1e-9 && c.kld_mean <= automatic->kld_mean + 1e-12;
    if (as_good && c.tok_s > v.best_tok_s) {
      v.best_tok_s = c.tok_s;
      v.best_policy = c.policy;
    }
  }
  v.ratio = v.best_tok_s > 0 ? v.auto_tok_s / v.best_tok_s : 0;
  const Cell* best = nullptr;
  for (const Cell& c : cells) {
    if (c.budget_fraction == fraction && c.policy == v.best_policy) best = &c;
  }
  if (best != nullptr) {
    std::vector<double> ratios;
    const size_t rounds = std::min(automatic->run_tok_s.size(), best->run_tok_s.size());
    for (size_t r = 0; r < rounds; ++r) {
      if (best->run_tok_s[r] > 0) ratios.push_back(automatic->run_tok_s[r] / best->run_tok_s[r]);
    }
    if (!ratios.empty()) {
      std::sort(ratios.begin(), ratios.end());
      v.round_ratio_min = ratios.front();
      v.round_ratio_median = ratios[ratios.size() / 2];
      v.round_ratio_max = ratios.back();
    }
    v.cpu_ratio = best->cpu_tok_s > 0 ? automatic->cpu_tok_s / best->cpu_tok_s : 0;
  }
  v.within_3pct = v.best_policy.empty() || v.ratio >= 0.97;
  return v;
}

std::string ActionsText(const Cell& c) {
  std::string out;
  for (size_t a = 0; a < c.action_pages.size(); ++a) {
    if (c.action_pages[a] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {} ({} back)", KvActionName(static_cast<KvAction>(a)),
                       c.action_pages[a], c.restored_pages[a]);
  }
  return out.empty() ? "-" : out;
}

// The note says why from what the cells measured: the same choices (the gap is the spread
// keep-all shows against its own repeat), a faster policy that loses quality, or other choices
// with their measured bring-back times.
std::string VerdictNote(const Verdict& v, const std::vector<Cell>& cells, const Cell& reference,
                        const Cell& repeat) {
  const Cell* automatic = nullptr;
  for (const Cell& c : cells) {
    if (c.policy == "auto" && c.budget_fraction == v.budget_fraction) automatic = &c;
  }
  if (automatic == nullptr) return "auto is not among --policies";
  if (!automatic->error.empty()) return "auto did not complete";
  const double spread =
      reference.tok_s > 0 ? 100 * std::abs(repeat.tok_s / reference.tok_s - 1) : 0;
  const double auto_wall_share =
      automatic->wall_ms > 0 ? 100 * automatic->bring_back_ms / automatic->wall_ms : 0;
  // What sets `c` apart from auto, after "which".
  auto why = [&](const Cell& c) -> std::string {
    if (c.top1 < automatic->top1 - 1e-9 || c.kld_mean > automatic->kld_mean + 1e-12) {
      return fmt::format("loses quality (agreement {:.1f}%, KLD {:.2e})", 100 * c.top1,
                         c.kld_mean);
    }
    const std::string spread_text =
        fmt::format("the gap is run-to-run spread (keep-all's repeat ran {:.1f}% off keep-all)",
                    spread);
    if (SameChoices(c, *automatic)) {
      return fmt::format("made auto's choices page for page, bringing pages back in {:.1f} ms "
                         "against auto's {:.1f} ms ({:.1f}% of auto's run): {}",
                         c.bring_back_ms, automatic->bring_back_ms, auto_wall_share, spread_text);
    }
    const bool auto_cheaper = automatic->bring_back_ms <= c.bring_back_ms &&
                              automatic->preemptions <= c.preemptions;
    return fmt::format("chose {} with {} preemptions, bringing pages back in {:.1f} ms, against "
                       "auto's {} with {} preemptions and {:.1f} ms{}",
                       ActionsText(c), c.preemptions, c.bring_back_ms, ActionsText(*automatic),
                       automatic->preemptions, automatic->bring_back_ms,
                       auto_cheaper ? ": auto's choices cost less as measured, " + spread_text
                                    : std::string());
  };
  auto named = [](const Cell& c) { return fmt::format("{} ({:.1f} tok/s)", c.policy, c.tok_s); };
  std::vector<std::string> parts;
  if (!v.within_3pct) {
    for (const Cell& c : cells) {
      if (c.budget_fraction == v.budget_fraction && c.policy == v.best_policy) {
        parts.push_back(SameChoices(c, *automatic)
                            ? fmt::format("more than 3% slower than {}, which made auto's "
                                          "choices page for page (below)",
                                          named(c))
                            : fmt::format("more than 3% slower than {}, which {}", named(c), why(c)));
      }
    }
  }
  if (!v.strictly_best) {
    // The faster policies with other choices, each with why; those that made auto's choices
    // once, together: no difference in speed from them says anything of the choices.
    std::vector<std::string> faster;
    const Cell* twin = nullptr;
    for (const Cell& c : cells) {
      if (c.budget_fraction != v.budget_fraction || c.policy == "auto" || !c.error.empty()) continue;
      if (SameChoices(c, *automatic)) {
        if (twin == nullptr) twin = &c;
        continue;
      }
      if (c.tok_s >= automatic->tok_s) faster.push_back(fmt::format("{}, which {}", named(c), why(c)));
    }
    if (twin != nullptr) {
      faster.push_back(fmt::format("{} {}; auto faster or slower than {} is no win or loss of "
                                   "its choices",
                                   fmt::join(v.same_choices_as, " and "), why(*twin),
                                   v.same_choices_as.size() > 1 ? "them" : "it"));
    }
    parts.push_back(fmt::format("not strictly best: {}", fmt::join(faster, "; ")));
  }
  return fmt::format("{}", fmt::join(parts, ". "));
}

}  // namespace kvl::cli
