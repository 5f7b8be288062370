// Engine lifecycle and public API: creation, request validation and submission, the loops that
// drive Step, metrics and the one-request Generate convenience.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <thread>

#include "engine_impl.h"
#include "kvl/cost_profile.h"

namespace kvl {
namespace {

StatusOr<ops::Isa> ChooseIsa(const std::string& name) {
  const ops::Isa best = ops::BestIsa();
  if (name == "auto") return best;
  for (ops::Isa isa : ops::RunnableIsas()) {
    if (ops::IsaName(isa) == name) return isa;
  }
  return InvalidArgumentError(fmt::format(
      "ISA '{}' is not available on this CPU/build (best here: {})", name, ops::IsaName(best)));
}

// Seeds the prefix cache's hash chain so blocks never match across different models.
uint64_t ModelIdentity(const Model& model) {
  uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(model.file().file_size());
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0x100000001b3ull;
  };
  for (const GgufTensorInfo& t : model.file().tensors()) {
    for (char c : t.name) mix(static_cast<uint8_t>(c));
    mix(static_cast<uint64_t>(t.type));
    mix(t.offset);
    // A few bytes of every tensor: two files of the same shape with different weights differ.
    if (t.num_bytes >= 8) {
      uint64_t v;
      __builtin_memcpy(&v, t.data, 8);
      mix(v);
    }
  }
  return h;
}

}  // namespace

std::string StopTextFilter::Push(std::string_view piece, bool* stopped) {
  *stopped = false;
  pending_.append(piece);
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    if (stop.empty()) continue;
    const size_t at = pending_.find(stop);
    if (at != std::string::npos) {
      *stopped = true;
      std::string out = pending_.substr(0, at);
      pending_.clear();
      return out;
    }
    // Hold back the longest tail of pending_ that is a prefix of this stop string.
    for (size_t len = std::min(stop.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopTextFilter::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

void SampleWindow::Add(double v) {
  if (values_.size() < kCapacity) {
    values_.push_back(v);
  } else {
    values_[next_] = v;
    next_ = (next_ + 1) % kCapacity;
  }
}

double SampleWindow::Mean() const {
  if (values_.empty()) return 0;
  double sum = 0;
  for (double v : values_) sum += v;
  return sum / static_cast<double>(values_.size());
}

double SampleWindow::Percentile(double p) const {
  if (values_.empty()) return 0;
  std::vector<double> sorted = values_;
  std::sort(sorted.begin(), sorted.end());
  const size_t index = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

// --kv-policy, --kv-quality and --kv-tier, parsed once before the pool's layout is decided.
Status Engine::Impl::ParseKvSettings() {
  KVL_ASSIGN_OR_RETURN(policy, ParseKvPolicy(options.kv_policy));
  KVL_ASSIGN_OR_RETURN(quality, ParseKvQuality(options.kv_quality));
  for (const std::string& text : options.kv_tiers) {
    KVL_ASSIGN_OR_RETURN(TierSpec spec, ParseTierSpec(text));
    tier_specs.push_back(std::move(spec));
  }
  return Status::Ok();
}

// Residual checkpoints cost memory in every block (d_model per token per layer), so they are kept
// only where recompute-from-residual can be chosen: asked for, or (auto with a RAM tier to hold
// them) where they are no larger than the K+V they stand for (MHA; not GQA).
bool Engine::Impl::KeepsResidualCheckpoints() const {
  const ModelConfig& c = model->config();
  const bool ram = std::any_of(tier_specs.begin(), tier_specs.end(),
                               [](const TierSpec& t) { return t.kind == "ram"; });
  if (!policy.automatic) return policy.fixed == KvAction::kRecomputeResidual;
  return ram && c.dim <= 2 * c.kv_dim();
}

// Tiers and the per-page costs the policy prices actions with. The costs come from the
// calibration profile of this model on this machine; without one, a quick calibration runs now
// and is saved for the next start.
Status Engine::Impl::SetUpKvActions(const KvBlockLayout& layout) {
  sink_tokens = std::max<int64_t>(0, options.kv_sink_tokens);
  recent_tokens = std::max<int64_t>(0, options.kv_recent_tokens);
  if (!policy.automatic && !IsLossless(policy.fixed) && quality == KvQuality::kLossless) {
    // A fixed lossy policy says what it wants; the quality preset only steers `auto`.
    quality = KvQuality::kAggressive;
  }
  std::string disk_dir;
  for (const TierSpec& spec : tier_specs) {
    // Tier pages are one layer of K and V (KvPager), so a step streams exactly one layer.
    const int64_t page_bytes = pager->layer_page_bytes();
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> tier, MakeTier(spec, page_bytes));
    (spec.kind == "disk" ? disk_tier : ram_tier) = std::move(tier);
    if (spec.kind == "disk") disk_dir = std::filesystem::path(spec.path).parent_path().string();
  }
  if (policy.fixed == KvAction::kDemoteRam && !policy.automatic && !ram_tier) {
    return InvalidArgumentError("--kv-policy demote needs a RAM tier: --kv-tier ram:SIZE");
  }
  if (policy.fixed == KvAction::kDemoteDisk && !policy.automatic && !disk_tier) {
    return InvalidArgumentError("--kv-policy demote-disk needs --kv-tier disk:PATH:SIZE");
  }
  if (policy.fixed == KvAction::kRecomputeResidual && !policy.automatic && !ram_tier) {
    return InvalidArgumentError(
        "--kv-policy recompute-residual keeps the checkpoints in a RAM tier: --kv-tier ram:SIZE");
  }

  page_costs.kv_bytes = layout.kv_bytes();
  page_costs.residual_bytes =
      static_cast<int64_t>(layout.block_tokens) * layout.num_layers * model->config().dim * 4;
  page_costs.has_ram_tier = ram_tier != nullptr;
  page_costs.has_disk_tier = disk_tier != nullptr;
  const bool checkpoints = layout.residual_dim > 0 && ram_tier;
  const CompressedSlabs& slabs = pager->slabs();
  const bool int8 = slabs.slots_per_slab(KvCodecType::kInt8) >= layout.num_layers;
  const bool int4 = slabs.slots_per_slab(KvCodecType::kInt4) >= layout.num_layers;
  if ((policy.fixed == KvAction::kCompressInt8 && !int8) ||
      (policy.fixed == KvAction::kCompressInt4 && !int4)) {
    return InvalidArgumentError(fmt::format(
        "--kv-policy {}: a compressed page of this model does not fit the slabs of one block",
        KvActionName(policy.fixed)));
  }
  page_costs.int8_page_bytes = slabs.slot_bytes(KvCodecType::kInt8) * layout.num_layers;
  page_costs.int4_page_bytes = slabs.slot_bytes(KvCodecType::kInt4) * layout.num_layers;
  page_costs.available_actions =
      (1u << static_cast<int>(KvAction::kKeep)) | (1u << static_cast<int>(KvAction::kEvict)) |
      (int8 ? 1u << static_cast<int>(KvAction::kCompressInt8) : 0u) |
      (int4 ? 1u << static_cast<int>(KvAction::kCompressInt4) : 0u) |
      (1u << static_cast<int>(KvAction::kRecomputeTokens)) |
      (ram_tier ? 1u << static_cast<int>(KvAction::kDemoteRam) : 0u) |
      (disk_tier ? 1u << static_cast<int>(KvAction::kDemoteDisk) : 0u) |
      (checkpoints ? 1u << static_cast<int>(KvAction::kRecomputeResidual) : 0u);
  // Running sequences' pages can be acted on unless the policy is only about preemption (keep,
  // recompute) or nothing is allowed (auto, lossless, with no tier to demote to).
  if (policy.automatic) {
    pages_running_sequences = ram_tier || disk_tier || quality != KvQuality::kLossless;
  } else {
    pages_running_sequences = policy.fixed == KvAction::kRecomputeResidual ||
                              policy.fixed == KvAction::kCompressInt8 ||
                              policy.fixed == KvAction::kCompressInt4 ||
                              policy.fixed == KvAction::kDemoteRam ||
                              policy.fixed == KvAction::kDemoteDisk ||
                              policy.fixed == KvAction::kEvict;
  }
  pager->set_track_attention(pages_running_sequences);
  pager->set_rebuilder([this](int64_t layer, const float* checkpoints, const int64_t* positions,
                              int64_t n, uint8_t* k_out, uint8_t* v_out) {
    const KvBlockLayout& l = storage->layout();
    forward->RebuildLayerKv(layer, checkpoints, positions, n, l.k_type, k_out, l.v_type, v_out);
  });
  // Without a tier only recompute-from-tokens needs a price (to report its prediction); the other
  // policies have nothing to choose among.
  const bool needs_profile = ram_tier || disk_tier ||
                             (!policy.automatic && policy.fixed == KvAction::kRecomputeTokens);
  if (!needs_profile) return Status::Ok();

  ProfileOptions profile_options;
  profile_options.path = options.profile_path;  // empty: the default path
  profile_options.calibrate = options.calibrate;
  profile_options.calibration.disk_dir = disk_dir;  // empty (the temp dir) without a disk tier
  KVL_ASSIGN_OR_RETURN(const MachineProfile profile, ObtainProfile(*model, *ops, profile_options));
  FillPagePrices(profile, layout.block_tokens, &page_costs);
  return Status::Ok();
}

Engine::Engine() : impl_(std::make_unique<Impl>()) {}

Engine::~Engine() { Stop(); }

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.batch_size < 1) return InvalidArgumentError("batch size (-b) must be at least 1");
  if (options.num_threads < 0) return InvalidArgumentError("threads (-t) must be positive");
  if (options.context_length < 0) return InvalidArgumentError("context (-c) must be positive");
  if (options.max_seqs < 1) return InvalidArgumentError("parallel sequences (-np) must be >= 1");
  if (options.block_tokens < 1) return InvalidArgumentError("block size must be >= 1 token");
  if (options.kv_budget_bytes < 0) return InvalidArgumentError("--kv-budget must be positive");
  std::unique_ptr<Engine> engine(new Engine());
  Impl& e = *engine->impl_;
  e.options = options;
  KVL_ASSIGN_OR_RETURN(ops::Isa isa, ChooseIsa(options.isa));
  KVL_ASSIGN_OR_RETURN(e.model, Model::Load(options.model_path));
  KVL_ASSIGN_OR_RETURN(e.tokenizer, Tokenizer::FromGguf(e.model->file()));
  const ModelConfig& c = e.model->config();
  if (e.tokenizer->vocab_size() != c.vocab_size) {
    return DataLossError(fmt::format("{}: the tokenizer has {} tokens but token_embd.weight has {}",
                                     options.model_path, e.tokenizer->vocab_size(), c.vocab_size));
  }
  e.context_length = options.context_length > 0 ? options.context_length
                                                : std::min<int64_t>(c.context_length, 4096);

  int threads = options.num_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  e.pool = std::make_unique<ThreadPool>(threads);
  e.ops = std::make_unique<ops::OpsContext>(isa, e.pool.get());

  KvManagerOptions kvo;
  kvo.layout.block_tokens = options.block_tokens;
  kvo.layout.num_layers = c.num_layers;
  kvo.layout.kv_dim = c.kv_dim();
  KVL_ASSIGN_OR_RETURN(kvo.layout.k_type, ParseKvCacheType(options.cache_type_k));
  KVL_ASSIGN_OR_RETURN(kvo.layout.v_type, ParseKvCacheType(options.cache_type_v));
  KVL_RETURN_IF_ERROR(e.ParseKvSettings());
  if (e.KeepsResidualCheckpoints()) kvo.layout.residual_dim = c.dim;
  kvo.budget_bytes = options.kv_budget_bytes;
  if (kvo.budget_bytes == 0) {
    const int64_t per_context = kvo.layout.block_bytes() *
                                ((e.context_length + options.block_tokens - 1) / options.block_tokens);
    kvo.budget_bytes = std::min<int64_t>(per_context * options.max_seqs, 1ll << 30);
    kvo.budget_bytes = std::max(kvo.budget_bytes, per_context);
  }
  kvo.model_identity = ModelIdentity(*e.model);
  kvo.enable_prefix_cache = options.prefix_cache;
  kvo.max_seqs = options.max_seqs;
  KVL_ASSIGN_OR_RETURN(e.kv, KvManager::Create(kvo));
  KVL_ASSIGN_OR_RETURN(e.storage, KvBlockStorage::Create(kvo.layout, e.kv->num_blocks()));
  e.pager = std::make_unique<KvPager>(*e.kv, *e.storage, options.max_seqs, e.context_length);
  e.cache = std::make_unique<PagedKvCache>(*e.kv, *e.storage, e.pager.get());
  for (SeqId s = options.max_seqs - 1; s >= 0; --s) e.free_slots.push_back(s);

  KVL_RETURN_IF_ERROR(e.SetUpKvActions(kvo.layout));

  ForwardOptions fo;
  fo.max_batch_tokens = std::min(options.batch_size, e.context_length);
  fo.max_logit_rows = options.max_seqs;
  fo.max_context = e.context_length;
  e.forward = std::make_unique<Forward>(*e.model, *e.ops, fo);
  e.batch.tokens.reserve(static_cast<size_t>(fo.max_batch_tokens));
  e.batch.positions.reserve(static_cast<size_t>(fo.max_batch_tokens));
  e.batch.seq_ids.reserve(static_cast<size_t>(fo.max_batch_tokens));
  e.batch.want_logits.reserve(static_cast<size_t>(fo.max_batch_tokens));
  e.UpdateGauges();
  return engine;
}

StatusOr<RequestId> Engine::Submit(Request request, EventCallback on_event) {
  Impl& e = *impl_;
  KVL_RETURN_IF_ERROR(request.sampling.Validate());
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt_ids.empty() ? e.tokenizer->Encode(request.prompt, request.add_bos)
                                           : request.prompt_ids;
  if (seq->tokens.empty()) return InvalidArgumentError("the prompt is empty and no BOS was requested");
  const int64_t vocab = e.model->config().vocab_size;
  for (size_t i = 0; i < seq->tokens.size(); ++i) {
    if (seq->tokens[i] < 0 || seq->tokens[i] >= vocab) {
      return InvalidArgumentError(fmt::format("token id {} at index {} is outside the vocabulary [0, {})",
                                              seq->tokens[i], i, vocab));
    }
  }
  if (static_cast<int64_t>(seq->tokens.size()) >= e.context_length) {
    return OutOfRangeError(fmt::format("the prompt has {} tokens but the context holds {} (-c)",
                                       seq->tokens.size(), e.context_length));
  }
  seq->num_prompt = static_cast<int64_t>(seq->tokens.size());
  seq->tokens.reserve(static_cast<size_t>(e.context_length));
  seq->prev_token = seq->tokens.back();
  seq->sampler = std::make_unique<Sampler>(request.sampling, static_cast<int32_t>(vocab));
  seq->stop_filter = StopTextFilter(request.stop_strings);
  seq->request = std::move(request);
  seq->on_event = std::move(on_event);
  seq->submitted = Clock::now();
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(e.inbox_mutex);
    id = e.next_request_id++;
    seq->id = id;
    e.inbox.push_back(std::move(seq));
    ++e.requests_submitted;
  }
  e.inbox_cv.notify_one();
  return id;
}

void Engine::Cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(impl_->inbox_mutex);
  impl_->cancel_requests.insert(id);
}

bool Engine::Step() { return impl_->StepImpl(); }

void Engine::RunUntilIdle() {
  while (Step()) {
  }
}

void Engine::Start() {
  Impl& e = *impl_;
  if (e.loop_running.exchange(true)) return;
  e.loop = std::thread([&e] {
    while (e.loop_running.load()) {
      if (e.StepImpl()) continue;
      std::unique_lock<std::mutex> lock(e.inbox_mutex);
      e.inbox_cv.wait_for(lock, std::chrono::milliseconds(50), [&e] {
        return !e.inbox.empty() || !e.cancel_requests.empty() || !e.loop_running.load();
      });
    }
  });
}

void Engine::Stop() {
  Impl& e = *impl_;
  if (!e.loop_running.exchange(false)) return;
  e.inbox_cv.notify_all();
  if (e.loop.joinable()) e.loop.join();
}

EngineMetrics Engine::Metrics() const {
  const Impl& e = *impl_;
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(e.inbox_mutex);
    m.requests_submitted = e.requests_submitted;
  }
  std::lock_guard<std::mutex> lock(e.metrics_mutex);
  m.kv = e.kv_stats;
  m.kv_actions = e.action_counters;
  m.kv_checksum_failures = e.checksum_failures;
  m.kv_pages_compressed = e.pager_stats.compressed_pages;
  m.kv_pages_streamed = e.pager_stats.streamed_pages;
  m.kv_pages_evicted = e.pager_stats.evicted_pages;
  m.kv_pages_rebuilt = e.pager_stats.rebuilt_pages;
  m.kv_layers_rebuilt = e.pager_stats.layers_rebuilt;
  m.kv_rebuild_ms = e.pager_stats.rebuild_ms;
  m.kv_compressed_bytes = e.pager_stats.compressed_bytes;
  m.kv_stream_staging_bytes = e.pager_stats.staging_bytes;
  m.kv_layers_streamed = e.pager_stats.layers_streamed;
  m.kv_stream_wait_ms = e.pager_stats.stream_wait_ms;
  m.requests_finished = e.requests_finished;
  m.requests_running = e.num_running;
  m.requests_waiting = e.num_waiting;
  m.preemptions = e.preemptions;
  m.steps = e.num_steps;
  m.tokens_prefilled = e.tokens_prefilled;
  m.tokens_generated = e.tokens_generated;
  m.mean_batch_tokens = e.num_steps ? static_cast<double>(e.batch_tokens_total) / e.num_steps : 0;
  m.mean_batch_seqs = e.num_steps ? static_cast<double>(e.batch_seqs_total) / e.num_steps : 0;
  m.last_batch_tokens = e.last_batch_tokens;
  m.last_batch_seqs = e.last_batch_seqs;
  m.ttft_mean_ms = e.ttft_ms.Mean();
  m.ttft_p50_ms = e.ttft_ms.Percentile(50);
  m.ttft_p99_ms = e.ttft_ms.Percentile(99);
  m.itl_mean_ms = e.itl_ms.Mean();
  m.itl_p50_ms = e.itl_ms.Percentile(50);
  m.itl_p99_ms = e.itl_ms.Percentile(99);
  return m;
}

StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request, const TokenCallback& on_token) {
  GenerateResult result;
  result.prompt_ids = request.prompt_ids.empty()
                          ? impl_->tokenizer->Encode(request.prompt, request.add_bos)
                          : request.prompt_ids;
  Request r;
  r.prompt_ids = result.prompt_ids;  // tokenized once, here
  r.add_bos = request.add_bos;
  r.max_new_tokens = request.max_new_tokens;
  r.sampling = request.sampling;
  r.ignore_eos = !request.stop_at_eos;
  r.stop_strings = request.stop_strings;

  bool stopped_by_callback = false;
  Status error;
  const Clock::time_point start = Clock::now();
  Clock::time_point first = start, last = start;
  RequestId id = 0;
  auto on_event = [&](const TokenEvent& ev) {
    if (ev.token >= 0) {
      last = Clock::now();
      if (result.output_ids.empty()) first = last;
      result.output_ids.push_back(ev.token);
    }
    result.text += ev.text;
    if (ev.token >= 0 && on_token && !stopped_by_callback && !on_token(ev.token, ev.text)) {
      stopped_by_callback = true;
      Cancel(id);
    }
    if (ev.finished) {
      result.stop_reason = stopped_by_callback ? "callback" : ev.finish_reason;
      result.stats.cached_prompt_tokens = ev.cached_prompt_tokens;
      error = ev.error;
      if (ev.token < 0 && !ev.text.empty() && on_token && !stopped_by_callback) on_token(-1, ev.text);
    }
  };
  KVL_ASSIGN_OR_RETURN(id, Submit(std::move(r), on_event));
  RunUntilIdle();
  if (!error.ok()) return error;
  result.stats.prompt_tokens = static_cast<int64_t>(result.prompt_ids.size());
  result.stats.prompt_ms = MillisecondsBetween(start, first);
  result.stats.generated_tokens = static_cast<int64_t>(result.output_ids.size());
  result.stats.generate_ms = MillisecondsBetween(first, last);
  return result;
}

const Model& Engine::model() const { return *impl_->model; }
const Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }
const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::context_length() const { return impl_->context_length; }
ops::Isa Engine::isa() const { return impl_->ops->isa(); }
int Engine::num_threads() const { return impl_->pool->num_threads(); }
const KvManager& Engine::kv_manager() const { return *impl_->kv; }

}  // namespace kvl
