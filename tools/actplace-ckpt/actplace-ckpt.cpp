//===- actplace-ckpt.cpp - Checkpoint tools
//--------------------------------===//
//
// `actplace-ckpt consolidate [--with-optimizer] CKPT OUT.safetensors`: the
// parameters of a checkpoint (a step folder, or a --save folder whose
// "latest" names one), whole and under their bare (HF) names, in one
// safetensors file: what `--init-weights` and HF loaders read. A ZeRO-3
// checkpoint's flat shards are joined through its index; a world-of-one
// checkpoint is copied out. --with-optimizer adds the FP32 masters and Adam
// moments as master/<p>, adam_m/<p>, adam_v/<p> (such a file is for
// inspection: --init-weights takes the parameters only). The output is
// written atomically. docs/checkpoint-format.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/checkpoint.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "support/Version.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

using namespace ap::rt;

namespace {

const char *kUsage =
    "usage: actplace-ckpt consolidate [--with-optimizer] CKPT OUT.safetensors\n"
    "\n"
    "Writes the parameters of checkpoint CKPT (a step folder such as\n"
    "DIR/step-00000100, or a --save folder DIR, meaning DIR/latest) as whole\n"
    "tensors under their model names into OUT.safetensors, usable as\n"
    "--init-weights. ZeRO-3 (flat-sharded) checkpoints are joined through\n"
    "their index.json; every file read is checked against its SHA-256.\n"
    "\n"
    "  --with-optimizer  also write the FP32 master weights and Adam moments\n"
    "                    (master/<p>, adam_m/<p>, adam_v/<p>)\n"
    "  --help            this text\n"
    "  --version         the release and the compiler-runtime ABI version\n"
    "\n"
    "Exit status: 0 done, 1 a checkpoint that cannot be read (the message\n"
    "names the file and what was expected), 2 bad usage.\n";

int usageError(const std::string &what) {
  std::fprintf(stderr, "actplace-ckpt: %s\n%s", what.c_str(), kUsage);
  return 2;
}

/// The tensor name `name` gets in the output, or "" to leave it out.
std::string outputName(const std::string &name, bool withOptimizer) {
  const std::string param = paramTensorName("");
  if (name.compare(0, param.size(), param) == 0)
    return name.substr(param.size());
  for (const std::string &prefix :
       {masterTensorName(""), adamMTensorName(""), adamVTensorName("")})
    if (withOptimizer && name.compare(0, prefix.size(), prefix) == 0)
      return name;
  return "";
}

/// The whole tensor's name of a tensor-parallel part ("<t>#tp<r>of<T>"),
/// or `name` itself.
std::string partWhole(const std::string &name) {
  size_t at = name.rfind("#tp");
  return at == std::string::npos ? name : name.substr(0, at);
}

int consolidate(const std::string &ckpt, const std::string &out,
                bool withOptimizer) {
  std::string stepDir = resolveCheckpoint(ckpt);
  std::vector<CheckpointEntry> entries = listCheckpoint(stepDir);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<CheckpointTensor> tensors;
  std::vector<std::string> names;
  std::vector<size_t> entryOf; ///< tensors[i] is entries[entryOf[i]]
  buffers.reserve(entries.size());
  for (const CheckpointEntry &e : entries) {
    std::string name = outputName(e.name, withOptimizer);
    if (name.empty())
      continue;
    uint64_t n = 1;
    for (int64_t d : e.shape)
      n *= uint64_t(d);
    buffers.emplace_back(size_t(n) * stDTypeSize(e.dtype));
    CheckpointTensor t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data = buffers.back().data();
    t.bytes = buffers.back().size();
    tensors.push_back(t);
    names.push_back(partWhole(name));
    entryOf.push_back(size_t(&e - entries.data()));
  }
  if (tensors.empty())
    fail("checkpoint '", stepDir, "' holds no parameters (no tensor named '",
         paramTensorName("<p>"), "')");
  // The buffers are written out only once the load returned: no staged
  // copy needed.
  LoadOptions options;
  options.subset = true;
  options.direct = true;
  TrainingState st = loadCheckpoint(stepDir, tensors, ShardInfo{}, options);
  SafetensorsWriter w;
  // Tensor-parallel parts ("<tensor>#tp<r>of<T>") are joined into their
  // whole tensor under the whole's name, in the order the first part came.
  std::vector<std::vector<uint8_t>> joined;
  joined.reserve(tensors.size());
  std::map<std::string, std::vector<size_t>> partsOf;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (entries[entryOf[i]].part.dim >= 0)
      partsOf[names[i]].push_back(i);
  size_t written = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointEntry &e = entries[entryOf[i]];
    if (e.part.dim < 0) {
      w.add(names[i], tensors[i].dtype, tensors[i].shape, tensors[i].data,
            tensors[i].bytes);
      ++written;
      continue;
    }
    const std::vector<size_t> &group = partsOf[names[i]];
    if (group.front() != i)
      continue;
    std::vector<const void *> parts(size_t(e.part.ranks), nullptr);
    for (size_t k : group) {
      const CheckpointEntry &pe = entries[entryOf[k]];
      if (pe.part.ranks != e.part.ranks || pe.part.dim != e.part.dim ||
          pe.part.segments != e.part.segments || pe.shape != e.shape ||
          parts[size_t(pe.partRank)])
        fail("checkpoint '", stepDir, "': the parts of '", names[i],
             "' disagree on their layout");
      parts[size_t(pe.partRank)] = tensors[k].data;
    }
    for (const void *p : parts)
      if (!p)
        fail("checkpoint '", stepDir, "': '", names[i], "' misses a part of ",
             e.part.ranks);
    std::vector<int64_t> shape = e.part.wholeShape(e.shape);
    joined.emplace_back(tensors[i].bytes * size_t(e.part.ranks));
    e.part.join(e.shape, stDTypeSize(e.dtype), parts, joined.back().data());
    w.add(names[i], e.dtype, shape, joined.back().data(), joined.back().size());
    ++written;
  }
  w.setMetadata("format", "pt");
  w.setMetadata("actplace.consolidated_from", stepDir);
  w.setMetadata("actplace.step", std::to_string(st.step));
  auto model = st.extra.find("model");
  if (model != st.extra.end())
    w.setMetadata("actplace.model", model->second);
  w.write(out);
  std::fprintf(stderr, "actplace-ckpt: wrote %zu tensors of step %llu to %s\n",
               written, (unsigned long long)st.step, out.c_str());
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string &a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--version") {
      std::fputs(ap::versionText("actplace-ckpt").c_str(), stdout);
      return 0;
    }
  }
  if (args.empty())
    return usageError("missing command");
  if (args[0] != "consolidate")
    return usageError("unknown command '" + args[0] +
                      "' (expected consolidate)");
  bool withOptimizer = false;
  std::vector<std::string> positional;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--with-optimizer")
      withOptimizer = true;
    else if (args[i].compare(0, 2, "--") == 0)
      return usageError("unknown flag '" + args[i] + "'");
    else
      positional.push_back(args[i]);
  }
  if (positional.size() != 2)
    return usageError("consolidate takes CKPT and OUT.safetensors, got " +
                      std::to_string(positional.size()) + " argument(s)");
  try {
    return consolidate(positional[0], positional[1], withOptimizer);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "actplace-ckpt: error: %s\n", e.what());
    return 1;
  }
}
