// The engine: a model, its tokenizer, the kernels' context, a KV cache and the forward pass, put
// together to turn a prompt into generated text. This is the public API the CLI (and later the
// server) builds on.
//
// Thread-safety: one Generate at a time per Engine (the continuous-batching scheduler that serves
// many requests at once is the next step).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/forward.h"
#include "kvl/kv_cache.h"
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/sampling.h"
#include "kvl/status.h"
#include "kvl/thread_pool.h"
#include "kvl/tokenizer.h"

namespace kvl {

struct EngineOptions {
  std::string model_path;
  int num_threads = 0;          // 0: every core
  int64_t context_length = 0;   // 0: the model's, capped at 4096
  int64_t batch_size = 512;     // prompt tokens per forward step (-b)
  std::string isa = "auto";     // auto | avx512 | avx2 | scalar
};

struct GenerateRequest {
  std::string prompt;                 // used when prompt_ids is empty
  std::vector<int32_t> prompt_ids;    // token ids, taken as they are (no BOS added)
  bool add_bos = true;                // for a text prompt
  int32_t max_new_tokens = 128;       // < 0: until EOS or the context is full
  SamplingParams sampling;
  bool stop_at_eos = true;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  double prompt_ms = 0;
  int64_t generated_tokens = 0;
  double generate_ms = 0;  // from the first generated token to the last
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::string text;           // the generated text only
  std::string stop_reason;    // "eos" | "length" | "context" | "callback"
  GenerateStats stats;
};

// Called once per generated token with its id and printable text; return false to stop.
using TokenCallback = std::function<bool(int32_t id, std::string_view piece)>;

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                    const TokenCallback& on_token = {});

  // Runs `ids` through the model as sequence 0 starting at `start_pos`, in chunks of the batch
  // size, and returns the logits of the last token (valid until the next call). For benchmarks and
  // tests of the forward pass.
  StatusOr<const float*> Evaluate(std::span<const int32_t> ids, int64_t start_pos);

  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const EngineOptions& options() const { return options_; }
  int64_t context_length() const { return context_length_; }
  ops::Isa isa() const { return ops_->isa(); }
  int num_threads() const { return pool_->num_threads(); }

 private:
  Engine() = default;

  EngineOptions options_;
  int64_t context_length_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ops::OpsContext> ops_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ContiguousKvCache> kv_;
  std::unique_ptr<Forward> forward_;
  TokenBatch batch_;
};

}  // namespace kvl
