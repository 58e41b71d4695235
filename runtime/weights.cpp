//===- weights.cpp - Parameters by HF name in safetensors files
//------------===//
#include "runtime/weights.h"

#include "kernels/kernels.h"
#include "runtime/error.h"

#include <cstring>
#include <set>

namespace ap::rt {
namespace {

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Element `i` of a BF16, F32 or F64 buffer as float.
float loadFloat(const uint8_t *p, StDType t, size_t i) {
  switch (t) {
  case StDType::BF16: {
    uint16_t bits;
    std::memcpy(&bits, p + 2 * i, 2);
    return kernels::bf16::toFloat(bits);
  }
  case StDType::F64: {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return float(d);
  }
  default: {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  }
}

} // namespace

std::vector<std::vector<float>>
readWeightsF32(const std::string &path, const std::vector<WeightSpec> &specs) {
  SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const WeightSpec &s : specs) {
    wanted.insert(s.name);
    const StTensorInfo *t = file.find(s.name);
    if (!t) {
      problems.push_back("missing '" + s.name + "' " + shapeText(s.shape));
      continue;
    }
    if (t->shape != s.shape)
      problems.push_back("'" + s.name + "' has shape " + shapeText(t->shape) +
                         ", the model's is " + shapeText(s.shape));
    if (t->dtype != StDType::F32 && t->dtype != s.dtype)
      problems.push_back("'" + s.name + "' is " + stDTypeName(t->dtype) +
                         ", expected F32" +
                         (s.dtype == StDType::F32
                              ? std::string()
                              : std::string(" or ") + stDTypeName(s.dtype)));
  }
  for (const StTensorInfo &t : file.tensors())
    if (!wanted.count(t.name))
      problems.push_back("'" + t.name + "' is not a parameter of this model");
  if (!problems.empty())
    fail("weights '", path,
         "' do not fit the model:", listProblems(problems, 10));
  std::vector<std::vector<float>> out;
  out.reserve(specs.size());
  for (const WeightSpec &s : specs) {
    const StTensorInfo &t = *file.find(s.name);
    size_t n = size_t(t.numElements());
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = loadFloat(file.data(t), t.dtype, i);
    out.push_back(std::move(v));
  }
  return out;
}

void writeTensorsF32(const std::string &path,
                     const std::vector<WeightSpec> &specs,
                     const std::vector<std::vector<float>> &values,
                     const std::map<std::string, std::string> &metadata) {
  if (specs.size() != values.size())
    fail("weights '", path, "': ", specs.size(), " names for ", values.size(),
         " tensors");
  SafetensorsWriter w;
  for (size_t i = 0; i < specs.size(); ++i)
    w.add(specs[i].name, StDType::F32, specs[i].shape, values[i].data(),
          values[i].size() * sizeof(float));
  for (const auto &[k, v] : metadata)
    w.setMetadata(k, v);
  w.write(path);
}

} // namespace ap::rt
