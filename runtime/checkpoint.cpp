//===- checkpoint.cpp - Checkpoint save/load and foreign-weight mapping ---===//
#include "runtime/checkpoint.h"

#include "kernels/kernels.h"
#include "runtime/error.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace ap::rt {
namespace {

constexpr const char *kFormat = "actplace-checkpoint-v1";
constexpr const char *kStepTensor = "train/step";

void makeDir(const std::string &path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    fail("checkpoint: cannot create directory '", path,
         "': ", std::strerror(errno));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail("checkpoint: '", path, "' exists and is not a directory");
}

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string readSmallFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string stepFolderName(uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08llu", (unsigned long long)step);
  return buf;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t parseUInt(const std::string &text, const std::string &what) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    fail("checkpoint: ", what, " '", text, "' is not a number");
  return std::stoull(text);
}

} // namespace

std::string checkpointShardName(int rank, int worldSize) {
  if (worldSize == 1)
    return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-rank%05d-of-%05d.safetensors", rank,
                worldSize);
  return buf;
}

namespace {

/// Writes this rank's shard (and, on rank 0 of a distributed save, the
/// index); returns the step folder.
std::string writeShard(const std::string &dir,
                       const std::vector<CheckpointTensor> &tensors,
                       const TrainingState &state, const ShardInfo &shard,
                       const SaveOptions &options) {
  makeDir(dir);
  std::string stepDir = dir + "/" + stepFolderName(state.step);
  makeDir(stepDir);

  SafetensorsWriter w;
  for (const CheckpointTensor &t : tensors) {
    if (t.name == kStepTensor)
      fail("checkpoint: tensor name '", t.name, "' is reserved");
    w.add(t.name, t.dtype, t.shape, t.data, t.bytes);
  }
  int64_t step = int64_t(state.step);
  w.add(kStepTensor, StDType::I64, {}, &step, sizeof(step));
  // "format: pt" is what safetensors.torch writes; it lets PyTorch tooling
  // recognise the file.
  w.setMetadata("format", "pt");
  w.setMetadata("actplace.format", kFormat);
  w.setMetadata("actplace.step", std::to_string(state.step));
  w.setMetadata("actplace.rank", std::to_string(shard.rank));
  w.setMetadata("actplace.world_size", std::to_string(shard.worldSize));
  w.setMetadata("actplace.rng", state.rng.serialize());
  if (!state.data.sourceId.empty())
    w.setMetadata("actplace.data_cursor", state.data.serialize());
  for (const auto &[k, v] : state.extra) {
    if (k.rfind("actplace.", 0) == 0 || k == "format")
      fail("checkpoint: extra key '", k, "' is reserved");
    w.setMetadata("extra." + k, v);
  }
  SafetensorsWriter::WriteOptions wo;
  wo.sync = options.sync;
  wo.failAfterBytes = options.failAfterBytes;
  w.write(stepDir + "/" + checkpointShardName(shard.rank, shard.worldSize), wo);

  if (shard.worldSize > 1 && shard.rank == 0) {
    std::string index = "{\"format\":" + jsonQuote(kFormat) +
                        ",\"step\":" + std::to_string(state.step) +
                        ",\"world_size\":" + std::to_string(shard.worldSize) +
                        ",\"shards\":[";
    for (int r = 0; r < shard.worldSize; ++r)
      index +=
          (r ? "," : "") + jsonQuote(checkpointShardName(r, shard.worldSize));
    index += "]}\n";
    writeFileAtomically(stepDir + "/index.json", index, options.sync);
  }
  return stepDir;
}

/// Runs `phase` on every rank and throws on every rank if it failed on any;
/// the failing rank rethrows its own error.
void agreeOrThrow(const ShardInfo &shard, const char *what, uint64_t step,
                  const std::function<void()> &phase) {
  std::string error;
  try {
    phase();
  } catch (const std::exception &e) {
    error = e.what();
  }
  if (shard.worldSize == 1) {
    if (!error.empty())
      throw Error(error);
    return;
  }
  bool all = shard.allTrue(error.empty());
  if (!error.empty())
    fail(error, " (rank ", shard.rank,
         "; 'latest' still names the previous "
         "checkpoint)");
  if (!all)
    fail("checkpoint: another rank failed while ", what, " step ", step,
         "; 'latest' still names the previous checkpoint");
}

} // namespace

std::string saveCheckpoint(const std::string &dir,
                           const std::vector<CheckpointTensor> &tensors,
                           const TrainingState &state, const ShardInfo &shard,
                           const SaveOptions &options) {
  if (shard.worldSize < 1 || shard.rank < 0 || shard.rank >= shard.worldSize)
    fail("checkpoint: rank ", shard.rank, " outside world of ",
         shard.worldSize);
  if (shard.worldSize > 1 && !shard.allTrue)
    fail("checkpoint: a distributed save needs ShardInfo::allTrue");
  std::string stepDir;
  // Every shard must be durable on every rank before "latest" may name this
  // step.
  agreeOrThrow(shard, "writing the shards of", state.step, [&] {
    stepDir = writeShard(dir, tensors, state, shard, options);
  });
  // Nobody returns before "latest" names this step, so any rank may look it
  // up right after saving.
  agreeOrThrow(shard, "publishing", state.step, [&] {
    if (shard.rank == 0)
      writeFileAtomically(dir + "/latest", stepFolderName(state.step) + "\n",
                          options.sync);
  });
  return stepDir;
}

std::optional<std::string> latestCheckpoint(const std::string &dir) {
  std::string p = dir + "/latest";
  if (!fileExists(p))
    return std::nullopt;
  std::string name = readSmallFile(p);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    fail("checkpoint: '", p, "' is malformed");
  std::string stepDir = dir + "/" + name;
  if (!fileExists(stepDir))
    fail("checkpoint: '", p, "' names '", name, "', which does not exist");
  return stepDir;
}

TrainingState loadCheckpoint(const std::string &stepDir,
                             const std::vector<CheckpointTensor> &tensors,
                             const ShardInfo &shard) {
  // The index (present for distributed saves) tells a world-size mismatch
  // apart from a missing file.
  std::string indexPath = stepDir + "/index.json";
  int savedWorld = 1;
  if (fileExists(indexPath)) {
    JsonValue idx =
        parseJson(readSmallFile(indexPath), "checkpoint: " + indexPath);
    const JsonValue *ws = idx.get("world_size");
    uint64_t w = 0;
    if (!ws || !ws->asUInt(w) || w == 0)
      fail("checkpoint: '", indexPath, "' has no valid world_size");
    savedWorld = int(w);
  }
  if (savedWorld != shard.worldSize)
    fail("checkpoint: '", stepDir, "' was saved by ", savedWorld,
         " rank(s) but this run has ", shard.worldSize,
         " (resharding is not supported)");
  std::string path =
      stepDir + "/" + checkpointShardName(shard.rank, shard.worldSize);
  SafetensorsFile f = SafetensorsFile::open(path);
  f.verifyChecksum();
  if (f.meta("actplace.format") != kFormat)
    fail("checkpoint: '", path, "' is not an actplace checkpoint (format '",
         f.meta("actplace.format"), "')");
  if (f.meta("actplace.rank") != std::to_string(shard.rank) ||
      f.meta("actplace.world_size") != std::to_string(shard.worldSize))
    fail("checkpoint: '", path, "' belongs to rank ", f.meta("actplace.rank"),
         " of ", f.meta("actplace.world_size"));

  // Check everything first, copy afterwards: a failed load leaves the
  // destination buffers untouched.
  std::vector<std::string> problems;
  std::set<std::string> requested;
  for (const CheckpointTensor &t : tensors) {
    requested.insert(t.name);
    const StTensorInfo *info = f.find(t.name);
    if (!info) {
      problems.push_back("missing tensor '" + t.name + "'");
      continue;
    }
    if (info->dtype != t.dtype)
      problems.push_back("tensor '" + t.name + "' is " +
                         stDTypeName(info->dtype) + ", expected " +
                         stDTypeName(t.dtype));
    else if (info->shape != t.shape)
      problems.push_back("tensor '" + t.name + "' has shape " +
                         shapeString(info->shape) + ", expected " +
                         shapeString(t.shape));
    else if (info->bytes() != t.bytes)
      problems.push_back("tensor '" + t.name + "': destination holds " +
                         std::to_string(t.bytes) + " bytes, file " +
                         std::to_string(info->bytes()));
  }
  for (const StTensorInfo &info : f.tensors())
    if (info.name != kStepTensor && !requested.count(info.name))
      problems.push_back("unexpected tensor '" + info.name +
                         "' (the model has no such state)");
  const StTensorInfo *stepInfo = f.find(kStepTensor);
  if (!stepInfo || stepInfo->dtype != StDType::I64 || !stepInfo->shape.empty())
    problems.push_back(std::string("missing scalar I64 '") + kStepTensor + "'");
  if (!problems.empty())
    fail("checkpoint: '", path,
         "' does not match this model:", listProblems(problems, 8));

  TrainingState st;
  st.step = parseUInt(f.meta("actplace.step"), "step");
  int64_t stepTensor;
  std::memcpy(&stepTensor, f.data(*stepInfo), sizeof(stepTensor));
  if (uint64_t(stepTensor) != st.step)
    fail("checkpoint: '", path, "': step tensor ", stepTensor,
         " disagrees with metadata step ", st.step);
  try {
    st.rng = RngState::deserialize(f.meta("actplace.rng"));
  } catch (const std::exception &e) {
    fail("checkpoint: '", path, "': ", e.what());
  }
  if (!f.meta("actplace.data_cursor").empty())
    st.data = DataCursor::deserialize(f.meta("actplace.data_cursor"));
  for (const auto &[k, v] : f.metadata())
    if (k.rfind("extra.", 0) == 0)
      st.extra[k.substr(6)] = v;

  for (const CheckpointTensor &t : tensors)
    if (t.bytes)
      std::memcpy(t.data, f.data(*f.find(t.name)), t.bytes);
  return st;
}

//===----------------------------------------------------------------------===//
// Name mapping
//===----------------------------------------------------------------------===//

namespace {

constexpr const char *kIndex = "{i}";

std::vector<std::string> splitPattern(const std::string &p) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t at = p.find(kIndex, start);
    if (at == std::string::npos) {
      parts.push_back(p.substr(start));
      return parts;
    }
    parts.push_back(p.substr(start, at - start));
    start = at + 3;
  }
}

/// Matches `name` against literal parts separated by "{i}" slots (one or
/// more digits each); fills the captured numbers.
bool matchPattern(const std::vector<std::string> &parts,
                  const std::string &name, std::vector<std::string> &captures) {
  captures.clear();
  size_t pos = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (name.compare(pos, parts[i].size(), parts[i]) != 0)
      return false;
    pos += parts[i].size();
    if (i + 1 == parts.size())
      return pos == name.size();
    size_t digits = pos;
    while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9')
      ++digits;
    if (digits == pos)
      return false;
    captures.push_back(name.substr(pos, digits - pos));
    pos = digits;
  }
  return false;
}

size_t countSlots(const std::string &p) { return splitPattern(p).size() - 1; }

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24 exactly representable in float.
    float v = std::ldexp(float(mant), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool isFloat(StDType t) {
  return t == StDType::BF16 || t == StDType::F16 || t == StDType::F32 ||
         t == StDType::F64;
}

double readFloat(const uint8_t *p, StDType t, size_t i) {
  switch (t) {
  case StDType::BF16: {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return ap::kernels::bf16::toFloat(b);
  }
  case StDType::F16: {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return halfToFloat(b);
  }
  case StDType::F32: {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  default: {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return d;
  }
  }
}

void writeFloat(void *dst, StDType t, size_t i, double v) {
  switch (t) {
  case StDType::BF16: {
    // Round once from the source value: via float is exact for BF16/F16/F32
    // sources; F64 sources round twice (to float, then bf16), documented.
    uint16_t b = ap::kernels::bf16::fromFloat(float(v));
    std::memcpy(static_cast<uint8_t *>(dst) + 2 * i, &b, 2);
    break;
  }
  case StDType::F32: {
    float f = float(v);
    std::memcpy(static_cast<uint8_t *>(dst) + 4 * i, &f, 4);
    break;
  }
  default:
    std::memcpy(static_cast<uint8_t *>(dst) + 8 * i, &v, 8);
    break;
  }
}

} // namespace

void NameMapping::addRule(const std::string &externalPattern,
                          const std::string &internalPattern) {
  if (externalPattern.empty() || internalPattern.empty())
    fail("name mapping: empty pattern");
  if (countSlots(externalPattern) != countSlots(internalPattern))
    fail("name mapping: '", externalPattern, "' -> '", internalPattern,
         "' use different numbers of {i} slots");
  if (externalPattern.find(std::string(kIndex) + kIndex) != std::string::npos)
    fail("name mapping: '", externalPattern, "' has adjacent {i} slots");
  rules_.emplace_back(externalPattern, internalPattern);
}

NameMapping NameMapping::parse(const std::string &text) {
  NameMapping m;
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    size_t hash = line.find('#');
    if (hash != std::string::npos)
      line.resize(hash);
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos)
      continue;
    size_t arrow = line.find("->");
    if (arrow == std::string::npos)
      fail("name mapping: line ", lineNo, ": expected 'external -> internal'");
    auto trim = [](std::string s) {
      size_t x = s.find_first_not_of(" \t\r");
      size_t y = s.find_last_not_of(" \t\r");
      return x == std::string::npos ? std::string() : s.substr(x, y - x + 1);
    };
    std::string ext = trim(line.substr(0, arrow));
    std::string in2 = trim(line.substr(arrow + 2));
    if (ext.empty() || in2.empty() || ext.find(' ') != std::string::npos ||
        in2.find(' ') != std::string::npos)
      fail("name mapping: line ", lineNo, ": expected 'external -> internal'");
    try {
      m.addRule(ext, in2);
    } catch (const Error &e) {
      fail("name mapping: line ", lineNo, ": ", e.what());
    }
  }
  return m;
}

std::optional<std::string> NameMapping::map(const std::string &external) const {
  std::vector<std::string> caps;
  for (const auto &[ext, internal] : rules_) {
    if (!matchPattern(splitPattern(ext), external, caps))
      continue;
    std::vector<std::string> parts = splitPattern(internal);
    std::string out = parts[0];
    for (size_t i = 1; i < parts.size(); ++i)
      out += caps[i - 1] + parts[i];
    return out;
  }
  return std::nullopt;
}

MappedLoadReport loadMappedWeights(const std::string &path,
                                   const NameMapping &mapping,
                                   const std::vector<CheckpointTensor> &tensors,
                                   bool allowUnmapped) {
  SafetensorsFile f = SafetensorsFile::open(path);
  // External files rarely carry our checksum; verify it when they do.
  if (!f.meta("actplace.sha256").empty())
    f.verifyChecksum();
  std::map<std::string, const CheckpointTensor *> dest;
  for (const CheckpointTensor &t : tensors)
    dest[t.name] = &t;
  std::map<std::string, const StTensorInfo *> source; // our name -> file tensor
  MappedLoadReport report;
  std::vector<std::string> problems;
  for (const StTensorInfo &info : f.tensors()) {
    std::optional<std::string> ours = mapping.map(info.name);
    if (!ours || !dest.count(*ours)) {
      report.unmapped.push_back(info.name);
      if (!allowUnmapped)
        problems.push_back(ours ? "'" + info.name + "' maps to '" + *ours +
                                      "', which the model does not have"
                                : "no rule maps '" + info.name + "'");
      continue;
    }
    if (source.count(*ours)) {
      problems.push_back("'" + info.name + "' and '" + source[*ours]->name +
                         "' both map to '" + *ours + "'");
      continue;
    }
    source[*ours] = &info;
    const CheckpointTensor &t = *dest[*ours];
    if (info.shape != t.shape)
      problems.push_back("'" + info.name + "' has shape " +
                         shapeString(info.shape) + " but '" + t.name +
                         "' needs " + shapeString(t.shape));
    else if (info.dtype != t.dtype &&
             !(isFloat(info.dtype) &&
               (t.dtype == StDType::BF16 || t.dtype == StDType::F32 ||
                t.dtype == StDType::F64)))
      problems.push_back("'" + info.name + "' is " + stDTypeName(info.dtype) +
                         ", cannot convert to " + stDTypeName(t.dtype));
    else if (t.bytes != info.numElements() * stDTypeSize(t.dtype))
      problems.push_back("destination '" + t.name + "' has the wrong size");
  }
  for (const CheckpointTensor &t : tensors)
    if (!source.count(t.name))
      problems.push_back("no tensor in the file maps to '" + t.name + "'");
  if (!problems.empty())
    fail("checkpoint: cannot load weights from '", path,
         "':", listProblems(problems, 8));
  for (const auto &[ours, info] : source) {
    const CheckpointTensor &t = *dest[ours];
    if (info->dtype == t.dtype) {
      std::memcpy(t.data, f.data(*info), size_t(info->bytes()));
    } else {
      size_t n = size_t(info->numElements());
      for (size_t i = 0; i < n; ++i)
        writeFloat(t.data, t.dtype, i,
                   readFloat(f.data(*info), info->dtype, i));
    }
    report.loaded.push_back(info->name);
  }
  return report;
}

} // namespace ap::rt
