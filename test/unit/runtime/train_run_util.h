//===- train_run_util.h - Reading what a training run wrote -----*- C++ -*-===//
//
// Helpers of the tests that run the whole training binary (trainMain,
// trainMainStages) and compare what it wrote: the loss and grad norm of
// each metrics line, every tensor of a checkpoint as a whole tensor.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_RUNTIME_TRAIN_RUN_UTIL_H
#define ACTPLACE_TEST_UNIT_RUNTIME_TRAIN_RUN_UTIL_H

#include "runtime/checkpoint.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ap::rt::test {

/// (loss, grad norm) per step of a metrics file (NaN where a line lacks
/// the field).
inline std::vector<std::pair<double, double>>
metricsOf(const std::string &path) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto num = [&](const std::string &key) {
      size_t at = line.find("\"" + key + "\":");
      return at == std::string::npos
                 ? NAN
                 : std::strtod(line.c_str() + at + key.size() + 3, nullptr);
    };
    out.push_back({num("loss"), num("grad_norm")});
  }
  return out;
}

/// Every tensor of the checkpoint in `stepDir`, whole, by name (any
/// layout: a world-of-one file, flat shards, pipeline stages).
inline std::map<std::string, std::vector<uint8_t>>
wholeTensors(const std::string &stepDir) {
  std::vector<CheckpointEntry> entries = listCheckpoint(stepDir);
  std::map<std::string, std::vector<uint8_t>> out;
  std::vector<CheckpointTensor> dest;
  for (const CheckpointEntry &e : entries) {
    int64_t n = 1;
    for (int64_t d : e.shape)
      n *= d;
    out[e.name].assign(size_t(n) * stDTypeSize(e.dtype), 0);
  }
  for (const CheckpointEntry &e : entries) {
    CheckpointTensor t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data = out[e.name].data();
    t.bytes = out[e.name].size();
    dest.push_back(t);
  }
  loadCheckpoint(stepDir, dest, ShardInfo{}, LoadOptions{true});
  return out;
}

} // namespace ap::rt::test

#endif // ACTPLACE_TEST_UNIT_RUNTIME_TRAIN_RUN_UTIL_H
