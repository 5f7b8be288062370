// Reader tests: a valid file parses; every kind of malformed file gives a clean Status that names
// the problem. Malformed files start from GgufWriter output with bytes edited.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <fstream>
#include <random>
#include <string>

#include "gguf/gguf_test_util.h"
#include "kvl/gguf.h"

namespace kvl {
namespace {

using gguf_test::Bytes;
using gguf_test::FindGgufString;
using gguf_test::FindTensorFields;
using gguf_test::GetAt;
using gguf_test::ParseStatus;
using gguf_test::PutAt;
using gguf_test::RawGguf;
using gguf_test::SmallFile;
using gguf_test::ValueTypeAt;

constexpr uint64_t kHuge = uint64_t{1} << 60;

TEST(GgufReaderTest, SmallFileParses) {
  const Bytes b = SmallFile();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 8u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("test.u32"), 7);
  EXPECT_EQ(*f.GetInt("test.i32"), -3);
  EXPECT_EQ(*f.GetFloat("test.f32"), 1.5f);
  EXPECT_EQ(*f.GetFloat("test.u32"), 7.0f);
  EXPECT_TRUE(*f.GetBool("test.bool"));
  auto strings = f.GetArray("test.strings", GgufValueType::kString);
  ASSERT_TRUE(strings.ok());
  ASSERT_EQ((*strings)->strings.size(), 2u);
  EXPECT_EQ((*strings)->strings[1], "yz");
  auto ints = f.GetArray("test.ints", GgufValueType::kInt32);
  ASSERT_TRUE(ints.ok());
  EXPECT_EQ((*ints)->ArrayInt(1), -2);
  EXPECT_EQ((*ints)->ArrayFloat(2), 3.0f);
  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensorInfo* c = f.FindTensor("tensor.c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->offset, 128u);
  EXPECT_EQ(c->num_bytes, 32);
  EXPECT_EQ(c->data + c->num_bytes, b.data() + b.size());
  EXPECT_EQ(f.FindTensor("tensor.b")->num_bytes, 34);
  EXPECT_EQ(f.FindTensor("nope"), nullptr);
}

TEST(GgufReaderTest, EveryTruncatedPrefixFailsCleanly) {
  const Bytes b = SmallFile();
  for (size_t n = 0; n < b.size(); ++n) {
    const Status s = ParseStatus(Bytes(b.begin(), b.begin() + static_cast<ptrdiff_t>(n)));
    EXPECT_FALSE(s.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << n << ": " << s.ToString();
    EXPECT_FALSE(s.message().empty());
  }
}

TEST(GgufReaderTest, RandomByteFlipsNeverCrash) {
  const Bytes original = SmallFile();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = original;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    const Status s = ParseStatus(b);  // any result is fine as long as it is a result
    if (!s.ok()) {
      EXPECT_FALSE(s.message().empty());
    }
  }
}

TEST(GgufReaderTest, BadMagic) {
  Bytes b = SmallFile();
  b[0] = 'X';
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "magic");
  EXPECT_STATUS(ParseStatus(Bytes{'G', 'G'}), StatusCode::kDataLoss, "too short");
}

TEST(GgufReaderTest, UnsupportedVersions) {
  Bytes b = SmallFile();
  PutAt<uint32_t>(b, 4, 1);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kUnimplemented, "version 1");
  PutAt<uint32_t>(b, 4, 99);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kUnimplemented, "version 99");
  PutAt<uint32_t>(b, 4, 0x03000000);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kUnimplemented, "big-endian");
}

TEST(GgufReaderTest, Version2IsAccepted) {
  // v2 and v3 share a layout; v3 only added the big-endian variant.
  Bytes b = SmallFile();
  PutAt<uint32_t>(b, 4, 2);
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->version(), 2u);
}

TEST(GgufReaderTest, HugeCountsFailBeforeAllocating) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, 16, kHuge);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "metadata count");
  b = SmallFile();
  PutAt<uint64_t>(b, 8, kHuge);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "tensor count");
}

TEST(GgufReaderTest, TensorDataPastEndOfFile) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, FindTensorFields(b, "tensor.c").offset, 1024);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "tensor 'tensor.c'");
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "past the end");
  // An offset near 2^64 must not wrap around when added to the data start.
  PutAt<uint64_t>(b, FindTensorFields(b, "tensor.c").offset, ~uint64_t{31});
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "past the end");
}

TEST(GgufReaderTest, ElementCountOverflowsInt64) {
  Bytes b = SmallFile();
  const auto f = FindTensorFields(b, "tensor.a");  // f32 {8, 2}
  PutAt<uint64_t>(b, f.dims + 8, uint64_t{1} << 62);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "more elements than int64");
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "tensor 'tensor.a'");
}

TEST(GgufReaderTest, ByteCountOverflowsInt64) {
  Bytes b = SmallFile();
  const auto f = FindTensorFields(b, "tensor.a");  // 2^62 f32 elements fit, 2^64 bytes do not
  PutAt<uint64_t>(b, f.dims, uint64_t{1} << 61);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "more bytes than int64");
}

TEST(GgufReaderTest, StringLengthPastEnd) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, ValueTypeAt(b, "general.architecture") + 4, kHuge);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "metadata key 'general.architecture'");
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "string length");
}

TEST(GgufReaderTest, KeyNameLengthPastEndNamesTheIndex) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, FindGgufString(b, "test.i32"), kHuge);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "metadata key #2");
}

TEST(GgufReaderTest, ArrayCountPastEnd) {
  for (const char* key : {"test.floats", "test.strings", "test.ints"}) {
    Bytes b = SmallFile();
    PutAt<uint64_t>(b, ValueTypeAt(b, key) + 8, kHuge);
    EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, std::string("'") + key + "'");
    EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "only");
  }
}

TEST(GgufReaderTest, UnknownValueType) {
  Bytes b = SmallFile();
  PutAt<uint32_t>(b, ValueTypeAt(b, "test.u32"), 13);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "unknown value type 13");
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "'test.u32'");
  b = SmallFile();
  PutAt<uint32_t>(b, ValueTypeAt(b, "test.ints") + 4, 77);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "unknown array element type 77");
}

TEST(GgufReaderTest, BoolMustBeZeroOrOne) {
  Bytes b = SmallFile();
  PutAt<uint8_t>(b, ValueTypeAt(b, "test.bool") + 4, 2);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "'test.bool'");
}

TEST(GgufReaderTest, EmptyKeyName) {
  RawGguf raw;
  raw.Header(3, 0, 1).Str("").U32(4).U32(1);
  EXPECT_STATUS(ParseStatus(raw.bytes()), StatusCode::kDataLoss, "key name is empty");
}

TEST(GgufReaderTest, UnknownTensorType) {
  Bytes b = SmallFile();
  PutAt<uint32_t>(b, FindTensorFields(b, "tensor.a").type, 99);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "unknown ggml tensor type 99");
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "tensor 'tensor.a'");
}

TEST(GgufReaderTest, KnownButUnsupportedTensorTypeParses) {
  GgufWriter w;
  w.AddTensor("k", DType::kQ4_K, {256, 2}, nullptr);
  w.AddTensor("q", DType::kQ4_1, {32}, nullptr);
  const Bytes b = w.WriteToBuffer();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->FindTensor("k")->type, DType::kQ4_K);
  EXPECT_EQ((*file)->FindTensor("k")->num_bytes, 2 * 144);
  EXPECT_EQ((*file)->FindTensor("q")->num_bytes, 20);
}

TEST(GgufReaderTest, DuplicateKey) {
  Bytes b = SmallFile();
  const size_t at = FindGgufString(b, "test.i32");
  std::memcpy(b.data() + at + 8, "test.u32", 8);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "'test.u32'");
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "duplicates metadata key #1");
}

TEST(GgufReaderTest, DuplicateTensorName) {
  Bytes b = SmallFile();
  const size_t at = FindGgufString(b, "tensor.b");
  b[at + 8 + 7] = 'a';
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "duplicates the name of tensor #0");
}

TEST(GgufReaderTest, NDimsOutOfRange) {
  for (uint32_t n_dims : {0u, 5u, 1000000u}) {
    Bytes b = SmallFile();
    PutAt<uint32_t>(b, FindTensorFields(b, "tensor.b").n_dims, n_dims);
    EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss,
                  "n_dims " + std::to_string(n_dims) + " at offset");
    EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "tensor 'tensor.b'");
  }
}

TEST(GgufReaderTest, ZeroAndNegativeLookingDims) {
  for (uint64_t dim : {uint64_t{0}, uint64_t{1} << 63, ~uint64_t{0}}) {
    Bytes b = SmallFile();
    PutAt<uint64_t>(b, FindTensorFields(b, "tensor.a").dims + 8, dim);
    EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "dimension 1 at offset");
  }
}

TEST(GgufReaderTest, InnermostDimNotMultipleOfBlock) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, FindTensorFields(b, "tensor.b").dims, 16);  // q8_0 blocks are 32
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "not a multiple of the q8_0 block size 32");
}

TEST(GgufReaderTest, OffsetNotAligned) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, FindTensorFields(b, "tensor.c").offset, 100);
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "not a multiple of the alignment 32");
}

TEST(GgufReaderTest, BadAlignmentValue) {
  for (uint32_t alignment : {0u, 3u, 48u}) {
    GgufWriter w;
    w.SetAlignment(64);
    w.AddTensor("t", DType::kF32, {16}, nullptr);
    Bytes b = w.WriteToBuffer();
    PutAt<uint32_t>(b, ValueTypeAt(b, "general.alignment") + 4, alignment);
    EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "not a nonzero power of two");
  }
}

TEST(GgufReaderTest, AlignmentMustBeUint32) {
  GgufWriter w;
  w.AddInt32("general.alignment", 64);
  EXPECT_STATUS(ParseStatus(w.WriteToBuffer()), StatusCode::kDataLoss, "expected uint32");
}

TEST(GgufReaderTest, OverlappingTensors) {
  Bytes b = SmallFile();
  PutAt<uint64_t>(b, FindTensorFields(b, "tensor.b").offset, 32);  // inside tensor.a [0, 64)
  EXPECT_STATUS(ParseStatus(b), StatusCode::kDataLoss, "overlaps");
}

// An array of arrays nested `depth` deep whose innermost array holds one uint8.
Bytes NestedArrays(int depth) {
  RawGguf raw;
  raw.Header(3, 0, 1).Str("test.nested").U32(9);
  for (int d = 1; d < depth; ++d) raw.U32(9).U64(1);
  raw.U32(0).U64(1).U8(42);
  return raw.bytes();
}

TEST(GgufReaderTest, NestedArrayDepthLimit) {
  const Bytes ok = NestedArrays(GgufFile::kMaxArrayDepth);
  auto file = GgufFile::FromBuffer(ok.data(), ok.size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufValue* v = (*file)->Find("test.nested");
  for (int d = 1; d < GgufFile::kMaxArrayDepth; ++d) {
    ASSERT_EQ(v->elements.size(), 1u);
    v = &v->elements[0];
  }
  EXPECT_EQ(v->ArrayInt(0), 42);
  EXPECT_STATUS(ParseStatus(NestedArrays(GgufFile::kMaxArrayDepth + 1)), StatusCode::kDataLoss,
                "nested deeper than 8");
  EXPECT_STATUS(ParseStatus(NestedArrays(100000)), StatusCode::kDataLoss, "nested deeper than 8");
}

TEST(GgufReaderTest, MetadataOnlyFileNeedsNoPadding) {
  RawGguf raw;
  raw.Header(3, 0, 1).Str("general.name").U32(8).Str("x");
  auto file = GgufFile::FromBuffer(raw.bytes().data(), raw.bytes().size());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*(*file)->GetString("general.name"), "x");
}

TEST(GgufReaderTest, GetterErrorsNameKeyAndTypes) {
  const Bytes b = SmallFile();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok());
  const GgufFile& f = **file;
  EXPECT_STATUS(f.GetString("missing.key").status(), StatusCode::kNotFound, "'missing.key'");
  EXPECT_STATUS(f.GetInt("missing.key").status(), StatusCode::kNotFound, "'missing.key'");
  EXPECT_STATUS(f.GetString("test.u32").status(), StatusCode::kInvalidArgument,
                "'test.u32' holds uint32, wanted string");
  EXPECT_STATUS(f.GetInt("test.f32").status(), StatusCode::kInvalidArgument,
                "holds float32, wanted an integer");
  EXPECT_STATUS(f.GetBool("test.i32").status(), StatusCode::kInvalidArgument,
                "holds int32, wanted bool");
  EXPECT_STATUS(f.GetFloat("general.architecture").status(), StatusCode::kInvalidArgument,
                "holds string, wanted a number");
  EXPECT_STATUS(f.GetArray("test.ints", GgufValueType::kFloat32).status(),
                StatusCode::kInvalidArgument, "holds array of int32, wanted array of float32");
  EXPECT_STATUS(f.GetArray("test.u32", GgufValueType::kUint32).status(),
                StatusCode::kInvalidArgument, "holds uint32, wanted array of uint32");
}

TEST(GgufReaderTest, GetIntRejectsUint64AboveInt64Max) {
  GgufWriter w;
  std::vector<uint8_t> payload(8, 0xff);
  w.AddRaw("test.big", GgufValueType::kUint64, payload);
  const Bytes b = w.WriteToBuffer();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok());
  EXPECT_STATUS((*file)->GetInt("test.big").status(), StatusCode::kInvalidArgument,
                "does not fit int64");
  EXPECT_EQ((*file)->Find("test.big")->u, ~uint64_t{0});
}

TEST(GgufReaderTest, ArrayIntOfOddFloatsIsDefined) {
  // Found by the fuzzer: casting NaN or 1e30 to int64 is undefined; ArrayInt saturates instead.
  GgufWriter w;
  w.AddFloat32Array("t.f", {std::nanf(""), 1e30f, -1e30f, -2.5f});
  const Bytes b = w.WriteToBuffer();
  auto file = GgufFile::FromBuffer(b.data(), b.size());
  ASSERT_TRUE(file.ok());
  const GgufValue* v = (*file)->Find("t.f");
  EXPECT_EQ(v->ArrayInt(0), 0);
  EXPECT_EQ(v->ArrayInt(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(v->ArrayInt(2), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(v->ArrayInt(3), -2);
  EXPECT_TRUE(std::isnan(v->ArrayFloat(0)));
}

TEST(GgufReaderTest, OpenMissingFileIsNotFound) {
  EXPECT_STATUS(GgufFile::Open("/nonexistent/dir/model.gguf").status(), StatusCode::kNotFound,
                "/nonexistent/dir/model.gguf");
}

TEST(GgufReaderTest, OpenErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/kvl_gguf_bad_magic.gguf";
  Bytes b = SmallFile();
  b[1] = 'X';
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  EXPECT_STATUS(GgufFile::Open(path).status(), StatusCode::kDataLoss, path + ": bad magic");
  { std::ofstream empty(path, std::ios::binary | std::ios::trunc); }
  EXPECT_STATUS(GgufFile::Open(path).status(), StatusCode::kDataLoss, "empty");
  std::remove(path.c_str());
  EXPECT_STATUS(GgufFile::Open(::testing::TempDir()).status(), StatusCode::kInvalidArgument,
                "not a regular file");
}

// A FIFO with no writer would block a plain open() forever; the reader refuses it at once.
TEST(GgufReaderTest, OpenRefusesAFifoWithoutBlocking) {
  const std::string path = ::testing::TempDir() + "/kvl_gguf_fifo_" + std::to_string(getpid());
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  EXPECT_STATUS(GgufFile::Open(path).status(), StatusCode::kInvalidArgument,
                "is a FIFO (named pipe), not a regular file");
  EXPECT_STATUS(GgufFile::Open("/dev/null").status(), StatusCode::kInvalidArgument,
                "character device");
  std::remove(path.c_str());
}

TEST(GgufReaderTest, RealStories260KModel) {
  const std::string path = std::string(KVL_SHARED_MODELS_DIR) + "/stories260K.gguf";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.embedding_length"), 64);
  auto tokens = f.GetArray("tokenizer.ggml.tokens", GgufValueType::kString);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ((*tokens)->strings.size(), 512u);
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, DType::kF32);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->num_bytes, 64 * 512 * 4);
  ASSERT_FALSE(f.tensors().empty());
  const uint8_t* begin = f.data();
  const uint8_t* end = f.data() + f.file_size();
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_GE(t.data, begin) << t.name;
    EXPECT_LE(t.data + t.num_bytes, end) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % f.alignment(), 0u) << t.name;
  }
}

// Dropped pages of a mapped file come back with the file's bytes when read again.
TEST(GgufReaderTest, DroppedPagesReadBackUnchanged) {
  auto file = GgufFile::Open(std::string(KVL_SHARED_MODELS_DIR) + "/stories260K.gguf");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& f = **file;
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  const std::vector<uint8_t> before(embd->data, embd->data + embd->num_bytes);
  f.DropPages(embd->data, embd->num_bytes);
  f.DropPages(f.data(), f.file_size());  // the whole file, unaligned ends included
  EXPECT_EQ(std::vector<uint8_t>(embd->data, embd->data + embd->num_bytes), before);
}

}  // namespace
}  // namespace kvl
