// Keeps the engine's cost profile true while it runs (kvl/profile_corrections.h): the corrections
// the engine measures as it brings pages back are written into the profile file (every
// write_back_seconds while they change, and at stop), so the next run starts from them; a
// correction that drifts past the bound, or a profile measured on a busy machine, has the
// machine measured again: in `kvl serve` at the next idle moment, in `kvl run` at the next start
// (the reason is written into the file, and ObtainProfile measures it). Each says so in one line.
//
// A measurement while serving runs on a worker thread with a thread pool of its own, never on
// the step loop: a request that arrives meanwhile is served at once, and the measurement, whose
// samples would now time the requests rather than the machine, is told to stop (it stops at its
// next timed sample, CalibrateOptions::stop), thrown away, and tried again at the next moment the
// engine has been idle for idle_seconds.
//
// Only a profile at a default path is kept: a user-named one (--kv-profile) is used as given,
// as ObtainProfile does (it may be shared, or kept for comparison).
//
// Thread-safety: every method is the step loop's; the worker only reads the model, runs the
// measurement and reports through an atomic and the wake hook.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvl/calibration.h"
#include "kvl/kv_price_feedback.h"
#include "kvl/profile_corrections.h"
#include "kvl/status.h"

namespace kvl {

// The key names a profile file records corrections under: the action's (KvActionName), "redis"
// for the KV store's Redis tier (kvl/kv_pager.h's FeedbackKey), "recompute-residual-in-step" for
// rebuilds inside decode steps (kInStepRebuildFeedbackKey).
std::string FeedbackKeyName(size_t key);

struct ProfileKeeperOptions {
  std::string path;  // the profile's file (a default path)
  double drift_bound = kDefaultProfileDriftBound;  // --kv-profile-drift; 0: never for a drift
  // Corrections are written back at most this often while they change (and at stop).
  double write_back_seconds = 30;
  // kvl serve: the machine is measured again at an idle moment. Otherwise (kvl run, a test
  // driving Step) at the next start.
  bool measure_when_idle = false;
  // How long the engine must have been idle before a measurement starts (a client sending
  // requests back to back leaves gaps shorter than this).
  double idle_seconds = 1;
  // After a measurement found the machine still busy, or measured it busy again: wait this long.
  double busy_retry_seconds = 60;
  FILE* messages = stderr;  // nullptr: silent
};

// What the keeper needs of the engine.
struct ProfileKeeperHooks {
  const BringBackFeedback* feedback = nullptr;  // KvMemoryView::corrections(); null: none measured
  std::function<void(size_t key, double scale)> seed;  // KvMemory::SeedCorrection
  // Measures the machine (Calibrate on a pool of its own), stopping when `stop` is set; runs on
  // the worker thread.
  std::function<StatusOr<MachineProfile>(const std::atomic<bool>& stop)> measure;
  // The share of the CPU others take now (MeasureOthersCpuShare); runs on the worker thread.
  std::function<std::optional<double>()> others_cpu_share;
  // Prices the engine from a new profile (KvMemory::Reprice); the step loop's thread.
  std::function<Status(const MachineProfile& profile)> apply;
  // Wakes the idle step loop (Inbox::Wake): the worker calls it when it is done.
  std::function<void()> wake;
};

class ProfileKeeper {
 public:
  // `profile` is the one the engine prices with, loaded from or saved to options.path. Its
  // saved corrections seed the feedback at once.
  ProfileKeeper(ProfileKeeperOptions options, ProfileKeeperHooks hooks, MachineProfile profile);
  ~ProfileKeeper();  // stops and joins a measurement still running
  ProfileKeeper(const ProfileKeeper&) = delete;
  ProfileKeeper& operator=(const ProfileKeeper&) = delete;

  const MachineProfile& profile() const { return profile_; }
  // The corrections as they would be written now: the profile's, with this run's measured keys
  // replaced (their events added to the saved ones).
  std::vector<PriceCorrection> Corrections() const;

  // kvl serve (Engine::Start): measurements the profile needs are taken at idle moments from now
  // on, instead of at the next start. Called before the first step.
  void EnableIdleMeasuring();
  // After each step: writes the corrections back when write_back_seconds passed and they
  // changed, and notes a drift (once).
  void AfterStep();
  // The step loop has work: a measurement running is told to stop.
  void WorkArrived();
  // How long the idle loop should wait for work before calling AtIdle; nullopt: nothing to do
  // while idle (the loop sleeps until woken).
  std::optional<std::chrono::duration<double>> IdleWorkIn() const;
  // The engine has been idle for IdleWorkIn: a finished measurement is taken (saved and priced
  // with, or thrown away), a needed one is started, and changed corrections are written back.
  void AtIdle();
  // The engine stops: a running measurement is stopped; the corrections (and, for a drift not
  // yet measured, the reason the next start measures again) are written back.
  void AtStop();

  struct Counts {
    int64_t started = 0;    // measurements started while idle
    int64_t finished = 0;   // ... that replaced the profile
    int64_t abandoned = 0;  // ... stopped by a request, or thrown away (busy again, failed)
    bool running = false;
  };
  Counts counts() const;

 private:
  enum class Need { kNone, kDrift, kBusy };
  void NoteDrift();
  void WriteBack(bool force);
  void StartMeasuring();
  void TakeMeasurement();
  int64_t EventsSeen() const;
  template <typename... Args>
  void Say(fmt::format_string<Args...> format, Args&&... args);

  ProfileKeeperOptions options_;
  ProfileKeeperHooks hooks_;
  MachineProfile profile_;
  std::string remeasure_reason_;  // written back: the next start measures again (kvl run)
  Need need_ = Need::kNone;
  std::string need_reason_;       // why the pending measurement is needed
  std::string drift_reason_;      // DriftReason of the drift noted (Need::kDrift)
  bool drift_noted_ = false;
  bool announced_ = false;        // the measurement needed was announced (once, not per try)
  int64_t events_written_ = -1;   // EventsSeen at the last write-back
  std::string reason_written_;    // remeasure_reason_ at the last write-back
  std::chrono::steady_clock::time_point last_write_;
  std::chrono::steady_clock::time_point retry_after_;

  std::thread worker_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> running_{false};
  std::chrono::steady_clock::time_point measure_start_;
  std::optional<StatusOr<MachineProfile>> result_;  // the worker's, read after done_
  bool measured_busy_machine_ = false;              // the worker found others busy: not measured
  // Measurements that came out busy themselves (the load began while measuring); at
  // kMaxBusyResults the keeper stops trying for this run.
  static constexpr int kMaxBusyResults = 3;
  int busy_results_ = 0;
  std::atomic<int64_t> started_{0}, finished_{0}, abandoned_{0};
};

}  // namespace kvl
