//===- CostModel.cpp - predicted time and bytes of train ops --------------===//
//
// The formulas are stated (and derived) in docs/cost-model.md; keep the two
// in step. Time only: the scratch an op's kernel needs is the kernel
// library's own query (KernelWorkspace.h).
//
//===----------------------------------------------------------------------===//

#include "passes/analysis/CostModel.h"
#include "passes/analysis/SavedActivations.h"
#include "support/JsonInteger.h"

#include "dialect/train/TrainOps.h"
#include "passes/analysis/GraphSummary.h"
#include "support/JsonLimits.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>

using namespace mlir;
using namespace ap::train;

//===----------------------------------------------------------------------===//
// DeviceProfile
//===----------------------------------------------------------------------===//

llvm::Expected<DeviceProfile> DeviceProfile::load(StringRef jsonPath) {
  auto buffer = llvm::MemoryBuffer::getFile(jsonPath, /*IsText=*/true);
  if (!buffer)
    return llvm::createStringError(
        buffer.getError(), "cannot read device profile '%s': %s",
        jsonPath.str().c_str(), buffer.getError().message().c_str());
  // Every placement pass reads the profile, and the placement search runs
  // them on thousands of candidates: profiles parsed before are kept, by
  // path and content (a file rewritten in between is parsed again).
  // Looked up by path, then content, without copying either (std::less<>).
  static std::mutex mutex;
  static std::map<std::string,
                  std::map<std::string, DeviceProfile, std::less<>>,
                  std::less<>>
      parsed;
  std::string_view path(jsonPath.data(), jsonPath.size());
  std::string_view content((*buffer)->getBufferStart(),
                           (*buffer)->getBufferSize());
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto byPath = parsed.find(path); byPath != parsed.end())
      if (auto it = byPath->second.find(content); it != byPath->second.end())
        return it->second;
  }
  llvm::Expected<DeviceProfile> p = parse((*buffer)->getBuffer(), jsonPath);
  if (p) {
    static uint64_t loads = 0;
    std::lock_guard<std::mutex> lock(mutex);
    auto [it, inserted] =
        parsed[std::string(path)].try_emplace(std::string(content), *p);
    if (inserted)
      it->second.loadedAs = ++loads;
    p->loadedAs = it->second.loadedAs;
  }
  return p;
}

FailureOr<CostModel> CostModel::fromProfile(StringRef profilePath,
                                            Operation *diagnosticOp,
                                            StringRef who) {
  DeviceProfile p;
  if (!profilePath.empty()) {
    llvm::Expected<DeviceProfile> prof = DeviceProfile::load(profilePath);
    if (!prof) {
      diagnosticOp->emitError() << who << llvm::toString(prof.takeError());
      return failure();
    }
    p = std::move(*prof);
  }
  // The compile's --kernels choice, carried by the module.
  auto module = dyn_cast<ModuleOp>(diagnosticOp);
  if (!module)
    module = diagnosticOp->getParentOfType<ModuleOp>();
  if (module)
    if (auto ops = module->getAttrOfType<ArrayAttr>(kModuleGeneratedOpsAttr))
      for (Attribute a : ops)
        if (auto name = dyn_cast<StringAttr>(a))
          p.generatedOps.insert(name.str());
  // The models of one loaded profile (or of the defaults) and one kernel
  // choice are the same model: they share an id, so valuesOf resolves each
  // op name once per thread for all of them. Every placement pass builds
  // its own model, and the placement search runs them on thousands of
  // clones.
  static std::mutex mutex;
  static std::map<std::pair<uint64_t, std::string>, uint64_t> ids;
  std::pair<uint64_t, std::string> key(
      p.loadedAs, llvm::join(p.generatedOps.begin(), p.generatedOps.end(),
                             std::string(1, '\0')));
  CostModel model(std::move(p));
  std::lock_guard<std::mutex> lock(mutex);
  model.id = ids.try_emplace(std::move(key), model.id).first->second;
  return model;
}

llvm::Expected<DeviceProfile> DeviceProfile::parse(StringRef json,
                                                   StringRef origin) {
  auto fail = [&](const llvm::Twine &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "device profile '" + origin + "': " + msg);
  };
  // Before the recursive parser: bounded nesting, and no constant given
  // twice (the parser would keep one of them without a word).
  if (std::optional<ap::support::JsonScanProblem> problem =
          ap::support::scanJsonLimits({json.data(), json.size()}))
    return fail(llvm::formatv("line {0}, column {1}: {2}", problem->line,
                              problem->column, problem->message));
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(json);
  if (!parsed)
    return fail("invalid JSON: " + llvm::toString(parsed.takeError()));
  const llvm::json::Object *obj = parsed->getAsObject();
  if (!obj)
    return fail("expected a JSON object of device constants");

  DeviceProfile p;
  // One table maps keys to fields so the key list in messages and the
  // fields read cannot drift apart.
  struct Field {
    llvm::StringLiteral key;
    double DeviceProfile::*member;
  };
  static const Field fields[] = {
      {"peakFlops", &DeviceProfile::peakFlops},
      {"deviceMemoryBytes", &DeviceProfile::deviceMemoryBytes},
      {"memBandwidth", &DeviceProfile::memBandwidth},
      {"launchLatency", &DeviceProfile::launchLatency},
      {"d2hBandwidth", &DeviceProfile::d2hBandwidth},
      {"h2dBandwidth", &DeviceProfile::h2dBandwidth},
      {"duplexBandwidth", &DeviceProfile::duplexBandwidth},
      {"computeScale", &DeviceProfile::computeScale},
      {"copySlowdownPerByte", &DeviceProfile::copySlowdownPerByte},
      {"copyHoldSlack", &DeviceProfile::copyHoldSlack},
      {"sideStreamCopyScale", &DeviceProfile::sideStreamCopyScale},
      {"allReduceBusBandwidth", &DeviceProfile::allReduceBusBandwidth},
      {"allReduceLatency", &DeviceProfile::allReduceLatency},
      {"allGatherBusBandwidth", &DeviceProfile::allGatherBusBandwidth},
      {"allGatherLatency", &DeviceProfile::allGatherLatency},
      {"reduceScatterBusBandwidth", &DeviceProfile::reduceScatterBusBandwidth},
      {"reduceScatterLatency", &DeviceProfile::reduceScatterLatency},
  };
  // Sorted keys give a deterministic first error for a file with several.
  SmallVector<StringRef> keys;
  for (const auto &kv : *obj)
    keys.push_back(kv.first);
  llvm::sort(keys);
  for (StringRef key : keys) {
    if (key == "h2dSlowdown" || key == "d2hSlowdown") {
      const llvm::json::Object *ops = obj->get(key)->getAsObject();
      if (!ops)
        return fail("field '" + key +
                    "' must be an object of op names (or \"*\") to "
                    "non-negative numbers");
      auto &table = key == "h2dSlowdown" ? p.h2dSlowdown : p.d2hSlowdown;
      for (const auto &kv : *ops) {
        std::optional<double> v = kv.second.getAsNumber();
        if (!v || !(*v >= 0))
          return fail(key.str() + "['" + kv.first.str() +
                      "'] must be a non-negative number");
        if (!std::isfinite(*v))
          return fail(key.str() + "['" + kv.first.str() +
                      "'] must be finite, got " +
                      llvm::formatv("{0}", *v).str());
        table[kv.first.str()] = *v;
      }
      continue;
    }
    // A table that replaces its default: every entry a number passing `ok`.
    auto replaceTable = [&](OpTable &table, const std::string &objectError,
                            auto ok,
                            const std::string &entryError) -> llvm::Error {
      const llvm::json::Object *ops = obj->get(key)->getAsObject();
      if (!ops)
        return fail(objectError);
      table.clear();
      for (const auto &kv : *ops) {
        std::optional<double> v = kv.second.getAsNumber();
        if (!v || !ok(*v))
          return fail(key.str() + "['" + kv.first.str() + "'] " + entryError);
        table[kv.first.str()] = *v;
      }
      return llvm::Error::success();
    };
    if (key == "sideHostScale") {
      if (llvm::Error e = replaceTable(
              p.sideHostScale,
              "field 'sideHostScale' must be an object of op names to "
              "numbers >= 1",
              [](double v) { return v >= 1 && std::isfinite(v); },
              "must be a finite number >= 1"))
        return std::move(e);
      continue;
    }
    if (key == "sideCapacity") {
      if (llvm::Error e = replaceTable(
              p.sideCapacity,
              "field 'sideCapacity' must be an object of op names (or \"*\") "
              "to numbers in [0, 1]",
              [](double v) { return v >= 0 && v <= 1; },
              "must be a number in [0, 1]"))
        return std::move(e);
      continue;
    }
    if (key == "sideSmPercent") {
      std::optional<int64_t> v = ap::jsonInteger(*obj->get(key));
      if (!v || *v < 1 || *v > 100)
        return fail("field 'sideSmPercent' must be a whole number from 1 to "
                    "100 (side-stream GEMMs' share of the SMs, percent)");
      p.sideSmPercent = *v;
      continue;
    }
    // Where the numbers came from (command, commit, date, binary): kept in
    // the file so that a profile carries its own record; the model reads
    // none of it.
    if (key == "provenance") {
      const llvm::json::Object *entries = obj->get(key)->getAsObject();
      if (!entries)
        return fail("field 'provenance' must be an object of strings (what "
                    "produced the profile: command, commit, date, ...)");
      for (const auto &kv : *entries)
        if (!kv.second.getAsString())
          return fail("provenance['" + kv.first.str() + "'] must be a string");
      continue;
    }
    if (key == "generatedKernelRatio") {
      const llvm::json::Object *ops = obj->get(key)->getAsObject();
      if (!ops)
        return fail("field 'generatedKernelRatio' must be an object of op "
                    "names to positive numbers (generated over library "
                    "kernel time)");
      for (const auto &kv : *ops) {
        std::optional<double> v = kv.second.getAsNumber();
        if (!v || !(*v > 0) || !std::isfinite(*v))
          return fail("generatedKernelRatio['" + kv.first.str() +
                      "'] must be a positive finite number");
        p.generatedKernelRatio[kv.first.str()] = *v;
      }
      continue;
    }
    if (key == "opScale") {
      const llvm::json::Object *ops = obj->get(key)->getAsObject();
      if (!ops)
        return fail("field 'opScale' must be an object of op names to "
                    "positive numbers");
      for (const auto &kv : *ops) {
        std::optional<double> v = kv.second.getAsNumber();
        if (!v || !(*v > 0))
          return fail("opScale['" + kv.first.str() +
                      "'] must be a positive number");
        if (!std::isfinite(*v))
          return fail("opScale['" + kv.first.str() + "'] must be finite, got " +
                      llvm::formatv("{0}", *v).str());
        p.opScale[kv.first.str()] = *v;
      }
      continue;
    }
    const Field *field =
        llvm::find_if(fields, [&](const Field &f) { return f.key == key; });
    if (field == std::end(fields)) {
      std::string known;
      for (const Field &f : fields)
        known += (known.empty() ? "" : ", ") + f.key.str();
      known += ", opScale, h2dSlowdown, d2hSlowdown, sideCapacity, "
               "sideHostScale, sideSmPercent, generatedKernelRatio, "
               "provenance";
      return fail("unknown field '" + key + "' (known fields: " + known + ")");
    }
    std::optional<double> value = obj->get(key)->getAsNumber();
    if (!value)
      return fail("field '" + key + "' must be a number");
    // The latencies, the copy slowdown and the hold slack may be 0 (an
    // idealised device);
    // rates and the scale must be positive because the model divides by
    // them or multiplies every cost by them.
    bool isLatency = field->member == &DeviceProfile::launchLatency ||
                     field->member == &DeviceProfile::copySlowdownPerByte ||
                     field->member == &DeviceProfile::copyHoldSlack ||
                     field->member == &DeviceProfile::allReduceLatency ||
                     field->member == &DeviceProfile::allGatherLatency ||
                     field->member == &DeviceProfile::reduceScatterLatency;
    if (!(isLatency ? *value >= 0 : *value > 0))
      return fail("field '" + key + "' must be " +
                  (isLatency ? "non-negative" : "positive") + ", got " +
                  llvm::formatv("{0}", *value));
    // 1e400 parses as infinity; a rate or scale of inf makes predictions 0,
    // inf or NaN.
    if (!std::isfinite(*value))
      return fail("field '" + key + "' must be finite, got " +
                  llvm::formatv("{0}", *value));
    // Finite but extreme values still make every prediction infinite (a
    // kernel's work over a rate of 1e-300 per second, a cost times a scale
    // of 1e300), so rates are at least what any device has and the other
    // fields at most a bound no calibration comes near.
    bool isRate = field->member == &DeviceProfile::peakFlops ||
                  field->member == &DeviceProfile::memBandwidth ||
                  field->member == &DeviceProfile::d2hBandwidth ||
                  field->member == &DeviceProfile::h2dBandwidth ||
                  field->member == &DeviceProfile::duplexBandwidth ||
                  field->member == &DeviceProfile::allReduceBusBandwidth ||
                  field->member == &DeviceProfile::allGatherBusBandwidth ||
                  field->member == &DeviceProfile::reduceScatterBusBandwidth;
    if (isRate && *value < 1e3)
      return fail("field '" + key +
                  "' must be at least 1e3 (a rate per "
                  "second), got " +
                  llvm::formatv("{0:e}", *value).str());
    // A capacity in bytes: from one MiB to a petabyte.
    bool isBytes = field->member == &DeviceProfile::deviceMemoryBytes;
    if (isBytes && !(*value >= 1048576 && *value <= 1e15))
      return fail("field '" + key +
                  "' must be a byte count from 1048576 to 1e15, got " +
                  llvm::formatv("{0:e}", *value).str());
    if (!isRate && !isBytes && *value > 1e6)
      return fail("field '" + key + "' must be at most 1e6, got " +
                  llvm::formatv("{0:e}", *value).str());
    p.*(field->member) = *value;
  }
  if (p.slowdownBesideCopies() && p.copySlowdownPerByte > 0)
    return fail("give either copySlowdownPerByte (copies slow the op that "
                "issues them) or h2dSlowdown / d2hSlowdown (copies slow the "
                "ops beside them), not both");
  return p;
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

namespace {

double bytesOf(Value v) {
  if (!v || !isa<RankedTensorType>(v.getType()))
    return 0;
  return static_cast<double>(tensorBytes(v.getType()));
}

double numel(Value v) {
  return static_cast<double>(cast<ShapedType>(v.getType()).getNumElements());
}

int64_t dim(Value v, unsigned i) {
  return cast<ShapedType>(v.getType()).getDimSize(i);
}

/// Bytes every operand and result occupies: what an op that reads all its
/// inputs once and writes all its results once moves.
double operandAndResultBytes(Operation *op) {
  double b = 0;
  for (Value v : op->getOperands())
    b += bytesOf(v);
  for (Value v : op->getResults())
    b += bytesOf(v);
  return b;
}

/// Main-grad traffic of one FP32 accumulation (+=): read and write.
double mainGradBytes(Value weight) { return 2.0 * 4.0 * numel(weight); }

/// `amount / rate`: seconds to move or compute `amount` at `rate` per
/// second. DeviceProfile::parse refuses rates that are not positive and
/// finite; a profile built otherwise must still not make the simulation
/// see NaN (0 / 0): nothing takes no time, anything else at rate <= 0 never
/// ends.
double secondsAt(double amount, double rate) {
  if (amount <= 0)
    return 0;
  if (!(rate > 0))
    return std::numeric_limits<double>::infinity();
  return amount / rate;
}

/// Chunked gated-delta-rule FLOPs per (sequence, chunk, value head); the
/// derivation is in docs/cost-model.md.
double gdnChunkFlops(double C, double dk, double dv, bool backward) {
  if (!backward)
    return C * C * (6 * dk + 4 * dv) + 6 * C * dk * dv + C * C * C / 3;
  return C * C * (18 * dk + 10 * dv) + 16 * C * dk * dv + 4 * C * C * C;
}

/// Trainable parameter elements of the module holding `op`.
double trainableElements(Operation *op) {
  auto module = op->getParentOfType<ModuleOp>();
  double n = 0;
  if (module)
    for (auto param : module.getOps<ParamOp>())
      if (!param.getFrozen())
        n += cast<ShapedType>(param.getType()).getNumElements();
  return n;
}

} // namespace

//===----------------------------------------------------------------------===//
// CostModel
//===----------------------------------------------------------------------===//

CostModel::CostModel(DeviceProfile p) : prof(std::move(p)) {
  static std::atomic<uint64_t> next{1};
  id = next.fetch_add(1);
}

CostModel::NameValues CostModel::valuesOf(Operation *op) const {
  thread_local llvm::DenseMap<std::pair<uint64_t, const void *>, NameValues>
      cache;
  auto key = std::make_pair(id, op->getName().getAsOpaquePointer());
  auto it = cache.find(key);
  if (it != cache.end())
    return it->second;
  NameValues v = resolve(op);
  cache.try_emplace(key, v);
  return v;
}

CostModel::NameValues CostModel::resolve(Operation *op) const {
  NameValues v;
  auto lookup = [&](const OpTable &table, bool star) -> const double * {
    auto it = table.find(std::string_view(op->getName().getStringRef()));
    if (it == table.end() && star)
      it = table.find("*");
    return it == table.end() ? nullptr : &it->second;
  };
  if (const double *d = lookup(prof.h2dSlowdown, true))
    v.h2dSlowdown = *d;
  if (const double *d = lookup(prof.d2hSlowdown, true))
    v.d2hSlowdown = *d;
  if (const double *d = lookup(prof.sideCapacity, true))
    v.sideCapacity = *d;
  if (const double *d = lookup(prof.sideHostScale, false))
    v.sideHostScale = *d;
  auto scaled =
      prof.opScale.find(std::string_view(op->getName().getStringRef()));
  // The three LM-head ops run the same chunked GEMM + cross-entropy kernels
  // (the fused one is the grad op's entry): a profile timed with one form of
  // the loss (fuse-loss-grad on or off) has scales for that form's ops only,
  // and they stand for the other form's.
  if (isa<LMHeadCrossEntropyOp, LMHeadCrossEntropyGradOp,
          LMHeadCrossEntropyWithGradOp>(op))
    for (StringRef alias : {LMHeadCrossEntropyWithGradOp::getOperationName(),
                            LMHeadCrossEntropyGradOp::getOperationName(),
                            LMHeadCrossEntropyOp::getOperationName()})
      if (scaled == prof.opScale.end())
        scaled = prof.opScale.find(std::string_view(alias));
  // The input half of a split linear backward runs the dx GEMM of
  // linear_grad; a profile timed before the split has only the whole op.
  if (isa<LinearInputGradOp>(op) && scaled == prof.opScale.end())
    scaled =
        prof.opScale.find(std::string_view(LinearGradOp::getOperationName()));
  // The rebuilding norm backward is the norm backward kernel with one more
  // store.
  if (isa<RMSNormGradRebuildOp>(op) && scaled == prof.opScale.end())
    scaled =
        prof.opScale.find(std::string_view(RMSNormGradOp::getOperationName()));
  v.scale = scaled == prof.opScale.end() ? prof.computeScale : scaled->second;
  StringRef name = op->getName().getStringRef();
  if (prof.generatedOps.count(name)) {
    // A backward that rebuilds a recomputed output runs its op's kernel.
    StringRef base = name;
    base.consume_back("_rebuild");
    auto ratio = prof.generatedKernelRatio.find(std::string_view(base));
    if (ratio != prof.generatedKernelRatio.end())
      v.generated = ratio->second;
  }
  return v;
}

double CostModel::generatedFactor(Operation *op, const NameValues &v) const {
  static constexpr std::string_view kFused = "train.add_rms_norm",
                                    kGradFused = "train.rms_norm_grad_add",
                                    kSumFused = "train.rms_norm_grad_sum";
  auto fusedRatio = [&](std::string_view name) {
    auto ratio = prof.generatedKernelRatio.find(name);
    return ratio == prof.generatedKernelRatio.end() ? v.generated
                                                    : ratio->second;
  };
  // The RMSNorm backward + residual add pairs exec-generate-kernels fuses:
  // a norm gradient whose dx only an add reads.
  if (prof.generatedOps.count(kGradFused)) {
    auto onlyReadByAdd = [](Value dx) {
      return dx.hasOneUse() && isa<AddOp>(*dx.getUsers().begin());
    };
    if (auto grad = dyn_cast<RMSNormGradOp>(op))
      if (onlyReadByAdd(grad->getResult(0)))
        return fusedRatio(kGradFused);
    if (isa<AddOp>(op))
      for (Value in : op->getOperands())
        if (auto grad = in.getDefiningOp<RMSNormGradOp>())
          if (onlyReadByAdd(in))
            return fusedRatio(kGradFused);
  }
  // The chains of adds exec-generate-kernels folds into the norm gradient
  // that reads their sum as dy: an add whose sum only that gradient, or
  // only the next add of such a chain, reads, and the gradient itself (the
  // chain's length limit and the back-to-back order are the exec-level
  // fusion's; a prediction takes every such add as fused).
  if (prof.generatedOps.count(kSumFused)) {
    auto inChain = [](Operation *add) {
      while (true) {
        Value sum = add->getResult(0);
        if (!sum.hasOneUse())
          return false;
        Operation *user = *sum.getUsers().begin();
        if (auto grad = dyn_cast<RMSNormGradOp>(user))
          return grad.getResultGrad() == sum;
        if (!isa<AddOp>(user))
          return false;
        add = user;
      }
    };
    if (isa<AddOp>(op) && inChain(op))
      return fusedRatio(kSumFused);
    // (A gradient fused with its residual add took that ratio above.)
    if (auto grad = dyn_cast<RMSNormGradOp>(op)) {
      Operation *dyDef = grad.getResultGrad().getDefiningOp();
      if (dyDef && isa<AddOp>(dyDef) && inChain(dyDef))
        return fusedRatio(kSumFused);
    }
  }
  if (!prof.generatedOps.count(kFused) || !isa<AddOp, RMSNormOp>(op))
    return v.generated;
  // The pairs exec-generate-kernels fuses (passes/analysis/KernelFusion.h):
  // a residual add whose sum a norm reads as its x.
  bool fused = false;
  if (auto add = dyn_cast<AddOp>(op))
    fused = llvm::any_of(add->getUsers(), [&](Operation *user) {
      auto norm = dyn_cast<RMSNormOp>(user);
      return norm && norm->getOperand(0) == add->getResult(0);
    });
  else
    fused = op->getOperand(0).getDefiningOp<AddOp>() != nullptr;
  return fused ? fusedRatio(kFused) : v.generated;
}

double CostModel::copyBandwidth(CopyDirection dir,
                                bool otherDirectionBusy) const {
  double own = dir == CopyDirection::DeviceToHost ? prof.d2hBandwidth
                                                  : prof.h2dBandwidth;
  if (!otherDirectionBusy)
    return own;
  double both = prof.d2hBandwidth + prof.h2dBandwidth;
  double share = both > 0 ? own / both : 0;
  // Sharing never makes one direction faster than it is alone.
  return std::min(own, prof.duplexBandwidth * share);
}

double CostModel::slowdownBeside(Operation *op, CopyDirection dir) const {
  const auto &table =
      dir == CopyDirection::HostToDevice ? prof.h2dSlowdown : prof.d2hSlowdown;
  if (table.empty())
    return 0;
  NameValues v = valuesOf(op);
  return dir == CopyDirection::HostToDevice ? v.h2dSlowdown : v.d2hSlowdown;
}

double CostModel::sideCapacity(Operation *op) const {
  return prof.sideCapacity.empty() ? 0 : valuesOf(op).sideCapacity;
}

double CostModel::collectiveSeconds(Collective kind, int64_t bytes,
                                    int64_t ranks) const {
  if (ranks <= 1 || bytes <= 0)
    return 0;
  double n = static_cast<double>(ranks);
  // Bytes each rank sends (and receives) over its link, as a share of the
  // buffer: a ring all-reduce is a reduce-scatter then an all-gather.
  double share = (n - 1) / n;
  double busBandwidth, latency;
  switch (kind) {
  case Collective::AllReduce:
    share *= 2;
    busBandwidth = prof.allReduceBusBandwidth;
    latency = prof.allReduceLatency;
    break;
  case Collective::AllGather:
    busBandwidth = prof.allGatherBusBandwidth;
    latency = prof.allGatherLatency;
    break;
  case Collective::ReduceScatter:
    busBandwidth = prof.reduceScatterBusBandwidth;
    latency = prof.reduceScatterLatency;
    break;
  }
  return latency + secondsAt(share * static_cast<double>(bytes), busBandwidth);
}

double CostModel::copySeconds(int64_t bytes, CopyDirection dir,
                              bool otherDirectionBusy) const {
  return secondsAt(static_cast<double>(bytes),
                   copyBandwidth(dir, otherDirectionBusy));
}

double CostModel::copySeconds(int64_t bytes, bool otherDirectionBusy) const {
  return std::max(
      copySeconds(bytes, CopyDirection::DeviceToHost, otherDirectionBusy),
      copySeconds(bytes, CopyDirection::HostToDevice, otherDirectionBusy));
}

OpCost CostModel::cost(Operation *op) const {
  if (!op->getDialect() || op->getDialect()->getNamespace() != "train")
    return {};
  OpCost c;
  // Ops that launch nothing: symbol reads, views, terminators, the loop
  // itself (its body is costed op by op) and the placement ops, whose
  // copies run on the d2h / h2d queues (StreamSimulation).
  if (isa<ParamRefOp, ReshapeOp, YieldOp, MicrobatchLoopOp, WaitOp,
          TensorParallelCopyOp, SequenceParallelShardOp>(op))
    return c;
  // Sequence parallelism's all-gather and reduce-scatter, priced on the
  // whole [B, T, ...] buffer at the profile's rates.
  if (auto g = dyn_cast<SequenceParallelGatherOp>(op)) {
    c.seconds =
        collectiveSeconds(Collective::AllGather, tensorBytes(g.getType()),
                          tensorParallelSize(op));
    return c;
  }
  if (auto s = dyn_cast<SequenceParallelScatterOp>(op)) {
    c.seconds = collectiveSeconds(Collective::ReduceScatter,
                                  tensorBytes(s.getInput().getType()),
                                  tensorParallelSize(op));
    return c;
  }
  // A tensor-parallel sum runs on the compute stream, in the step's order:
  // the collective's time at the profile's all-reduce rates.
  if (auto reduce = dyn_cast<TensorParallelReduceOp>(op)) {
    c.seconds =
        collectiveSeconds(Collective::AllReduce, tensorBytes(reduce.getType()),
                          tensorParallelSize(op));
    return c;
  }
  // Pipeline sends and receives run on the communication stream.
  if (isa<PipelineSendOp, PipelineRecvOp>(op))
    return c;
  // The copy itself runs on the d2h / h2d queue (StreamSimulation); the
  // compute stream only pays the measured slowdown copies cause beside it.
  if (isa<OffloadOp, ReloadOp>(op)) {
    // With per-op slowdowns the simulation charges the ops beside the copy.
    if (prof.slowdownBesideCopies())
      return c;
    Value moved = isa<OffloadOp>(op) ? op->getOperand(0) : op->getResult(0);
    c.seconds = prof.copySlowdownPerByte *
                double(tensorBytes(cast<RankedTensorType>(moved.getType())));
    return c;
  }

  bool handled =
      llvm::TypeSwitch<Operation *, bool>(op)
          .Case([&](EmbeddingOp e) {
            // Gather: read one table row per token, write it.
            c.bytes = bytesOf(e.getTokens()) + 2 * bytesOf(e.getResult());
            return true;
          })
          .Case([&](EmbeddingGradOp e) {
            // Scatter-add of one FP32 main-grad row per token.
            double rowElems = numel(e.getResultGrad());
            c.bytes = bytesOf(e.getTokens()) + bytesOf(e.getResultGrad()) +
                      2 * 4 * rowElems;
            c.flops = rowElems;
            return true;
          })
          .Case([&](LinearOp l) {
            double K = dim(l.getWeight(), 1), O = dim(l.getWeight(), 0);
            double M = numel(l.getInput()) / K;
            c.flops = 2 * M * O * K;
            c.bytes = operandAndResultBytes(op);
            return true;
          })
          .Case([&](LinearGradOp l) {
            double K = dim(l.getWeight(), 1), O = dim(l.getWeight(), 0);
            double M = numel(l.getInput()) / K;
            c.bytes = bytesOf(l.getResultGrad());
            if (Value dx = l.getInputGrad()) {
              c.flops += 2 * M * O * K;
              c.bytes += bytesOf(l.getWeight()) + bytesOf(dx);
            }
            if (l.getWeightGradAttr()) {
              c.flops += 2 * M * O * K;
              c.bytes += bytesOf(l.getInput()) + mainGradBytes(l.getWeight());
            }
            return true;
          })
          .Case([&](LinearInputGradOp l) {
            double K = dim(l.getWeight(), 1), O = dim(l.getWeight(), 0);
            double M = numel(l.getResultGrad()) / O;
            c.flops = 2 * M * O * K;
            c.bytes = operandAndResultBytes(op);
            return true;
          })
          .Case<RMSNormGradOp, RMSNormGradRebuildOp, GatedRMSNormGradOp>(
              [&](auto n) {
                c.bytes = operandAndResultBytes(op);
                if (n.getWeightGradAttr())
                  c.bytes += mainGradBytes(n.getWeight());
                return true;
              })
          .Case([&](ShortConvGradOp s) {
            c.bytes = operandAndResultBytes(op);
            if (s.getWeightGradAttr())
              c.bytes += mainGradBytes(s.getWeight());
            return true;
          })
          .Case([&](GDNGatesGradOp g) {
            c.bytes = operandAndResultBytes(op);
            if (g.getALogGradAttr())
              c.bytes += mainGradBytes(g.getALog());
            if (g.getDtBiasGradAttr())
              c.bytes += mainGradBytes(g.getDtBias());
            return true;
          })
          .Case([&](GatedDeltaRuleOp g) {
            int64_t B = dim(g.getV(), 0), T = dim(g.getV(), 1);
            int64_t Hv = dim(g.getV(), 2), dv = dim(g.getV(), 3);
            int64_t dk = dim(g.getQ(), 3), C = g.getChunkSize();
            int64_t NT = (T + C - 1) / C;
            c.flops = double(B * NT * Hv) * gdnChunkFlops(C, dk, dv, false);
            c.bytes = operandAndResultBytes(op);
            return true;
          })
          .Case([&](GatedDeltaRuleGradOp g) {
            int64_t B = dim(g.getV(), 0), T = dim(g.getV(), 1);
            int64_t Hv = dim(g.getV(), 2), dv = dim(g.getV(), 3);
            int64_t dk = dim(g.getQ(), 3), C = g.getChunkSize();
            int64_t NT = (T + C - 1) / C;
            c.flops = double(B * NT * Hv) * gdnChunkFlops(C, dk, dv, true);
            c.bytes = operandAndResultBytes(op);
            return true;
          })
          .Case([&](AttentionOp a) {
            double B = dim(a.getQ(), 0), T = dim(a.getQ(), 1);
            double Hq = dim(a.getQ(), 2), Dqk = dim(a.getQ(), 3);
            double Dv = dim(a.getV(), 3);
            // Causal: half of the T x T score matrix, QK^T and PV.
            c.flops = B * Hq * T * T / 2 * 2 * (Dqk + Dv);
            c.bytes = operandAndResultBytes(op);
            return true;
          })
          .Case([&](AttentionGradOp a) {
            int64_t B = dim(a.getQ(), 0), T = dim(a.getQ(), 1);
            int64_t Hq = dim(a.getQ(), 2), Dqk = dim(a.getQ(), 3);
            int64_t Dv = dim(a.getV(), 3);
            // Recomputed QK^T, dV = P^T dO, dP = dO V^T, dQ = dS K,
            // dK = dS^T Q over the causal half.
            c.flops =
                double(B) * Hq * double(T) * T / 2 * 2 * (3.0 * Dqk + 2.0 * Dv);
            c.bytes = operandAndResultBytes(op);
            return true;
          })
          .Case([&](SliceOp s) {
            c.bytes = 2 * bytesOf(s.getResult());
            return true;
          })
          .Case([&](ConcatOp s) {
            c.bytes = 2 * bytesOf(s.getResult());
            return true;
          })
          .Case([&](LMHeadCrossEntropyOp l) {
            double N = numel(l.getLabels());
            double V = dim(l.getWeight(), 0), D = dim(l.getWeight(), 1);
            c.flops = 2 * N * V * D;
            // bf16 logits written and read back for the log-sum-exp.
            c.bytes = operandAndResultBytes(op) + N * V * 4;
            return true;
          })
          .Case<LMHeadCrossEntropyGradOp, LMHeadCrossEntropyWithGradOp>(
              [&](auto l) {
                double N = numel(l.getLabels());
                double V = dim(l.getWeight(), 0), D = dim(l.getWeight(), 1);
                // Logits once per chunk (recomputed by the grad op, the only
                // time for the fused one: both run the same kernels), then
                // d hidden = dlogits W and, when trainable,
                // dW += dlogits^T hidden.
                bool dW = static_cast<bool>(l.getWeightGradAttr());
                c.flops = (dW ? 6 : 4) * N * V * D;
                // bf16 logits written and read twice (statistics,
                // gradient), the bf16 dlogits written over them and read by
                // each gradient GEMM.
                c.bytes =
                    operandAndResultBytes(op) + N * V * (6 + 2 + (dW ? 4 : 2));
                if (dW)
                  c.bytes += mainGradBytes(l.getWeight());
                return true;
              })
          .Case([&](AdamWOp a) {
            auto param = SymbolTable::lookupNearestSymbolFrom<ParamOp>(
                op, a.getParamAttr());
            if (!param)
              return true;
            auto type = cast<ShapedType>(param.getType());
            double n = type.getNumElements();
            double elt = (type.getElementTypeBitWidth() + 7) / 8;
            // Master, m and v read and written; main grad read and zeroed;
            // compute copy written.
            c.bytes = n * (3 * 8 + 4 + 4 + elt);
            c.flops = 12 * n;
            return true;
          })
          .Case([&](FinalizeGradsOp) {
            // One read for the global norm, one fused read-write for
            // 1/count and the clip factor.
            double n = trainableElements(op);
            c.bytes = 3 * 4 * n;
            c.flops = 3 * n;
            return true;
          })
          .Default([](Operation *) { return false; });

  // Everything else (norms, conv, gates, RoPE, gates, SwiGLU, add, expand,
  // their backward ops, slice_grad, expand_grad, lr_schedule, loss_mean):
  // memory-bound, reads its operands and writes its results once.
  if (!handled)
    c.bytes = operandAndResultBytes(op);

  NameValues values = valuesOf(op);
  double scale = values.scale * generatedFactor(op, values);
  // A host of side-stream work runs its SM-sparing form.
  if (op->hasAttr(kSideHostAttrName))
    scale *= values.sideHostScale;
  // A linear_grad with dx and dW is already two GEMM launches under one
  // op's latency; split by train-fuse-recompute it is the same two
  // launches, so the dx half adds no latency of its own.
  double latency = isa<LinearInputGradOp>(op) ? 0.0 : prof.launchLatency;
  c.seconds =
      scale * (latency + std::max(secondsAt(c.flops, prof.peakFlops),
                                  secondsAt(c.bytes, prof.memBandwidth)));
  return c;
}

std::string ap::train::scopeKey(Operation *op) {
  // One spelling of scope names for every report: Scope::str(). The memory
  // timeline asks for every op of every clone the placement search places,
  // so each scope attribute (uniqued) is spelled once per thread.
  Attribute any = op->getAttr("scope");
  if (!any)
    return std::string();
  auto attr = dyn_cast<ScopeAttr>(any);
  if (!attr)
    return Scope::of(op).str();
  // An entry is checked against the attribute's contents: an attribute of
  // a context destroyed since may have left its address to another.
  struct Spelled {
    int64_t layer;
    std::string module, key;
  };
  thread_local llvm::DenseMap<Attribute, Spelled> spelled;
  auto it = spelled.find(attr);
  if (it == spelled.end() || it->second.layer != attr.getLayer() ||
      it->second.module != attr.getModule()) {
    Spelled s{attr.getLayer(), attr.getModule().str(), Scope::of(op).str()};
    it = spelled.insert_or_assign(attr, std::move(s)).first;
  }
  return it->second.key;
}
