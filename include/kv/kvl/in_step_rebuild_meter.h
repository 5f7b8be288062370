// Rebuilds inside the decode step, measured (issue 28 item 1). A page of a running sequence kept
// as residual checkpoints is rebuilt in every step that reads it, as extra rows of the step's own
// K and V matmuls (KvLayerRebuild): no timer can hold its time apart from the step's. Its measured
// cost is the step's time minus what the same step takes without the rows, split evenly over the
// pages it rebuilt, and it is checked against what the policy priced them at (their marginal
// price in the step, InStepRebuildMs), as every other page brought back is checked.
//
// "The same step without the rows" is the calibrated decode step (KvMemory::PlainDecodeStepMs,
// plus the logits the calibration's step does not ask for) times the median ratio measured /
// calibrated of this run's last plain decode steps (none yet: 1), so that a machine slower or
// faster than at calibration moves the baseline, not the rebuilds' price. Only decode steps are
// measured (one row per sequence, one forward run): a prefill chunk beside the rebuilt rows has no
// calibrated step to subtract.
//
// Thread-safety: none; the step loop owns it (KvStep, kvl/kv_step.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace kvl {

// The pages a forward run rebuilt from checkpoints inside it (KvLayerRebuild) and what the cost
// model prices them at in that run: InStepRebuildMs at each page's sequence's context, summed.
struct KvInStepRebuilds {
  int64_t pages = 0;
  double model_ms = 0;      // the profile's alone
  double predicted_ms = 0;  // corrected by what was measured (InStepRebuildCorrection)
};

class InStepRebuildMeter {
 public:
  // Plain decode steps the baseline's correction is the median over.
  static constexpr size_t kPlainWindow = 16;

  // One decode step.
  struct Step {
    double measured_ms = 0;     // its forward run, wall time (staging and streaming included)
    double plain_model_ms = 0;  // the calibrated time of the same run without rebuilt rows (0:
                                // unknown, nothing measured)
    KvInStepRebuilds rebuilds;  // the pages it rebuilt inside, priced (none: a plain step)
  };
  // What one step's rebuilds cost, per page (every page of the step alike), and in all.
  struct Measured {
    int64_t pages = 0;
    double predicted_page_ms = 0;  // the policy's price, corrected
    double measured_page_ms = 0;   // (step - baseline) / pages, at least 0
    double model_ms = 0;           // the step's pages, the profile's price alone
    double measured_ms = 0;        // the step's pages, measured
  };

  // A plain step (no rebuilt page) refines the baseline and returns nothing; a step with
  // rebuilds returns what they cost (nothing where the step has no calibrated time).
  std::optional<Measured> Observe(const Step& step);
  // What the calibrated step time is multiplied by for the baseline now.
  double plain_scale() const { return plain_scale_; }

 private:
  std::array<double, kPlainWindow> plain_ratios_{};  // measured / calibrated, a ring
  size_t plain_count_ = 0;                           // ratios in the ring
  size_t plain_next_ = 0;
  double plain_scale_ = 1.0;
};

}  // namespace kvl
