// kvl bench replay TRACE: a page-access trace written by --kv-trace, replayed with no model
// through resident sets of N pages under the engine's reuse forecast, LRU, LFU and Belady's optimal
// (kvl/kv_trace_replay.h), each miss priced as bringing one page back; and the engine's own
// recorded decisions, priced the same way, at the engine's pool size. A table (or JSON) per
// capacity: misses, cost, and the regret against the optimal. Then the same reads through the
// engine's own KV manager (ReplayKvTraceThroughManager): its prefix cache reusing idle cached
// blocks in the forecast's order and least recently freed first, against LRU and Belady.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "kvl/kv_trace_replay.h"

namespace kvl::cli {
namespace {

using nlohmann::json;

// The price of one miss and where it came from: --miss-ms, --miss-action's price in the trace, or
// the trace's cheapest lossless way back (promoting from a tier, rebuilding, recomputing).
struct MissPrice {
  double ms = 1;
  std::string source;
};

StatusOr<MissPrice> ChooseMissPrice(const BenchReplayArgs& args, const KvTraceHeader& h) {
  if (args.miss_ms > 0) return MissPrice{args.miss_ms, "--miss-ms"};
  if (!args.miss_action.empty()) {
    KVL_ASSIGN_OR_RETURN(const KvPolicyChoice choice, ParseKvPolicy(args.miss_action));
    const double price = h.price_ms[static_cast<size_t>(choice.fixed)];
    if (price <= 0) {
      return InvalidArgumentError(fmt::format("--miss-action {}: the trace has no price for it",
                                              KvActionName(choice.fixed)));
    }
    return MissPrice{price, fmt::format("the trace's {} price", KvActionName(choice.fixed))};
  }
  MissPrice best{0, ""};
  for (KvAction a : {KvAction::kDemoteRam, KvAction::kDemoteDisk, KvAction::kRecomputeResidual,
                     KvAction::kRecomputeTokens}) {
    const double price = h.price_ms[static_cast<size_t>(a)];
    if (price > 0 && (best.ms == 0 || price < best.ms)) {
      best = {price, fmt::format("the trace's cheapest way back, {}", KvActionName(a))};
    }
  }
  if (best.ms == 0) return MissPrice{1, "a named default: the trace has no prices"};
  return best;
}

double Regret(double cost, double optimal) {
  if (optimal > 0) return 100.0 * (cost - optimal) / optimal;
  return cost > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

std::string FormatRegret(double regret) {
  return std::isfinite(regret) ? fmt::format("{:+.1f}%", regret) : std::string("-");
}

// The most blocks the requests of one step hold at once: their listed pages and a partial page
// each. The engine's KV manager keeps running sequences' pages in the pool, so it replays a
// trace only with at least this many.
int64_t RunningBlocksPeak(std::span<const KvTraceAccess> accesses) {
  int64_t peak = 0, in_step = 0;
  for (size_t i = 0; i < accesses.size(); ++i) {
    const bool new_step = i == 0 || accesses[i].step != accesses[i - 1].step;
    if (new_step) in_step = 0;
    const bool new_read = new_step || accesses[i].request != accesses[i - 1].request;
    in_step += 1 + (new_read ? 1 : 0);
    peak = std::max(peak, in_step);
  }
  return peak;
}

}  // namespace

int BenchReplayCommand(const BenchReplayArgs& args) {
  StatusOr<KvTrace> trace = ReadKvTrace(args.trace_path);
  if (!trace.ok()) {
    fmt::print(stderr, "kvl: {}\n", trace.status().message());
    return 1;
  }
  const KvTraceHeader& h = trace->header;
  StatusOr<MissPrice> price = ChooseMissPrice(args, h);
  if (!price.ok()) {
    fmt::print(stderr, "kvl: {}\n", price.status().message());
    return 1;
  }
  std::vector<int64_t> capacities = args.capacity_pages;
  if (capacities.empty()) {
    for (int64_t c : {h.pool_blocks / 2, h.pool_blocks, h.pool_blocks * 2}) {
      if (c > 0) capacities.push_back(c);
    }
    if (capacities.empty()) capacities.push_back(std::max<int64_t>(1, trace->num_pages / 2));
  }
  const std::vector<KvTraceAccess> accesses = KvTraceAccesses(*trace);
  int64_t steps = 0;
  for (const KvTraceEvent& ev : trace->events) steps += ev.kind == KvTraceEvent::Kind::kStep;

  KvReplayOptions options;
  options.miss_ms = price->ms;
  struct Row {
    KvReplayResult result;
    double regret = 0;
  };
  std::vector<Row> rows;
  const KvRecordedResult recorded = ReplayRecordedDecisions(*trace, price->ms);
  double recorded_regret = 0;
  for (int64_t capacity : capacities) {
    options.capacity_pages = capacity;
    const size_t first = rows.size();
    for (KvReplayPolicy p : {KvReplayPolicy::kPolicy, KvReplayPolicy::kLru, KvReplayPolicy::kLfu,
                             KvReplayPolicy::kBelady}) {
      rows.push_back({ReplayKvTrace(*trace, accesses, p, options), 0});
    }
    const double optimal = rows.back().result.cost_ms;
    for (size_t i = first; i < rows.size(); ++i)
      rows[i].regret = Regret(rows[i].result.cost_ms, optimal);
    if (capacity == h.pool_blocks) recorded_regret = Regret(recorded.replay.cost_ms, optimal);
  }
  const bool recorded_comparable =
      std::find(capacities.begin(), capacities.end(), h.pool_blocks) != capacities.end();
  // The engine's pool also holds each running sequence's partial last page, which the trace does
  // not list: Belady's optimal over the pool's remaining blocks is what the engine's own
  // decisions can be held to.
  KvReplayOptions full_pages = options;
  full_pages.capacity_pages = h.pool_blocks;
  full_pages.partial_pages_per_reader = 1;
  const KvReplayResult belady_full =
      h.pool_blocks > 0 ? ReplayKvTrace(*trace, accesses, KvReplayPolicy::kBelady, full_pages)
                        : KvReplayResult{};
  const double recorded_regret_full = Regret(recorded.replay.cost_ms, belady_full.cost_ms);
  // And the forecast on those blocks under the engine's pins (its sinks and recent window, at
  // most a quarter of the pool, as KvPressurePlanner holds them): what is left between it and the
  // recorded row is how the engine carries its choices out (a page that left is read from its
  // tier until its sequence ends).
  KvReplayOptions pinned = full_pages;
  pinned.pinned_sink_blocks = (h.sink_tokens + h.block_tokens - 1) / h.block_tokens;
  pinned.pinned_recent_blocks =
      std::min((h.recent_tokens + h.block_tokens - 1) / h.block_tokens, h.pool_blocks / 4);
  const KvReplayResult policy_pinned =
      h.pool_blocks > 0 ? ReplayKvTrace(*trace, accesses, KvReplayPolicy::kPolicy, pinned)
                        : KvReplayResult{};

  // The same reads through the engine's own KV manager, its idle cached blocks reused in the
  // forecast's order and least recently freed first, against Belady and LRU holding a partial
  // page per running request as the manager does (ReplayKvTraceThroughManager).
  struct EngineRow {
    int64_t capacity = 0;
    KvManagerReplayResult forecast, lrf;
    KvReplayResult lru, belady;
  };
  std::vector<EngineRow> engine_rows;
  // Without --capacity-pages: from the least that holds every step's running requests (where
  // only idle pages compete, as there) to twice that.
  const int64_t peak = RunningBlocksPeak(accesses);
  std::vector<int64_t> engine_capacities = args.capacity_pages;
  if (engine_capacities.empty()) {
    engine_capacities = {peak, peak * 5 / 4, peak * 3 / 2, peak * 2};
    engine_capacities.erase(std::unique(engine_capacities.begin(), engine_capacities.end()),
                            engine_capacities.end());
  }
  for (int64_t capacity : engine_capacities) {
    EngineRow e;
    e.capacity = capacity;
    e.forecast = ReplayKvTraceThroughManager(*trace, accesses, KvIdleBlockOrder::kForecast,
                                             capacity, price->ms);
    e.lrf = ReplayKvTraceThroughManager(*trace, accesses, KvIdleBlockOrder::kLeastRecentlyFreed,
                                        capacity, price->ms);
    KvReplayOptions held = options;
    held.capacity_pages = capacity;
    held.partial_pages_per_reader = 1;
    e.lru = ReplayKvTrace(*trace, accesses, KvReplayPolicy::kLru, held);
    e.belady = ReplayKvTrace(*trace, accesses, KvReplayPolicy::kBelady, held);
    engine_rows.push_back(e);
  }

  if (args.output == "json") {
    json out = {{"trace", args.trace_path},     {"steps", steps},
                {"pages", trace->num_pages},    {"accesses", static_cast<int64_t>(accesses.size())},
                {"pool_blocks", h.pool_blocks}, {"block_tokens", h.block_tokens},
                {"miss_ms", price->ms},         {"miss_price_source", price->source}};
    auto row_json = [](const KvReplayResult& r, double regret) {
      return json{{"policy", r.policy},
                  {"capacity_pages", r.capacity_pages},
                  {"accesses", r.accesses},
                  {"cold", r.cold},
                  {"hits", r.hits},
                  {"misses", r.misses},
                  {"cost_ms", r.cost_ms},
                  {"regret_pct", std::isfinite(regret) ? json(regret) : json(nullptr)}};
    };
    out["results"] = json::array();
    for (const Row& r : rows) out["results"].push_back(row_json(r.result, r.regret));
    json rec = row_json(recorded.replay, recorded_comparable ? recorded_regret : 0);
    if (!recorded_comparable) rec["regret_pct"] = nullptr;
    rec["brought_back"] = recorded.brought_back;
    rec["streamed_reads"] = recorded.streamed_reads;
    rec["recomputed"] = recorded.recomputed;
    rec["lost_reads"] = recorded.lost_reads;
    if (h.pool_blocks > 0) {
      rec["belady_full_pages_misses"] = belady_full.misses;
      rec["belady_full_pages_cost_ms"] = belady_full.cost_ms;
      rec["regret_vs_belady_full_pages_pct"] =
          std::isfinite(recorded_regret_full) ? json(recorded_regret_full) : json(nullptr);
      rec["policy_pinned_misses"] = policy_pinned.misses;
      rec["policy_pinned_cost_ms"] = policy_pinned.cost_ms;
    }
    out["recorded"] = rec;
    out["engine"] = json::array();
    for (const EngineRow& e : engine_rows) {
      auto manager_json = [&](const KvManagerReplayResult& m) {
        json j = row_json(m.replay, Regret(m.replay.cost_ms, e.belady.cost_ms));
        j["fits"] = m.fits;
        j["reuse_reads"] = m.reuse_reads;
        j["reuse_hits"] = m.reuse_hits;
        return j;
      };
      out["engine"].push_back({{"capacity_pages", e.capacity},
                               {"forecast", manager_json(e.forecast)},
                               {"least_recently_freed", manager_json(e.lrf)},
                               {"lru", row_json(e.lru, Regret(e.lru.cost_ms, e.belady.cost_ms))},
                               {"belady", row_json(e.belady, 0)}});
    }
    fmt::print("{}\n", out.dump(2));
    return FlushStdout().ok() ? 0 : 1;
  }
  fmt::print("trace {}: {} steps, {} pages, {} page reads; engine pool {} pages of {} tokens\n",
             args.trace_path, steps, trace->num_pages, accesses.size(), h.pool_blocks,
             h.block_tokens);
  fmt::print("miss price {:.4g} ms a page ({})\n\n", price->ms, price->source);
  fmt::print("| capacity | policy | cold | hits | misses | cost ms | regret vs belady |\n");
  fmt::print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    const KvReplayResult& x = r.result;
    fmt::print("| {} | {} | {} | {} | {} | {:.2f} | {} |\n", x.capacity_pages, x.policy, x.cold,
               x.hits, x.misses, x.cost_ms, FormatRegret(r.regret));
  }
  const KvReplayResult& x = recorded.replay;
  fmt::print("| {} | {} | {} | {} | {} | {:.2f} | {} |\n", x.capacity_pages, x.policy, x.cold,
             x.hits, x.misses, x.cost_ms,
             recorded_comparable ? FormatRegret(recorded_regret) : std::string("-"));
  fmt::print(
      "\nrecorded: what the engine did at its own pool ({} pages, partial pages and compressed "
      "slabs included): {} pages brought back, {} reads from outside the pool (a tier, read in "
      "place or streamed, or checkpoints rebuilt), {} pages computed again after they were seen, "
      "{} reads of evicted pages\n",
      h.pool_blocks, recorded.brought_back, recorded.streamed_reads, recorded.recomputed,
      recorded.lost_reads);
  if (h.pool_blocks > 0) {
    fmt::print(
        "against Belady over the pool less each running sequence's partial page (the blocks the "
        "engine had for listed pages): {} misses, {:.2f} ms; recorded regret {}\n",
        belady_full.misses, belady_full.cost_ms, FormatRegret(recorded_regret_full));
    fmt::print(
        "the forecast on those blocks, never choosing the engine's sinks ({} page) and recent "
        "window ({} pages): {} misses, {:.2f} ms, regret {}\n",
        pinned.pinned_sink_blocks, pinned.pinned_recent_blocks, policy_pinned.misses,
        policy_pinned.cost_ms, FormatRegret(Regret(policy_pinned.cost_ms, belady_full.cost_ms)));
  }
  fmt::print(
      "\nthrough the engine's KV manager (its prefix cache; idle cached blocks reused in the "
      "forecast's order, or least recently freed first), against LRU and Belady holding one "
      "partial page per running request as the manager does; regret = misses over Belady's; "
      "reuse: the reads at an admission of pages seen before, and how many found their page; the "
      "step with the most running requests holds {} blocks\n\n",
      peak);
  fmt::print(
      "| capacity | engine hits | engine misses | regret | reuse hits / reads | engine LRF hits | "
      "LRF misses | LRF regret | LRU hits | LRU misses | Belady hits | Belady misses |\n");
  fmt::print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const EngineRow& e : engine_rows) {
    auto cell = [&](const KvManagerReplayResult& m, int64_t value) {
      return m.fits ? fmt::format("{}", value) : std::string("-");
    };
    auto regret = [&](const KvManagerReplayResult& m) {
      return m.fits ? FormatRegret(Regret(m.replay.cost_ms, e.belady.cost_ms)) : std::string("-");
    };
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", e.capacity,
               cell(e.forecast, e.forecast.replay.hits), cell(e.forecast, e.forecast.replay.misses),
               regret(e.forecast),
               e.forecast.fits
                   ? fmt::format("{} / {}", e.forecast.reuse_hits, e.forecast.reuse_reads)
                   : std::string("-"),
               cell(e.lrf, e.lrf.replay.hits), cell(e.lrf, e.lrf.replay.misses), regret(e.lrf),
               e.lru.hits, e.lru.misses, e.belady.hits, e.belady.misses);
  }
  if (std::any_of(engine_rows.begin(), engine_rows.end(),
                  [](const EngineRow& e) { return !e.forecast.fits; })) {
    fmt::print("-: the running requests of some step need more blocks than that capacity (the "
               "engine would page or preempt them)\n");
  }
  return FlushStdout().ok() ? 0 : 1;
}

}  // namespace kvl::cli
