// Sliding-window attention does not depend on how a prompt is cut: the logits of every position
// are bit-identical whether the prompt runs whole, in chunks of 7 (across the test shapes'
// 6-token windows) or one token at a time, on the architectures with local layers and on one
// without. (What a local layer's token sees is fixed by its position alone.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "kvl/forward.h"
#include "kvl/synthetic_model.h"

namespace kvl {
namespace {

std::vector<std::vector<float>> LogitsInChunks(const std::string& path, int64_t chunk) {
  std::unique_ptr<Model> model = std::move(Model::Load(path).value());
  const ModelConfig& c = model->config();
  ThreadPool pool(2);
  ops::OpsContext ops(ops::BestIsa(), &pool);
  std::unique_ptr<ContiguousKvCache> kv =
      std::move(ContiguousKvCache::Create(c.num_layers, c.kv_dim(), 1, 128).value());
  Forward forward(*model, ops, ForwardOptions{64, 64, 128});
  std::vector<std::vector<float>> out;
  const int64_t n = 50;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    TokenBatch batch;
    for (int64_t i = begin; i < std::min(n, begin + chunk); ++i) {
      batch.Add(static_cast<int32_t>(3 + (i * 131 + 7) % (c.vocab_size - 3)), i, 0, true);
    }
    forward.Run(batch, *kv);
    for (int64_t r = 0; r < forward.num_logit_rows(); ++r) {
      out.emplace_back(forward.logits(r), forward.logits(r) + c.vocab_size);
    }
  }
  return out;
}

TEST(WindowChunkingTest, LogitsDoNotDependOnChunking) {
  for (const char* shape : {"test-gemma2", "test-gemma3", "test-qwen3"}) {
    SynthOptions o;
    o.shape = FindModelShape(shape).value();
    o.weight_type = DType::kF32;
    o.output_path = (std::filesystem::temp_directory_path() /
                     fmt::format("kvl-window-{}-{}.gguf", shape, ::getpid()))
                        .string();
    ASSERT_TRUE(WriteSyntheticModel(o).ok());
    const std::vector<std::vector<float>> whole = LogitsInChunks(o.output_path, 64);
    ASSERT_EQ(whole.size(), 50u);
    EXPECT_EQ(LogitsInChunks(o.output_path, 7), whole) << shape;
    EXPECT_EQ(LogitsInChunks(o.output_path, 1), whole) << shape;
    std::filesystem::remove(o.output_path);
  }
}

}  // namespace
}  // namespace kvl
