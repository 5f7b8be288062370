// The cost model corrected by its own checked predictions. Every page brought back is timed
// against the bring-back time the model predicted for it: restores and promotions by the pager,
// pages recomputed from tokens and rebuilt inside a decode step by KvStep::Close (the latter
// through its InStepRebuildMeter), all fed here through KvMemory. The model's inputs
// are measured once, by `kvl calibrate`, on a machine whose load, caches and page cache move
// afterwards, and some costs a calibration cannot see at all (a restore's share of the step's
// locks and copies, the page mix of this workload). BringBackFeedback keeps, per action (or per
// KV store tier), the ratio measured / predicted of the last pages, and the planner multiplies
// that action's predictions by the median over its last events: the prediction then checked and reported is
// the corrected one, and the policy weighs the actions at what they cost here and now.
//
// The correction learns only from actions the policy takes: one it stops choosing keeps the last
// correction it had, so a correction never swings back and forth between two actions. It is
// bounded (kMinScale..kMaxScale): a model off by more than that is a calibration to redo, not a
// factor to learn (`kvl calibrate` says so through the reported error).
//
// Thread-safety: none; KvMemory owns it and uses it on the engine's step thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvl {

class BringBackFeedback {
 public:
  static constexpr size_t kWindow = 16;     // events per key the median is taken over
  // Events before the first correction (scale 1 until then). One: an event can carry dozens of
  // pages (a resume recomputes a sequence's dropped pages in one step), and at 2 a run of three
  // resumes on stories260K priced 80 of its 120 recomputed pages uncorrected (median error
  // 21-23% against 2-8% at 1). One disturbed first event is outvoted by the median from the third.
  static constexpr size_t kMinSamples = 1;
  static constexpr double kMinScale = 0.25;
  static constexpr double kMaxScale = 4.0;

  explicit BringBackFeedback(size_t keys);

  // Pages brought back under `key` in one event: the model's prediction before any correction,
  // and the time they took. Pairs without a positive, finite value of both are ignored.
  void Observe(size_t key, double model_ms, double measured_ms);

  // Starts `key` from a correction measured in an earlier run (the profile's, written back by
  // ProfileKeeper): its scale, clamped, until this run observes an event of its own.
  void Seed(size_t key, double scale);

  // What to multiply `key`'s model prediction by: the median of measured / model over its last
  // kWindow events, clamped; until kMinSamples events were seen the seed, else 1 (and 1 for an
  // unknown key).
  double Scale(size_t key) const { return key < scales_.size() ? scales_[key] : 1.0; }
  size_t samples(size_t key) const { return key < windows_.size() ? windows_[key].size() : 0; }
  // Whether `key`'s scale rests on anything: an event of this run, or a seed.
  bool informed(size_t key) const {
    return key < seeded_.size() && (seeded_[key] || !windows_[key].empty());
  }
  // Events observed under `key` since this feedback was made (not bounded by the window).
  int64_t events(size_t key) const { return key < events_.size() ? events_[key] : 0; }
  size_t keys() const { return scales_.size(); }

 private:
  std::vector<std::vector<double>> windows_;  // ratios, a ring of kWindow per key
  std::vector<size_t> next_;
  std::vector<double> scales_;
  std::vector<int64_t> events_;
  std::vector<bool> seeded_;
};

// `feedback`'s scale for `key`; 1 without feedback (--no-kv-feedback).
inline double CorrectionFor(const BringBackFeedback* feedback, size_t key) {
  return feedback != nullptr ? feedback->Scale(key) : 1.0;
}

// A page's bring-back price: what the cost model says, and what the engine expects once the
// model is corrected by what was measured (the one that is checked and reported).
struct BringBackPrice {
  double model_ms = 0;      // the profile's alone, before the measured correction
  double predicted_ms = 0;  // corrected
};

// The one place a model price is corrected: `model_ms` times `key`'s scale in `feedback`.
inline BringBackPrice CorrectedPrice(const BringBackFeedback* feedback, size_t key,
                                     double model_ms) {
  return {model_ms, model_ms * CorrectionFor(feedback, key)};
}

// The pages one bring-back event brought back (one restore call, one step's recompute), per
// key: one observation per key and event (the sum of its pages' measured times against the sum
// of their model times), not one per page, so that a single large event does not fill the window.
class BringBackBatch {
 public:
  explicit BringBackBatch(size_t keys) : model_ms_(keys, 0.0), measured_ms_(keys, 0.0) {}

  // One page: the model's prediction before any correction, and the time it took.
  void Add(size_t key, double model_ms, double measured_ms) {
    if (key >= model_ms_.size()) return;
    model_ms_[key] += model_ms;
    measured_ms_[key] += measured_ms;
  }
  // Each key with pages observed once in `feedback` (null: none). Empties the batch.
  void FeedTo(BringBackFeedback* feedback);

 private:
  std::vector<double> model_ms_;
  std::vector<double> measured_ms_;
};

}  // namespace kvl
