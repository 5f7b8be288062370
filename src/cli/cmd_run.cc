// kvl run: stream generated text to stdout, timings to stderr (as llama.cpp does). With -np N,
// N sequences are generated at once by the continuous-batching engine, each printed when done.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "cli.h"
#include "kvl/user_file.h"
#include "options.h"

namespace kvl::cli {
namespace {

void PrintTiming(const char* what, double ms, int64_t n) {
  fmt::print(stderr,
             "kvl: {:>16} = {:10.2f} ms / {:5} tokens ({:8.2f} ms per token, {:8.2f} tokens per "
             "second)\n",
             what, ms, n, n > 0 ? ms / n : 0.0, ms > 0 ? 1000.0 * n / ms : 0.0);
}

// A prompt file is read whole; anything this large is not a prompt.
constexpr int64_t kMaxPromptFileBytes = 64ll << 20;

StatusOr<std::vector<std::string>> LoadPrompts(const RunArgs& args) {
  if (args.prompt_file.empty()) {
    if (args.prompts.empty()) return std::vector<std::string>{kDefaultPrompt};
    return args.prompts;
  }
  // The one door for user-named files: a directory or a FIFO is an error, not an empty prompt.
  KVL_ASSIGN_OR_RETURN(const std::string contents,
                       ReadUserFile(args.prompt_file, "prompt file", kMaxPromptFileBytes));
  std::istringstream text(contents);
  if (args.parallel <= 1) return std::vector<std::string>{contents};
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(text, line)) {
    if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) return InvalidArgumentError(fmt::format("'{}' holds no prompt", args.prompt_file));
  return prompts;
}

// What the KV action lattice did over the run, in a few lines, printed only when it acted: per
// action the pages and bytes it moved and what bringing them back was predicted to cost vs what it
// cost; then the pool's peak and how much streaming attention waited for.
void PrintKvTiers(const EngineMetrics& m) {
  for (const KvTierMetrics& t : m.kv_tiers) {
    fmt::print(stderr,
               "kvl: kv tier {:<11} {} of {} in {} pages; lookups {}, hits {} pages ({} tokens), "
               "promoted {} (predicted {:.2f} ms, measured {:.2f} ms), read in place {}; in {} pages {}, "
               "out {} "
               "pages {}; evictions {}, checksum failures {}, errors {}\n",
               t.name, FormatBytes(t.bytes_used),
               t.capacity_bytes > 0 ? FormatBytes(t.capacity_bytes) : std::string("unbounded"),
               t.pages,
               t.lookups, t.hit_blocks, t.hit_tokens, t.blocks_promoted, t.promote_ms_predicted,
               t.promote_ms_measured, t.blocks_in_place, t.pages_in, FormatBytes(t.bytes_in), t.pages_out,
               FormatBytes(t.bytes_out), t.evictions, t.checksum_failures, t.errors);
  }
}

// The cost model checked: per action that brought pages back (and per tier promoted from), the
// absolute error of its bring-back prediction over the last 4096 pages.
void PrintKvPredictionErrors(const EngineMetrics& m) {
  auto line = [](std::string_view what, const KvPredictionError& e) {
    if (e.samples == 0) return;
    fmt::print(stderr,
               "kvl: kv prediction {:<24} n {:6}, error median {:7.1f}%, p90 {:7.1f}% (measured / "
               "predicted, median: {:.2f})\n",
               what, e.samples, e.median_pct, e.p90_pct, e.median_ratio);
  };
  for (int a = 0; a < kNumKvActions; ++a) {
    line(KvActionName(static_cast<KvAction>(a)), m.kv_actions[static_cast<size_t>(a)].error);
  }
  line("recompute-residual in step", m.kv_rebuilt_in_step.error);
  for (const KvTierMetrics& t : m.kv_tiers) line("promote from " + t.name, t.promote_error);
}

// Speculative decoding (issue 26): what the drafts did. Plain steps count as sequence steps too
// (tokens per step is over all of them), so spec_seq_steps alone does not say spec was on.
void PrintSpecSummary(const EngineMetrics& m, bool spec_on) {
  if (!spec_on || m.spec_seq_steps == 0) return;
  fmt::print(stderr,
             "kvl: spec: {} drafted, {} accepted ({:.1f}% acceptance), {:.2f} tokens per "
             "sequence step ({} of {} steps carried a draft)\n",
             m.spec_drafted, m.spec_accepted,
             m.spec_drafted > 0 ? 100.0 * static_cast<double>(m.spec_accepted) /
                                      static_cast<double>(m.spec_drafted)
                                : 0.0,
             static_cast<double>(m.tokens_generated) / static_cast<double>(m.spec_seq_steps),
             m.spec_draft_steps, m.spec_seq_steps);
}

void PrintKvSummary(const EngineMetrics& m, bool spec_on) {
  // The budget's bound (kvl/kv_budget.h): what the process holds beyond the weights and the
  // fixed part, against the budget.
  fmt::print(stderr,
             "kvl: memory: RSS beyond the weights {} (fixed {}, KV held {}) against a KV budget "
             "of {}\n",
             FormatBytes(m.rss_minus_weights_bytes), FormatBytes(m.kv_fixed_bytes),
             FormatBytes(m.kv_held_bytes), FormatBytes(m.kv_budget_bytes));
  PrintSpecSummary(m, spec_on);
  PrintKvTiers(m);
  if (m.kv_window_ring_bytes > 0) {
    fmt::print(stderr,
               "kvl: kv sliding-window layers: the pool keeps the global layers, rings of one "
               "window per sequence keep the local ones ({}); {} cached prefixes had their window "
               "rebuilt ({} from checkpoints, {} from {} tokens)\n",
               FormatBytes(m.kv_window_ring_bytes),
               m.kv_window_rebuilds_from_residuals + m.kv_window_rebuilds_from_tokens,
               m.kv_window_rebuilds_from_residuals, m.kv_window_rebuilds_from_tokens,
               m.kv_window_tokens_rebuilt);
  }
  bool acted = false;
  for (const KvActionCounter& c : m.kv_actions) acted |= c.pages > 0;
  if (!acted) return PrintKvPredictionErrors(m);  // pages promoted from the store, if any
  constexpr double kMiB = 1024.0 * 1024.0;
  for (int a = 0; a < kNumKvActions; ++a) {
    const KvActionCounter& c = m.kv_actions[static_cast<size_t>(a)];
    if (c.pages == 0) continue;
    fmt::print(stderr,
               "kvl: kv {:<18} {:6} pages {:8.2f} MiB, {:6} restored: predicted {:.2f} ms, "
               "measured {:.2f} ms\n",
               KvActionName(static_cast<KvAction>(a)), c.pages, c.bytes / kMiB, c.pages_restored,
               c.predicted_ms, c.measured_ms);
  }
  const KvActionCounter& in_step = m.kv_rebuilt_in_step;
  if (in_step.pages_restored > 0) {
    // Pages kept as checkpoints come back at every decode step that reads them, inside it.
    fmt::print(stderr,
               "kvl: kv recompute-residual in step: {} restored in decode steps (a page each step "
               "it is read): predicted {:.2f} ms, measured {:.2f} ms (the steps' time less their "
               "calibrated time without the rows)\n",
               in_step.pages_restored, in_step.predicted_ms, in_step.measured_ms);
  }
  PrintKvPredictionErrors(m);
  fmt::print(stderr,
             "kvl: kv resident peak {} of {} (pool {} of {}, buffers for pages leaving it {}); {} "
             "layer pages streamed back, {:.2f} ms waited; {} rebuilt from checkpoints inside the steps "
             "({} run whole between checkpoints every {} layers); pages rebuilt on their own "
             "(restores) {:.2f} ms\n",
             FormatBytes(m.kv_resident_bytes_peak),
             FormatBytes(m.kv.kv_bytes_total + m.kv_stream_staging_bytes + m.kv_window_ring_bytes),
             FormatBytes(m.kv.kv_bytes_peak), FormatBytes(m.kv.kv_bytes_total),
             FormatBytes(m.kv_stream_staging_bytes), m.kv_layers_streamed, m.kv_stream_wait_ms,
             m.kv_layers_rebuilt, m.kv_layers_advanced, m.kv_checkpoint_every, m.kv_rebuild_ms);
  if (m.kv_pages_promoted_back > 0) {
    fmt::print(stderr,
               "kvl: kv {} pages of running sequences brought back into the pool once it had "
               "blocks to spare\n",
               m.kv_pages_promoted_back);
  }
  // Pages are held outside the pool only while their sequence runs, so after a finished run these
  // are zero; they show when a run ended with sequences still holding them.
  if (m.kv_pages_compressed + m.kv_pages_streamed + m.kv_pages_evicted > 0) {
    fmt::print(stderr, "kvl: kv now: {} pages compressed ({}), {} streamed, {} evicted\n",
               m.kv_pages_compressed, FormatBytes(m.kv_compressed_bytes), m.kv_pages_streamed,
               m.kv_pages_evicted);
  }
  if (m.kv_checksum_failures > 0) {
    fmt::print(stderr,
               "kvl: {} reads from a tier failed their checksum or I/O; {} pages were recomputed "
               "from their tokens instead\n",
               m.kv_checksum_failures, m.kv_pages_recomputed_after_failure);
  }
}

// One prompt, streamed token by token.
int RunOne(Engine& e, const RunArgs& args, const std::string& prompt) {
  GenerateRequest request;
  request.prompt = prompt;
  request.add_bos = !args.no_bos;
  request.max_new_tokens = args.num_predict;
  request.sampling = args.sampling;
  request.stop_strings = args.stop;
  // The prompt is echoed (as llama.cpp does) so the output reads as one text; it is printed with
  // the first token, so a request that fails validation prints only its error.
  bool echoed = false;
  auto echo = [&] {
    if (echoed) return;
    echoed = true;
    std::fputs(prompt.c_str(), stdout);
  };
  // -n 0 evaluates the prompt and prints no token (the engine samples none).
  int64_t printed = 0;
  bool delivered = true;
  StatusOr<GenerateResult> result = e.Generate(request, [&](int32_t, std::string_view piece) {
    if (args.num_predict >= 0 && printed >= args.num_predict) return false;
    ++printed;
    echo();
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    // Output that cannot be delivered (a closed pipe, a full disk) ends the generation.
    delivered = FlushStdout().ok();
    return delivered;
  });
  if (!result.ok()) {
    fmt::print(stderr, "kvl: {}\n", result.status().ToString());
    return 1;
  }
  if (!delivered) return 1;  // Main reports the write error
  echo();
  std::fputc('\n', stdout);
  const GenerateStats& st = result->stats;
  PrintTiming("prompt eval time", st.prompt_ms, st.prompt_tokens - st.cached_prompt_tokens);
  PrintTiming("eval time", st.generate_ms, st.generated_tokens > 0 ? st.generated_tokens - 1 : 0);
  fmt::print(stderr, "kvl: stop reason: {}\n", result->stop_reason);
  PrintKvSummary(e.Metrics(), args.engine.spec != "off");
  return 0;
}

// -np sequences at once; each printed whole when it finishes.
int RunParallel(Engine& e, const RunArgs& args, const std::vector<std::string>& prompts) {
  struct Output {
    std::string prompt;
    std::string text;
    TokenEvent last;
  };
  const int n = args.parallel;
  std::vector<Output> outputs(static_cast<size_t>(n));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    Output& out = outputs[static_cast<size_t>(i)];
    out.prompt = prompts[static_cast<size_t>(i) % prompts.size()];
    Request r;
    r.prompt = out.prompt;
    r.add_bos = !args.no_bos;
    r.max_new_tokens = args.num_predict;
    r.sampling = args.sampling;
    r.sampling.seed = args.sampling.seed + static_cast<uint64_t>(i);  // distinct streams
    r.stop_strings = args.stop;
    const bool print_tokens = args.num_predict != 0;  // -n 0: the prompt only
    StatusOr<RequestId> id = e.Submit(std::move(r), [&out, i, print_tokens](const TokenEvent& ev) {
      if (print_tokens) out.text += ev.text;
      if (!ev.finished) return;
      out.last = ev;
      fmt::print("--- sequence {} ({} prompt tokens, {} from cache, {} generated, {}) ---\n{}{}\n",
                 i, ev.prompt_tokens, ev.cached_prompt_tokens, ev.generated_tokens,
                 ev.finish_reason, out.prompt, out.text);
      (void)FlushStdout();  // a failure is reported when the command ends
    });
    if (!id.ok()) {
      fmt::print(stderr, "kvl: sequence {}: {}\n", i, id.status().ToString());
      return 1;
    }
  }
  e.RunUntilIdle();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  int failures = 0;
  for (const Output& out : outputs) {
    if (out.last.finish_reason == "error") {
      fmt::print(stderr, "kvl: {}\n", out.last.error.ToString());
      ++failures;
    }
  }
  const EngineMetrics m = e.Metrics();
  fmt::print(stderr, "kvl: {} sequences, {} tokens generated in {:.2f} ms ({:.2f} tokens per second in all)\n",
             n, m.tokens_generated, ms, ms > 0 ? 1000.0 * m.tokens_generated / ms : 0.0);
  fmt::print(stderr,
             "kvl: {} steps, {:.1f} tokens and {:.1f} sequences per step; TTFT mean {:.2f} ms, "
             "inter-token mean {:.2f} ms (p99 {:.2f}); prefix hits {} of {} tokens; {} preemptions; "
             "KV {} blocks of which {} cached\n",
             m.steps, m.mean_batch_tokens, m.mean_batch_seqs, m.ttft_mean_ms, m.itl_mean_ms,
             m.itl_p99_ms, m.kv.prefix_hit_tokens, m.kv.prefix_query_tokens, m.preemptions,
             m.kv.blocks_total, m.kv.blocks_cached);
  PrintKvSummary(m, args.engine.spec != "off");
  return failures ? 1 : 0;
}

}  // namespace

int RunCommand(const RunArgs& args) {
  StatusOr<EngineOptions> options = RunEngineOptions(args);  // validated when parsed; cheap
  if (!options.ok()) {
    fmt::print(stderr, "kvl: {}\n", options.status().message());
    return 1;
  }
  StatusOr<std::vector<std::string>> prompts = LoadPrompts(args);
  if (!prompts.ok()) {
    fmt::print(stderr, "kvl: {}\n", prompts.status().message());
    return 1;
  }
  StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*options);
  if (!engine.ok()) {
    fmt::print(stderr, "kvl: {}\n", engine.status().ToString());
    return 1;
  }
  Engine& e = **engine;
  const ModelConfig& c = e.model().config();
  const KvStats kv = e.kv_manager().stats();
  fmt::print(stderr,
             "kvl: model {} ({}, {}, {} layers, dim {}), {} threads, {} kernels, ctx {}, KV {} in "
             "{} blocks of {} tokens\n",
             c.name, e.model().weight_type_name(), FormatParams(e.model().num_parameters()),
             c.num_layers, c.dim, e.num_threads(), ops::KernelsName(e.isa()), e.context_length(),
             FormatBytes(kv.kv_bytes_total), kv.blocks_total, options->block_tokens);
  {
    // The one budget's split, and the fixed part measured at start (EngineMetrics).
    const EngineMetrics m = e.Metrics();
    const KvBudgetSplit& b = m.kv_budget_split;
    fmt::print(stderr,
               "kvl: KV budget {} ({}): pool {} / ram tier {}{} / staging {} / rings {} / "
               "index {} / draft {} / fixed {} (beside the budget)\n",
               FormatBytes(b.budget_bytes), b.given ? "--kv-budget" : "default",
               FormatBytes(b.pool_bytes), FormatBytes(b.ram_tier_bytes),
               b.ram_tier_auto ? " (auto)" : "", FormatBytes(b.staging_bytes),
               FormatBytes(b.ring_bytes), FormatBytes(b.index_bytes), FormatBytes(b.draft_bytes),
               FormatBytes(m.kv_fixed_bytes));
  }
  if (c.context_length > 0 && e.context_length() > c.context_length) {
    fmt::print(stderr,
               "kvl: warning: context {} (-c) is beyond the {} tokens {} was trained on; output "
               "past that is unreliable\n",
               e.context_length(), c.context_length, c.name);
  }
  if (args.parallel == 1) return RunOne(e, args, prompts->front());
  return RunParallel(e, args, *prompts);
}

}  // namespace kvl::cli
