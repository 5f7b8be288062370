// Greedy continuations of token-id prompts by llama.cpp, with the top-1 / top-2 logit gap of every
// step: the goldens of tests/arch/arch_golden_test.cc. Built against llama.cpp's C API by
// make_goldens.sh (never by kvlattice's own build; see that script).
//
//   llama_goldens MODEL.gguf SHAPE/TYPE N_CTX N_GEN ID,ID,...
// prints one C++ initializer {shape, type, {prompt}, {gen}, {gap}}: the greedy ids, and at each
// step the logit of gen[i] minus the runner-up's.
//
// The context is configured as the test runs kvlattice: f32 K/V cache, no flash attention, the
// whole prompt in one batch, then one token per step.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

// llama.cpp's warnings and errors only (a file it refuses says why).
static void Quiet(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL LABEL N_CTX N_GEN ID,ID,...\n", argv[0]);
    return 2;
  }
  const std::string label = argv[2];
  const int n_ctx = std::atoi(argv[3]);
  const int n_gen = std::atoi(argv[4]);
  std::vector<llama_token> prompt;
  std::stringstream ids(argv[5]);
  for (std::string id; std::getline(ids, id, ',');) prompt.push_back(std::atoi(id.c_str()));

  llama_log_set(Quiet, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  // Weights stay in ggml's plain CPU buffers: no repacking, and no AMX kernels (on a VM that
  // reports AMX without granting its tile state they die of SIGILL).
  mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n_ctx;
  cp.n_batch = n_ctx;
  cp.n_ubatch = n_ctx;
  cp.n_threads = 2;
  cp.n_threads_batch = 2;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "cannot create a context for %s\n", argv[1]);
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  std::vector<llama_token> gen;
  std::vector<float> gaps;
  std::vector<llama_token> next = prompt;
  for (int step = 0; step < n_gen; ++step) {
    if (llama_decode(ctx, llama_batch_get_one(next.data(), static_cast<int32_t>(next.size()))) != 0) {
      std::fprintf(stderr, "decode failed at step %d\n", step);
      return 1;
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int i = 1; i < n_vocab; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    float second = -1e30f;
    for (int i = 0; i < n_vocab; ++i) {
      if (i != best && logits[i] > second) second = logits[i];
    }
    gen.push_back(best);
    gaps.push_back(logits[best] - second);
    next.assign(1, best);
  }

  // One C++ initializer of tests/arch/arch_goldens.h's ArchGolden.
  const size_t slash = label.find('/');
  std::printf("    {\"%s\", \"%s\",\n     {", label.substr(0, slash).c_str(),
              label.substr(slash + 1).c_str());
  for (size_t i = 0; i < prompt.size(); ++i) std::printf("%s%d", i ? ", " : "", prompt[i]);
  std::printf("},\n     {");
  for (size_t i = 0; i < gen.size(); ++i) std::printf("%s%d", i ? ", " : "", gen[i]);
  std::printf("},\n     {");
  for (size_t i = 0; i < gaps.size(); ++i) std::printf("%s%.6ef", i ? ", " : "", gaps[i]);
  std::printf("}},\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
