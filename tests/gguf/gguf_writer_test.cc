// Writer tests: everything written reads back the same, files and buffers match byte for byte,
// and tensor data is streamed through the fillers with the layout GGUF requires.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "gguf/gguf_test_util.h"
#include "kvl/gguf.h"

namespace kvl {
namespace {

using gguf_test::Bytes;
using gguf_test::Pattern;

template <typename T>
std::vector<uint8_t> Le(T v) {
  std::vector<uint8_t> out(sizeof(T));
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

struct TensorSpec {
  std::string name;
  DType type;
  std::vector<int64_t> dims;
  int64_t bytes;
};

const std::vector<TensorSpec>& Specs() {
  static const std::vector<TensorSpec> specs = {
      {"blk.0.f32", DType::kF32, {4, 3}, 4 * 3 * 4},
      {"blk.0.f16", DType::kF16, {16, 2}, 16 * 2 * 2},
      {"blk.0.q8_0", DType::kQ8_0, {64, 2}, 2 * 2 * 34},
      {"blk.0.q4_0", DType::kQ4_0, {32, 3, 2}, 3 * 2 * 18},
      {"blk.0.bf16", DType::kBF16, {5, 1, 1, 3}, 5 * 3 * 2},
  };
  return specs;
}

GgufWriter EveryTypeWriter() {
  GgufWriter w;
  w.AddRaw("t.u8", GgufValueType::kUint8, {200});
  w.AddRaw("t.i8", GgufValueType::kInt8, Le<int8_t>(-100));
  w.AddRaw("t.u16", GgufValueType::kUint16, Le<uint16_t>(60000));
  w.AddRaw("t.i16", GgufValueType::kInt16, Le<int16_t>(-30000));
  w.AddUint32("t.u32", 4000000000u);
  w.AddInt32("t.i32", -2000000000);
  w.AddFloat32("t.f32", 0.25f);
  w.AddBool("t.bool", false);
  w.AddString("t.str", "h\xc3\xa9llo");
  w.AddRaw("t.u64", GgufValueType::kUint64, Le<uint64_t>(uint64_t{1} << 40));
  w.AddRaw("t.i64", GgufValueType::kInt64, Le<int64_t>(-(int64_t{1} << 40)));
  w.AddRaw("t.f64", GgufValueType::kFloat64, Le<double>(3.5));
  w.AddStringArray("t.strs", {"", "a", "bc"});
  w.AddFloat32Array("t.floats", {1.5f, -2.0f});
  w.AddInt32Array("t.ints", {7, -8, 9});
  w.AddInt32Array("t.empty", {});
  // An array of two uint8 arrays: {{1, 2}, {}}.
  gguf_test::RawGguf nested;
  nested.U32(static_cast<uint32_t>(GgufValueType::kArray)).U64(2);
  nested.U32(0).U64(2).U8(1).U8(2);
  nested.U32(0).U64(0);
  w.AddRaw("t.nested", GgufValueType::kArray, nested.bytes());
  uint8_t seed = 10;
  for (const TensorSpec& s : Specs()) w.AddTensor(s.name, s.type, s.dims, Pattern(seed++));
  return w;
}

void ExpectEveryType(const GgufFile& f) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 17u);
  EXPECT_EQ(f.metadata()[0].key, "t.u8");  // order is kept
  EXPECT_EQ(*f.GetInt("t.u8"), 200);
  EXPECT_EQ(*f.GetInt("t.i8"), -100);
  EXPECT_EQ(*f.GetInt("t.u16"), 60000);
  EXPECT_EQ(*f.GetInt("t.i16"), -30000);
  EXPECT_EQ(*f.GetInt("t.u32"), 4000000000);
  EXPECT_EQ(*f.GetInt("t.i32"), -2000000000);
  EXPECT_EQ(*f.GetFloat("t.f32"), 0.25f);
  EXPECT_FALSE(*f.GetBool("t.bool"));
  EXPECT_EQ(*f.GetString("t.str"), "h\xc3\xa9llo");
  EXPECT_EQ(*f.GetInt("t.u64"), int64_t{1} << 40);
  EXPECT_EQ(*f.GetInt("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(f.Find("t.f64")->f, 3.5);
  EXPECT_EQ(f.Find("t.f64")->type, GgufValueType::kFloat64);
  const GgufValue* strs = *f.GetArray("t.strs", GgufValueType::kString);
  EXPECT_EQ(strs->strings, (std::vector<std::string_view>{"", "a", "bc"}));
  const GgufValue* floats = *f.GetArray("t.floats", GgufValueType::kFloat32);
  ASSERT_EQ(floats->array_count, 2u);
  EXPECT_EQ(floats->ArrayFloat(0), 1.5f);
  EXPECT_EQ(floats->ArrayNumber(1), -2.0);
  const GgufValue* ints = *f.GetArray("t.ints", GgufValueType::kInt32);
  ASSERT_EQ(ints->array_count, 3u);
  EXPECT_EQ(ints->ArrayInt(1), -8);
  EXPECT_EQ((*f.GetArray("t.empty", GgufValueType::kInt32))->array_count, 0u);
  const GgufValue* nested = *f.GetArray("t.nested", GgufValueType::kArray);
  ASSERT_EQ(nested->elements.size(), 2u);
  EXPECT_EQ(nested->elements[0].array_type, GgufValueType::kUint8);
  EXPECT_EQ(nested->elements[0].ArrayInt(1), 2);
  EXPECT_EQ(nested->elements[1].array_count, 0u);

  ASSERT_EQ(f.tensors().size(), Specs().size());
  uint8_t seed = 10;
  for (size_t k = 0; k < Specs().size(); ++k) {
    const TensorSpec& s = Specs()[k];
    const GgufTensorInfo& t = f.tensors()[k];
    EXPECT_EQ(t.name, s.name);
    EXPECT_EQ(t.type, s.type);
    EXPECT_EQ(t.dims, s.dims);
    EXPECT_EQ(t.num_bytes, s.bytes) << s.name;
    EXPECT_EQ(t.offset % 32, 0u);
    std::vector<uint8_t> expected(static_cast<size_t>(s.bytes));
    Pattern(seed++)(expected.data(), expected.size());
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.num_bytes), expected) << s.name;
  }
}

TEST(GgufWriterTest, RoundTripEveryTypeInMemory) {
  const Bytes b = EveryTypeWriter().WriteToBuffer();
  EXPECT_EQ(b.size() % 32, 0u);
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ExpectEveryType(**file);
}

TEST(GgufWriterTest, FileMatchesBufferAndOpens) {
  const GgufWriter w = EveryTypeWriter();
  const std::string path = ::testing::TempDir() + "/kvl_gguf_roundtrip.gguf";
  ASSERT_TRUE(w.Write(path).ok());
  std::ifstream in(path, std::ios::binary);
  const Bytes on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(on_disk, w.WriteToBuffer());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->path(), path);
  ExpectEveryType(**file);
  std::remove(path.c_str());
}

TEST(GgufWriterTest, AlignmentIsWrittenAndRespected) {
  GgufWriter w;
  w.SetAlignment(128);
  w.AddTensor("a", DType::kF32, {3}, Pattern(1));
  w.AddTensor("b", DType::kQ8_0, {32}, Pattern(2));
  const Bytes b = w.WriteToBuffer();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->alignment(), 128u);
  EXPECT_EQ(*(*file)->GetInt("general.alignment"), 128);
  EXPECT_EQ((*file)->FindTensor("b")->offset, 128u);
  EXPECT_EQ(static_cast<size_t>((*file)->FindTensor("a")->data - b.data()) % 128, 0u);
  EXPECT_EQ(b.size() % 128, 0u);
}

TEST(GgufWriterTest, RepeatedKeyKeepsLastValue) {
  GgufWriter w;
  w.AddInt32("k", 1);
  w.AddString("other", "x");
  w.AddInt32("k", 2);
  w.AddUint32("general.alignment", 64);
  w.SetAlignment(16);
  const Bytes b = w.WriteToBuffer();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata().size(), 3u);
  EXPECT_EQ(*(*file)->GetInt("k"), 2);
  EXPECT_EQ((*file)->alignment(), 16u);
}

TEST(GgufWriterTest, FillerSeesEachTensorOnceWithItsSize) {
  GgufWriter w;
  std::vector<size_t> calls;
  auto record = [&](uint8_t* out, size_t n) { calls.push_back(n); };
  w.AddTensor("a", DType::kF16, {10}, record);
  w.AddTensor("b", DType::kQ4_0, {64, 2}, record);
  w.AddTensor("c", DType::kF32, {1}, nullptr);  // no filler: zeros
  const Bytes b = w.WriteToBuffer();
  EXPECT_EQ(calls, (std::vector<size_t>{20, 72}));
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok());
  const GgufTensorInfo* c = (*file)->FindTensor("c");
  EXPECT_EQ(c->data[0] | c->data[1] | c->data[2] | c->data[3], 0);
}

TEST(GgufWriterTest, WriteRejectsBadTensors) {
  const std::string path = ::testing::TempDir() + "/kvl_gguf_never_written.gguf";
  {
    GgufWriter w;
    w.AddTensor("q", DType::kQ8_0, {16}, nullptr);
    EXPECT_STATUS(w.Write(path), StatusCode::kInvalidArgument, "block size 32");
  }
  {
    GgufWriter w;
    w.AddTensor("x", DType::kF32, {}, nullptr);
    EXPECT_STATUS(w.Write(path), StatusCode::kInvalidArgument, "GGUF allows 1 to 4");
  }
  {
    GgufWriter w;
    w.AddTensor("x", DType::kF32, {2, 0}, nullptr);
    EXPECT_STATUS(w.Write(path), StatusCode::kInvalidArgument, "bad dims");
  }
  {
    GgufWriter w;
    w.AddTensor("x", DType::kF32, {2}, nullptr);
    w.AddTensor("x", DType::kF32, {2}, nullptr);
    EXPECT_STATUS(w.Write(path), StatusCode::kInvalidArgument, "added twice");
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_EQ(f, nullptr) << "a rejected write left a file behind";
  if (f != nullptr) std::fclose(f);
}

TEST(GgufWriterTest, WriteToUnwritablePathIsIoError) {
  GgufWriter w;
  w.AddString("k", "v");
  EXPECT_STATUS(w.Write("/nonexistent/dir/x.gguf"), StatusCode::kIoError, "/nonexistent/dir");
}

TEST(GgufWriterTest, EmptyWriterGivesValidFile) {
  const Bytes b = GgufWriter().WriteToBuffer();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->metadata().empty());
  EXPECT_TRUE((*file)->tensors().empty());
}

}  // namespace
}  // namespace kvl
