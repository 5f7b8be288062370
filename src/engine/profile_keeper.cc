// ProfileKeeper: the corrections written back, the drift noted, the machine measured again while
// idle (profile_keeper.h).
#include "profile_keeper.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvl/kv_pager.h"  // kNumFeedbackKeys, kRemoteTierFeedbackKey
#include "kvl/kv_policy.h"

namespace kvl {

std::string FeedbackKeyName(size_t key) {
  if (key == kRemoteTierFeedbackKey) return "redis";
  if (key == kInStepRebuildFeedbackKey) return "recompute-residual-in-step";
  return std::string(KvActionName(static_cast<KvAction>(key)));
}

namespace {

// The feedback key a profile's correction is named by; kNumFeedbackKeys for a name this build
// does not know (a later build's action: left in the file as it is).
size_t FeedbackKeyNamed(const std::string& name) {
  for (size_t key = 0; key < kNumFeedbackKeys; ++key) {
    if (FeedbackKeyName(key) == name) return key;
  }
  return kNumFeedbackKeys;
}

double SecondsSince(std::chrono::steady_clock::time_point then) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - then).count();
}

}  // namespace

ProfileKeeper::ProfileKeeper(ProfileKeeperOptions options, ProfileKeeperHooks hooks,
                             MachineProfile profile)
    : options_(std::move(options)), hooks_(std::move(hooks)), profile_(std::move(profile)) {
  last_write_ = std::chrono::steady_clock::now();
  retry_after_ = last_write_;
  if (hooks_.seed) {
    for (const PriceCorrection& c : profile_.corrections) {
      const size_t key = FeedbackKeyNamed(c.key);
      if (key < kNumFeedbackKeys) hooks_.seed(key, c.scale);
    }
  }
  events_written_ = EventsSeen();
  reason_written_ = profile_.remeasure_reason;
  remeasure_reason_ = profile_.remeasure_reason;
}

void ProfileKeeper::EnableIdleMeasuring() {
  if (options_.measure_when_idle) return;
  options_.measure_when_idle = true;
  // A profile measured on a busy machine that ObtainProfile kept (the machine was busy at the
  // start too) is measured once the machine is quiet.
  if (MeasuredUnderLoad(profile_)) {
    need_ = Need::kBusy;
    need_reason_ = fmt::format("it was measured on a busy machine ({})", LoadDescription(profile_));
  }
  // Corrections saved by an earlier run may already be past the bound.
  NoteDrift();
}

ProfileKeeper::~ProfileKeeper() {
  stop_.store(true);
  if (worker_.joinable()) worker_.join();
}

template <typename... Args>
void ProfileKeeper::Say(fmt::format_string<Args...> format, Args&&... args) {
  if (options_.messages == nullptr) return;
  fmt::print(options_.messages, "kvl: {}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(options_.messages);
}

int64_t ProfileKeeper::EventsSeen() const {
  if (hooks_.feedback == nullptr) return 0;
  int64_t events = 0;
  for (size_t key = 0; key < hooks_.feedback->keys(); ++key) events += hooks_.feedback->events(key);
  return events;
}

std::vector<PriceCorrection> ProfileKeeper::Corrections() const {
  std::vector<PriceCorrection> out = profile_.corrections;
  if (hooks_.feedback == nullptr) return out;
  for (size_t key = 0; key < hooks_.feedback->keys(); ++key) {
    const int64_t events = hooks_.feedback->events(key);
    if (events == 0) continue;
    const std::string name = FeedbackKeyName(key);
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const PriceCorrection& c) { return c.key == name; });
    if (it == out.end()) it = out.insert(out.end(), PriceCorrection{name, 1, 0});
    it->scale = hooks_.feedback->Scale(key);
    // The saved correction's events and this run's: how much evidence the scale rests on.
    const auto saved = std::find_if(profile_.corrections.begin(), profile_.corrections.end(),
                                    [&](const PriceCorrection& c) { return c.key == name; });
    it->events = (saved != profile_.corrections.end() ? saved->events : 0) + events;
  }
  return out;
}

void ProfileKeeper::NoteDrift() {
  if (drift_noted_) return;
  const std::vector<PriceCorrection> corrections = Corrections();
  const std::optional<CorrectionDrift> drift = FindCorrectionDrift(corrections, options_.drift_bound);
  if (!drift) return;
  drift_noted_ = true;
  if (MeasuredForDrift(profile_)) {
    // Measured again for a drift already: what is left is a cost the calibration cannot see
    // (the engine's own work around a page), and the correction is the price of it.
    Say("cost profile {}: {}, again after it was measured for that: kept as a correction",
        options_.path, drift->Describe());
    return;
  }
  if (options_.measure_when_idle) {
    need_ = Need::kDrift;
    need_reason_ = drift->Describe();
    drift_reason_ = DriftReason(*drift);
    Say("cost profile {}: {}: this machine is measured again at the next idle moment",
        options_.path, drift->Describe());
  } else {
    remeasure_reason_ = DriftReason(*drift);
    Say("cost profile {}: {}: it is measured again at the next start", options_.path,
        drift->Describe());
    WriteBack(/*force=*/true);
  }
}

void ProfileKeeper::WriteBack(bool force) {
  const int64_t events = EventsSeen();
  if (!force && events == events_written_ && remeasure_reason_ == reason_written_) return;
  const std::vector<PriceCorrection> corrections = Corrections();
  StatusOr<bool> written =
      WriteBackCorrections(options_.path, profile_.timestamp, corrections, remeasure_reason_);
  last_write_ = std::chrono::steady_clock::now();
  events_written_ = events;
  reason_written_ = remeasure_reason_;
  if (!written.ok()) {
    Say("warning: the measured corrections could not be written back: {}",
        written.status().ToString());
  }
}

void ProfileKeeper::AfterStep() {
  if (SecondsSince(last_write_) < options_.write_back_seconds) return;
  last_write_ = std::chrono::steady_clock::now();  // checked once a period, written if changed
  if (EventsSeen() == events_written_) return;
  NoteDrift();
  WriteBack(/*force=*/false);
}

void ProfileKeeper::WorkArrived() {
  if (running_.load(std::memory_order_relaxed)) stop_.store(true);
}

std::optional<std::chrono::duration<double>> ProfileKeeper::IdleWorkIn() const {
  if (running_.load()) {
    // Woken by the worker when it is done; until then the loop waits like any idle loop.
    return done_.load() ? std::chrono::duration<double>(0) : std::chrono::duration<double>(3600);
  }
  if (need_ != Need::kNone) {
    const double until_retry =
        std::chrono::duration<double>(retry_after_ - std::chrono::steady_clock::now()).count();
    return std::chrono::duration<double>(std::max(options_.idle_seconds, until_retry));
  }
  if (EventsSeen() != events_written_) return std::chrono::duration<double>(options_.idle_seconds);
  return std::nullopt;
}

void ProfileKeeper::AtIdle() {
  if (running_.load()) {
    // A measurement taken (or thrown away) here; the next one waits for idle_seconds more.
    if (done_.load()) TakeMeasurement();
    return;
  }
  NoteDrift();
  if (EventsSeen() != events_written_) WriteBack(/*force=*/false);
  if (need_ != Need::kNone && std::chrono::steady_clock::now() >= retry_after_) StartMeasuring();
}

void ProfileKeeper::StartMeasuring() {
  stop_.store(false);
  done_.store(false);
  result_.reset();
  measured_busy_machine_ = false;
  running_.store(true);
  ++started_;
  measure_start_ = std::chrono::steady_clock::now();
  if (!announced_) {
    Say("cost profile {}: {}: measuring this machine again while idle (a request stops it)",
        options_.path, need_reason_);
  }
  announced_ = true;
  worker_ = std::thread([this] {
    // Measured only on a quiet machine (as ObtainProfile measures a busy profile again): on a
    // busy one the new profile would be as wrong as the old, and a quarter of a second asleep
    // costs the server nothing where a calibration costs it seconds of CPU.
    if (hooks_.others_cpu_share) {
      const std::optional<double> others = hooks_.others_cpu_share();
      if (!others || *others > kBusyOthersCpuShare) measured_busy_machine_ = true;
    }
    if (!measured_busy_machine_) result_ = hooks_.measure(stop_);
    done_.store(true);
    if (hooks_.wake) hooks_.wake();
  });
}

void ProfileKeeper::TakeMeasurement() {
  worker_.join();
  running_.store(false);
  const double seconds = SecondsSince(measure_start_);
  auto retry_later = [&](const std::string& why) {
    ++abandoned_;
    retry_after_ = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(options_.busy_retry_seconds));
    if (abandoned_ == 1) Say("cost profile {}: {}; measured again later", options_.path, why);
  };
  if (measured_busy_machine_) return retry_later("the machine is still busy");
  if (stop_.load() || !result_ || !result_->ok()) {
    if (stop_.load() || (result_ && result_->status().code() == StatusCode::kCancelled)) {
      // A request came: tried again at the next idle moment, with no wait beyond it.
      ++abandoned_;
      if (abandoned_ == 1) {
        Say("cost profile {}: measuring stopped after {:.1f} s: a request arrived; tried again "
            "at the next idle moment",
            options_.path, seconds);
      }
      return;
    }
    ++abandoned_;
    need_ = Need::kNone;
    Say("warning: cost profile {}: measuring again failed: {}; the profile is kept",
        options_.path, result_ ? result_->status().ToString() : std::string("no result"));
    return;
  }
  MachineProfile measured = std::move(**result_);
  result_.reset();
  if (MeasuredUnderLoad(measured)) {
    // The machine grew busy while it was measured. A few tries, then the next start's turn.
    if (++busy_results_ >= kMaxBusyResults) {
      ++abandoned_;
      if (need_ == Need::kDrift) remeasure_reason_ = drift_reason_;
      need_ = Need::kNone;
      Say("cost profile {}: measured on a busy machine {} times ({}); kept as it is{}",
          options_.path, busy_results_, LoadDescription(measured),
          remeasure_reason_.empty() ? "" : ", and measured again at the next start");
      return;
    }
    return retry_later(fmt::format("measured on a busy machine again ({})",
                                   LoadDescription(measured)));
  }
  measured.measured_because =
      need_ == Need::kDrift ? drift_reason_ : fmt::format("busy: {}", need_reason_);
  const Status saved = SaveProfile(measured, options_.path);
  if (!saved.ok()) Say("warning: {}; the new profile is used for this run only", saved.ToString());
  const Status applied = hooks_.apply ? hooks_.apply(measured) : Status::Ok();
  if (!applied.ok()) {
    ++abandoned_;
    need_ = Need::kNone;
    Say("warning: cost profile {}: the new prices could not be applied: {}", options_.path,
        applied.ToString());
    return;
  }
  ++finished_;
  busy_results_ = 0;
  need_ = Need::kNone;
  profile_ = std::move(measured);
  remeasure_reason_.clear();
  reason_written_.clear();
  drift_noted_ = false;
  announced_ = false;
  events_written_ = EventsSeen();  // the feedback started over with the new prices
  Say("cost profile {} measured again in {:.1f} s and saved; the engine prices with it now",
      options_.path, seconds);
}

void ProfileKeeper::AtStop() {
  if (running_.load()) {
    stop_.store(true);
    worker_.join();
    running_.store(false);
  }
  NoteDrift();
  // A drift this run meant to measure while idle and did not: the next start measures it.
  if (need_ == Need::kDrift) remeasure_reason_ = drift_reason_;
  WriteBack(/*force=*/false);
}

ProfileKeeper::Counts ProfileKeeper::counts() const {
  return {started_.load(), finished_.load(), abandoned_.load(), running_.load()};
}

}  // namespace kvl
