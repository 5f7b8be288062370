// `kvl serve`: the OpenAI-compatible server (src/server) on the flags ParseCommandLine checked,
// with vLLM's KV events published (src/events) when --kv-events asks.
#include <fmt/format.h>

#include <memory>

#include "cli.h"
#include "kvl/kv_events.h"

namespace kvl::cli {

namespace {

// The publisher the engine tells of its prefix index's changes, and the server's view of it.
StatusOr<std::unique_ptr<KvEventPublisher>> StartKvEvents(const ServeArgs& args,
                                                          ServeOptions* serve) {
  KvEventOptions options;
  options.endpoint = args.kv_events;
  options.replay_endpoint = args.kv_events_replay;
  options.topic = args.kv_events_topic;
  options.block_size = serve->engine.block_tokens;
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvEventPublisher> publisher,
                       KvEventPublisher::Create(options));
  const KvEventPublisher* p = publisher.get();
  serve->engine.kv_block_observer = publisher.get();
  serve->kv_events = [p] {
    KvIndexState state = p->IndexState();
    const KvEventCounts counts = p->counts();
    KvEventsReport report;
    report.medium = p->options().pool_medium;
    report.block_size = p->options().block_size;
    report.hashes = std::move(state.hashes);
    report.events_through = state.events_through;
    report.events_queued = counts.events_queued;
    report.events_dropped = counts.events_dropped;
    report.batches_sent = counts.batches_sent;
    report.replays_served = counts.replays_served;
    return report;
  };
  return publisher;
}

}  // namespace

int ServeCommand(const ServeArgs& args) {
  ServeOptions serve = args.serve;
  std::unique_ptr<KvEventPublisher> publisher;  // outlives the engine Serve makes
  if (!args.kv_events.empty()) {
    StatusOr<std::unique_ptr<KvEventPublisher>> started = StartKvEvents(args, &serve);
    if (!started.ok()) {
      fmt::print(stderr, "kvl: {}\n", started.status().ToString());
      return 1;
    }
    publisher = std::move(*started);
  }
  if (const Status s = Serve(serve); !s.ok()) {
    fmt::print(stderr, "kvl: {}\n", s.ToString());
    return 1;
  }
  return 0;
}

}  // namespace kvl::cli
