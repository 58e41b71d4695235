//===- checkpoint_safetensors_test.cpp - safetensors byte layout ----------===//
//
// No python safetensors/torch on the CI machine, so the byte layout is checked
// against a header written out by hand from the format description.
//
//===----------------------------------------------------------------------===//
#include "runtime/safetensors.h"

#include "runtime/error.h"
#include "runtime/sha256.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <unistd.h>

using namespace ap::rt;

namespace {

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "/ap_st_" + std::to_string(::getpid()) + "_" +
         name;
}

std::vector<uint8_t> readAll(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void expectError(const std::function<void()> &fn, const std::string &needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what();
  }
}

TEST(Safetensors, ExactByteLayout) {
  // One BF16 [3] tensor and one F32 [2] tensor: F32 is written first (wider
  // dtype), so its offsets are [0, 8) and the BF16 follows at [8, 14).
  uint16_t b[3] = {0x3f80, 0x4000, 0xc040}; // 1, 2, -3 in bf16
  float f[2] = {0.5f, -1.25f};
  SafetensorsWriter w;
  w.add("w.b", StDType::BF16, {3}, b, sizeof(b));
  w.add("w.f", StDType::F32, {1, 2}, f, sizeof(f));
  w.setMetadata("format", "pt");
  SafetensorsWriter::WriteOptions opt;
  opt.checksumKey.clear();
  std::string expectJson =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"w.f\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
      "\"w.b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}";
  while (expectJson.size() % 8)
    expectJson += ' ';
  std::string head = w.header(opt);
  ASSERT_EQ(head.size(), 8 + expectJson.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t(uint8_t(head[i])) << (8 * i);
  EXPECT_EQ(n, expectJson.size());
  EXPECT_EQ(head.substr(8), expectJson);

  std::string p = tempPath("layout.safetensors");
  w.write(p, opt);
  std::vector<uint8_t> bytes = readAll(p);
  ASSERT_EQ(bytes.size(), head.size() + 14);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + head.size()), head);
  const uint8_t *data = bytes.data() + head.size();
  EXPECT_EQ(std::memcmp(data, f, 8), 0);
  EXPECT_EQ(std::memcmp(data + 8, b, 6), 0);
  // Little-endian F32 0.5 = 0x3f000000.
  EXPECT_EQ(data[3], 0x3f);
  EXPECT_EQ(data[0], 0x00);

  SafetensorsFile r = SafetensorsFile::open(p);
  ASSERT_EQ(r.tensors().size(), 2u);
  const StTensorInfo *tb = r.find("w.b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, StDType::BF16);
  EXPECT_EQ(tb->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(std::memcmp(r.data(*tb), b, 6), 0);
  EXPECT_EQ(r.meta("format"), "pt");
  std::remove(p.c_str());
}

TEST(Safetensors, ChecksumAndAllDtypes) {
  std::vector<int64_t> i64 = {-1, 1ll << 40};
  std::vector<uint8_t> u8 = {1, 2, 3};
  std::vector<double> f64 = {3.25};
  std::vector<int32_t> scalar = {7};
  SafetensorsWriter w;
  w.add("i64", StDType::I64, {2}, i64.data(), 16);
  w.add("u8", StDType::U8, {3}, u8.data(), 3);
  w.add("f64", StDType::F64, {1}, f64.data(), 8);
  w.add("scalar", StDType::I32, {}, scalar.data(), 4);
  w.add("empty", StDType::F32, {0, 4}, nullptr, 0);
  w.setMetadata("quote\"key", "line\nbreak \\ \x01");
  std::string p = tempPath("sum.safetensors");
  w.write(p);
  SafetensorsFile r = SafetensorsFile::open(p);
  r.verifyChecksum();
  EXPECT_EQ(r.meta("quote\"key"), "line\nbreak \\ \x01");
  EXPECT_EQ(r.find("scalar")->shape.size(), 0u);
  EXPECT_EQ(*reinterpret_cast<const int64_t *>(r.data(*r.find("i64")) + 8),
            1ll << 40);
  EXPECT_EQ(r.find("empty")->bytes(), 0u);
  // Offsets are aligned to the element size.
  for (const StTensorInfo &t : r.tensors())
    EXPECT_EQ(t.begin % stDTypeSize(t.dtype), 0u) << t.name;
  // Wrong sizes are refused at add().
  EXPECT_THROW(w.add("bad", StDType::F32, {3}, f64.data(), 8), Error);
  EXPECT_THROW(w.add("i64", StDType::I64, {2}, i64.data(), 16), Error);
  std::remove(p.c_str());
}

TEST(Safetensors, CorruptionIsDetected) {
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float(i) * 0.25f;
  SafetensorsWriter w;
  w.add("v", StDType::F32, {8, 8}, v.data(), v.size() * 4);
  std::string p = tempPath("corrupt.safetensors");
  w.write(p);
  std::vector<uint8_t> good = readAll(p);
  SafetensorsFile::fromBytes(good, "good").verifyChecksum();

  // Truncated anywhere: clear error, never a partial load.
  for (size_t cut : {size_t(0), size_t(5), size_t(20), good.size() - 1}) {
    std::vector<uint8_t> t(good.begin(), good.begin() + cut);
    expectError([&] { SafetensorsFile::fromBytes(t, "cut"); }, "truncated");
  }
  // A flipped data byte: checksum mismatch.
  std::vector<uint8_t> flipped = good;
  flipped.back() ^= 0x40;
  SafetensorsFile f = SafetensorsFile::fromBytes(flipped, "flipped");
  expectError([&] { f.verifyChecksum(); }, "corrupt");
  // Header damage: bad JSON, absurd length, extra trailing data.
  std::vector<uint8_t> badJson = good;
  badJson[8] = 'x';
  expectError([&] { SafetensorsFile::fromBytes(badJson, "json"); },
              "malformed JSON");
  std::vector<uint8_t> hugeLen = good;
  hugeLen[7] = 0x10;
  expectError([&] { SafetensorsFile::fromBytes(hugeLen, "len"); }, "header");
  std::vector<uint8_t> extra = good;
  extra.push_back(0);
  expectError([&] { SafetensorsFile::fromBytes(extra, "extra"); },
              "after the last tensor");
  expectError([&] { SafetensorsFile::open(tempPath("missing")); },
              "cannot open");
  std::remove(p.c_str());
}

std::vector<uint8_t> fileFromHeader(const std::string &json, size_t dataBytes) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i)
    out[i] = uint8_t(json.size() >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + dataBytes, 0);
  return out;
}

TEST(Safetensors, InconsistentHeadersAreRejected) {
  expectError(
      [] {
        SafetensorsFile::fromBytes(
            fileFromHeader(
                R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
            "size");
      },
      "dtype x shape");
  expectError(
      [] {
        SafetensorsFile::fromBytes(
            fileFromHeader(
                R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                6),
            "overlap");
      },
      "overlapping");
  expectError(
      [] {
        SafetensorsFile::fromBytes(
            fileFromHeader(
                R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1),
            "dtype");
      },
      "unknown dtype");
  expectError(
      [] {
        SafetensorsFile::fromBytes(
            fileFromHeader(
                R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                2),
            "dup");
      },
      "duplicate");
  expectError(
      [] {
        SafetensorsFile::fromBytes(
            fileFromHeader(R"({"__metadata__":{"k":1}})", 0), "meta");
      },
      "not a string");
  // A hand-written valid file with unicode escapes parses.
  SafetensorsFile ok = SafetensorsFile::fromBytes(
      fileFromHeader(
          R"({"__metadata__":{"k":"\u00e9\ud83d\ude00"},)"
          R"( "x" : {"dtype":"U8","shape":[2],"data_offsets":[0,2]} })",
          2),
      "ok");
  EXPECT_EQ(ok.meta("k"), "\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(Safetensors, HeaderNestingIsBounded) {
  // The document is at depth 0 and the tensor entry at 1, so n arrays
  // nested in the entry reach depth n + 1: 63 are the most a header holds.
  auto nested = [](int n) {
    return fileFromHeader(
        R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"deep":)" +
            std::string(size_t(n), '[') + std::string(size_t(n), ']') + "}}",
        1);
  };
  EXPECT_EQ(SafetensorsFile::fromBytes(nested(63), "63").tensors().size(), 1u);
  expectError([&] { SafetensorsFile::fromBytes(nested(64), "64"); },
              "nested deeper than 64 levels");
  // Far deeper than any parser stack would take: refused just the same.
  expectError([&] { SafetensorsFile::fromBytes(nested(100000), "deep"); },
              "nested deeper than 64 levels");
}

TEST(Safetensors, HeaderTextIsStrictJson) {
  const std::string entry =
      R"("x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  // A trailing comma, a bare word and a number with a leading zero are not
  // JSON; the message gives the byte where reading stopped.
  expectError(
      [&] {
        SafetensorsFile::fromBytes(fileFromHeader("{" + entry + ",}", 1),
                                   "comma");
      },
      "malformed JSON at byte");
  expectError(
      [&] {
        SafetensorsFile::fromBytes(
            fileFromHeader(R"({"__metadata__":{"k":nope},)" + entry + "}", 1),
            "word");
      },
      "malformed JSON at byte");
  expectError(
      [&] {
        SafetensorsFile::fromBytes(
            fileFromHeader(
                R"({"x":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}})", 1),
            "zero");
      },
      "malformed JSON at byte");
  // Strings must be UTF-8 (a name such as this could not be written back).
  expectError(
      [&] {
        SafetensorsFile::fromBytes(
            fileFromHeader("{\"x\xff\":" + entry.substr(4) + "}", 1), "utf8");
      },
      "malformed JSON at byte");
  // Dimensions and offsets are non-negative integers.
  for (const char *bad : {"-1", "1.0", "1e0", "18446744073709551616"})
    expectError(
        [&] {
          SafetensorsFile::fromBytes(
              fileFromHeader(R"({"x":{"dtype":"U8","shape":[)" +
                                 std::string(bad) +
                                 R"(],"data_offsets":[0,1]}})",
                             1),
              bad);
        },
        "bad dimension in shape");
  expectError(
      [&] {
        SafetensorsFile::fromBytes(
            fileFromHeader(
                R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})",
                1),
            "offset");
      },
      "missing or bad data_offsets");
}

TEST(Safetensors, WriterRefusesTextThatIsNotUtf8) {
  // Such a header would not read back (nor load in safetensors.torch).
  uint8_t v = 1;
  SafetensorsWriter w;
  expectError([&] { w.add("bad\xff", StDType::U8, {1}, &v, 1); },
              "safetensors: tensor name 'bad\xff': cannot be written as "
              "JSON: invalid UTF-8 byte at index 3");
  expectError([&] { w.setMetadata("k", "\xc3"); },
              "safetensors: metadata 'k': cannot be written as JSON");
  expectError([&] { w.setMetadata("\xc3", "v"); }, "safetensors: metadata key");
}

TEST(Safetensors, FailedWriteKeepsPreviousFile) {
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  std::string p = tempPath("atomic.safetensors");
  SafetensorsWriter w1;
  w1.add("x", StDType::F32, {1000}, a.data(), 4000);
  w1.write(p);
  SafetensorsWriter w2;
  w2.add("x", StDType::F32, {1000}, b.data(), 4000);
  SafetensorsWriter::WriteOptions crash;
  crash.failAfterBytes = 1500;
  expectError([&] { w2.write(p, crash); }, "simulated failure");
  SafetensorsFile r = SafetensorsFile::open(p);
  r.verifyChecksum();
  EXPECT_EQ(reinterpret_cast<const float *>(r.data(*r.find("x")))[999], 1.0f);
  // No temporary file is left behind.
  EXPECT_NE(::access((p + ".tmp." + std::to_string(::getpid())).c_str(), F_OK),
            0);
  std::remove(p.c_str());
}

} // namespace
