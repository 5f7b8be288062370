// `auto`'s verdict in `kvl bench lattice` at one budget of one workload: against the fastest fixed
// policy of equal or better quality, whether auto is within 3% of it, strictly best, and how many
// actions its choices mix; and the closing note that says why where it is not (lattice_verdict.cc).
#pragma once

#include <string>
#include <vector>

#include "lattice_cell.h"

namespace kvl::cli {

// `auto` at one budget against the fixed policies of equal or better quality there (top-1
// agreement at least auto's, KLD at most auto's): the best of them by tok/s, and whether auto is
// within 3% of it; and whether auto beats every fixed policy that completed, whatever its
// quality, with choices none of them made.
struct Verdict {
  double budget_fraction = 0;
  int64_t budget_bytes = 0;
  bool has_auto = false;     // auto is among --policies (it may still have failed)
  std::string best_policy;   // empty: no fixed policy of equal or better quality completed
  double best_tok_s = 0;
  double auto_tok_s = 0;
  double ratio = 0;          // auto / best, of the cells' median tok/s (> 1: auto is faster)
  // auto / best within each round (the two runs nearest in time), over the rounds.
  double round_ratio_min = 0, round_ratio_median = 0, round_ratio_max = 0;
  double cpu_ratio = 0;      // auto / best, of the median tok/s per second of CPU time
  bool within_3pct = false;
  // Faster than every fixed policy that completed, and by other choices: where a fixed policy
  // made auto's choices page for page (SameChoices), auto being faster is the machine's spread,
  // not a win of the cost model.
  bool strictly_best = false;
  std::vector<std::string> same_choices_as;  // the fixed policies that did
  // Actions that took at least 10% of the pages auto acted on (the goal asks for three where
  // auto wins by 10%).
  int mixed_actions = 0;
  // Why auto is not within 3% of the best, or not strictly best (VerdictNote); empty where it
  // is both.
  std::string note;
};

// The verdict at budget `fraction` over the cells of one workload.
Verdict JudgeAuto(const std::vector<Cell>& cells, double fraction);

// The closing note of one budget's verdict: where auto is more than 3% slower than the best fixed
// policy of its quality, and where it is not strictly best, why, from what the cells measured.
std::string VerdictNote(const Verdict& v, const std::vector<Cell>& cells, const Cell& reference,
                        const Cell& repeat);

// "demote-disk 50 (2 back), recompute-tokens 77 (0 back)": each action's pages and how many of
// them were brought back; "-" for none.
std::string ActionsText(const Cell& c);

}  // namespace kvl::cli
