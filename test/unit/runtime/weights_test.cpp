//===- weights_test.cpp - Parameters by HF name in safetensors files ------===//
#include "runtime/weights.h"

#include "kernels/kernels.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <unistd.h>

using namespace ap::rt;

namespace {

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "/ap_weights_" + std::to_string(::getpid()) +
         "_" + name;
}

/// The message of the error `fn` throws ("<no error>" when none).
template <typename Fn> std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const Error &e) {
    return e.what();
  }
  return "<no error>";
}

const std::vector<WeightSpec> kModel = {
    {"model.embed_tokens.weight", StDType::F32, {3, 2}},
    {"model.norm.weight", StDType::BF16, {2}},
};

TEST(Weights, RoundTripKeepsNamesShapesValuesAndMetadata) {
  std::string path = tempPath("roundtrip.safetensors");
  std::vector<std::vector<float>> values = {
      {1.f, -2.f, 0.5f, 3.25f, 1e-8f, 7.f}, {0.75f, -0.125f}};
  writeTensorsF32(path, kModel, values, {{"actplace.step", "1"}});
  EXPECT_EQ(readWeightsF32(path, kModel), values);
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.meta("actplace.step"), "1");
  ASSERT_NE(f.find("model.norm.weight"), nullptr);
  // Written as F32 whatever the parameter's storage dtype.
  EXPECT_EQ(f.find("model.norm.weight")->dtype, StDType::F32);
  EXPECT_EQ(f.find("model.embed_tokens.weight")->shape,
            (std::vector<int64_t>{3, 2}));
}

TEST(Weights, AcceptsTheParameterOwnDtypeExactly) {
  std::string path = tempPath("bf16.safetensors");
  float embed[6] = {1, 2, 3, 4, 5, 6};
  ap::kernels::bf16 norm[2] = {ap::kernels::bf16(1.5f),
                               ap::kernels::bf16(-0.0078125f)};
  SafetensorsWriter w;
  w.add("model.embed_tokens.weight", StDType::F32, {3, 2}, embed,
        sizeof(embed));
  w.add("model.norm.weight", StDType::BF16, {2}, norm, sizeof(norm));
  w.write(path);
  std::vector<std::vector<float>> v = readWeightsF32(path, kModel);
  EXPECT_EQ(v[1], (std::vector<float>{1.5f, -0.0078125f}));
  EXPECT_EQ(v[0][5], 6.f);
}

TEST(Weights, EveryMismatchIsNamedInOneError) {
  std::string path = tempPath("bad.safetensors");
  double embed[4] = {1, 2, 3, 4};
  float extra[1] = {1};
  SafetensorsWriter w;
  // Wrong shape and a dtype that would round into the F32 master.
  w.add("model.embed_tokens.weight", StDType::F64, {2, 2}, embed,
        sizeof(embed));
  w.add("model.layers.0.extra", StDType::F32, {1}, extra, sizeof(extra));
  w.write(path);
  std::string msg = errorOf([&] { readWeightsF32(path, kModel); });
  for (const char *want :
       {"do not fit the model", "missing 'model.norm.weight' [2]",
        "'model.embed_tokens.weight' has shape [2, 2], the model's is [3, 2]",
        "'model.embed_tokens.weight' is F64, expected F32",
        "'model.layers.0.extra' is not a parameter of this model"})
    EXPECT_NE(msg.find(want), std::string::npos) << want << "\n" << msg;
  // A BF16 parameter may come as F32 or BF16, and the message says so.
  float zeros[6] = {};
  SafetensorsWriter w2;
  w2.add("model.embed_tokens.weight", StDType::F32, {3, 2}, zeros,
         sizeof(zeros));
  w2.add("model.norm.weight", StDType::F64, {2}, embed, 2 * sizeof(double));
  std::string path2 = tempPath("bad2.safetensors");
  w2.write(path2);
  EXPECT_NE(errorOf([&] {
              readWeightsF32(path2, kModel);
            }).find("'model.norm.weight' is F64, expected F32 or BF16"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { readWeightsF32(tempPath("absent"), kModel); }),
            "<no error>");
}

TEST(Weights, WriterChecksCounts) {
  EXPECT_NE(errorOf([&] {
              writeTensorsF32(tempPath("n.safetensors"), kModel, {});
            }).find("2 names for 0 tensors"),
            std::string::npos);
}

} // namespace
