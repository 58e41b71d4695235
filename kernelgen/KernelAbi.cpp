//===- KernelAbi.cpp - names, parameters and launches of generated kernels ===//
//
// The parts of kernelgen that a caller of the generated kernels needs
// (kernel names, parameter lists, GPU launch shapes, the AdamW scalars),
// kept apart from the MLIR generators so that code running the kernels
// (the GPU test, the runtime's tables) links no MLIR.
//
//===----------------------------------------------------------------------===//
#include "kernelgen/KernelAbi.h"

#include "llvm/ADT/StringSwitch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ap::kernelgen {

/// A caller asked for something the ABI has no answer for (a programming
/// error, as llvm_unreachable; this library links no LLVM).
[[noreturn]] static void abiBug(const char *what) {
  std::fprintf(stderr, "kernelgen ABI: %s\n", what);
  std::abort();
}

std::string kernelName(const GroupSpec &spec) {
  auto ty = [](ElemType t) { return t == ElemType::BF16 ? "bf16" : "f32"; };
  std::string name = "ap_kg_";
  switch (spec.kind) {
  case GroupKind::SwiGluForward:
    name += "swiglu_fwd";
    break;
  case GroupKind::SwiGluBackward:
    name += spec.recomputeY ? "swiglu_bwd_y" : "swiglu_bwd";
    break;
  case GroupKind::ResidualAdd:
    name += "residual_add";
    break;
  case GroupKind::RmsNormForward:
    name += spec.zeroCentered ? "rmsnorm_fwd_zc" : "rmsnorm_fwd";
    if (!spec.writeRstd)
      name += "_norstd";
    break;
  case GroupKind::AddRmsNormForward:
    name += spec.zeroCentered ? "add_rmsnorm_fwd_zc" : "add_rmsnorm_fwd";
    if (!spec.writeRstd)
      name += "_norstd";
    break;
  case GroupKind::RmsNormBackward:
    name += spec.zeroCentered ? "rmsnorm_bwd_zc" : "rmsnorm_bwd";
    if (spec.accumulateDw)
      name += "_dw";
    if (spec.recomputeY)
      name += "_y";
    if (spec.addResidual)
      name += "_add";
    if (spec.dyAddends > 1)
      name += "_sum" + std::to_string(spec.dyAddends);
    break;
  case GroupKind::SigmoidGateForward:
    name += "sigmoid_gate_fwd";
    break;
  case GroupKind::SigmoidGateBackward:
    name += "sigmoid_gate_bwd";
    break;
  case GroupKind::L2NormForward:
    name += "l2norm_fwd";
    break;
  case GroupKind::L2NormBackward:
    name += "l2norm_bwd";
    break;
  case GroupKind::GatedNormForward:
    name += "gated_norm_fwd";
    break;
  case GroupKind::GatedNormBackward:
    name += "gated_norm_bwd";
    if (spec.accumulateDw)
      name += "_dw";
    if (spec.recomputeY)
      name += "_y";
    break;
  case GroupKind::GdnGatesForward:
    name += "gdn_gates_fwd";
    break;
  case GroupKind::GdnGatesBackward:
    name += "gdn_gates_bwd";
    break;
  case GroupKind::RopeForward:
  case GroupKind::RopeBackward:
    name += spec.kind == GroupKind::RopeForward ? "rope_fwd" : "rope_bwd";
    if (spec.packed)
      name += "_packed";
    break;
  case GroupKind::GradNormSquares:
    name += "gradnorm_sq";
    break;
  case GroupKind::GradNormFinish:
    return name + "gradnorm_finish";
  case GroupKind::AdamW:
    name += "adamw_grad";
    name += ty(spec.dtype);
    name += spec.computeCopy ? std::string("_copy") + ty(*spec.computeCopy)
                             : std::string("_nocopy");
    return name;
  }
  if (hasRowsPerWarp(spec.kind) && spec.rowsPerWarp > 1)
    name += "_r" + std::to_string(spec.rowsPerWarp);
  else if ((hasRowsPerWarp(spec.kind) ||
            (hasDwRowInRegisters(spec.kind) && spec.accumulateDw)) &&
           spec.rowInRegisters)
    name += "_k";
  name += "_";
  name += ty(spec.dtype);
  return name;
}

bool hasRowsPerWarp(GroupKind kind) {
  return kind == GroupKind::RmsNormForward ||
         kind == GroupKind::AddRmsNormForward ||
         kind == GroupKind::L2NormForward ||
         kind == GroupKind::L2NormBackward ||
         kind == GroupKind::GatedNormForward;
}

int rowsPerWarpFor(const GroupSpec &spec, int64_t dim) {
  if (!hasRowsPerWarp(spec.kind))
    return 1;
  int64_t chunks = (dim + rowChunkOf(spec.kind, spec.dtype) - 1) /
                   rowChunkOf(spec.kind, spec.dtype);
  if (chunks <= kLanes)
    return 4;
  return chunks <= 2 * kLanes ? 2 : 1;
}

bool hasDwRowInRegisters(GroupKind kind) {
  return kind == GroupKind::RmsNormBackward ||
         kind == GroupKind::GatedNormBackward;
}

bool rowInRegistersFor(const GroupSpec &spec, int64_t dim) {
  if (!hasDwRowInRegisters(spec.kind) || !spec.accumulateDw)
    return false;
  int64_t vec = rowChunkOf(spec.kind, spec.dtype);
  return (dim + vec - 1) / vec <= kLanes;
}

std::vector<std::string> gpuKernelNames(const GroupSpec &spec) {
  std::string name = kernelName(spec);
  if (spec.kind == GroupKind::GdnGatesBackward)
    return {name + "_elem", name + "_alogpart", name + "_alog",
            name + "_dtpart", name + "_dt"};
  if (spec.kind != GroupKind::RmsNormBackward &&
      spec.kind != GroupKind::GatedNormBackward)
    return {name};
  if (!spec.accumulateDw)
    return {name + "_rows"};
  return {name + "_rows", name + "_dwpart", name + "_dw"};
}

std::optional<GroupKind> parseGroupKind(llvm::StringRef name) {
  return llvm::StringSwitch<std::optional<GroupKind>>(name)
      .Case("swiglu-fwd", GroupKind::SwiGluForward)
      .Case("swiglu-bwd", GroupKind::SwiGluBackward)
      .Case("residual-add", GroupKind::ResidualAdd)
      .Case("rmsnorm-fwd", GroupKind::RmsNormForward)
      .Case("rmsnorm-bwd", GroupKind::RmsNormBackward)
      .Case("add-rmsnorm-fwd", GroupKind::AddRmsNormForward)
      .Case("adamw", GroupKind::AdamW)
      .Case("sigmoid-gate-fwd", GroupKind::SigmoidGateForward)
      .Case("sigmoid-gate-bwd", GroupKind::SigmoidGateBackward)
      .Case("l2norm-fwd", GroupKind::L2NormForward)
      .Case("l2norm-bwd", GroupKind::L2NormBackward)
      .Case("gated-norm-fwd", GroupKind::GatedNormForward)
      .Case("gated-norm-bwd", GroupKind::GatedNormBackward)
      .Case("gdn-gates-fwd", GroupKind::GdnGatesForward)
      .Case("gdn-gates-bwd", GroupKind::GdnGatesBackward)
      .Case("rope-fwd", GroupKind::RopeForward)
      .Case("rope-bwd", GroupKind::RopeBackward)
      .Case("gradnorm-sq", GroupKind::GradNormSquares)
      .Case("gradnorm-finish", GroupKind::GradNormFinish)
      .Default(std::nullopt);
}

const char *groupKindNames() {
  return "swiglu-fwd, swiglu-bwd, residual-add, rmsnorm-fwd, rmsnorm-bwd, "
         "add-rmsnorm-fwd, adamw, sigmoid-gate-fwd, sigmoid-gate-bwd, "
         "l2norm-fwd, l2norm-bwd, gated-norm-fwd, gated-norm-bwd, "
         "gdn-gates-fwd, gdn-gates-bwd, rope-fwd, rope-bwd, gradnorm-sq, "
         "gradnorm-finish";
}

AdamWScalars adamWScalars(double lr, double beta1, double beta2, double eps,
                          double weightDecay, int64_t step) {
  // The same double expressions, rounded to float at the same points, as
  // the reference adamWStep.
  const double bc1 = 1.0 - std::pow(beta1, double(step));
  const double bc2 = 1.0 - std::pow(beta2, double(step));
  return {float(lr / bc1), float(std::sqrt(bc2)), float(1.0 - lr * weightDecay),
          float(beta1),    float(beta2),          float(eps)};
}

namespace {

/// A kernel's parameters: pointers first, then i64 integers, then f32
/// scalars (the order of the ABI in KernelGen.h).
struct Params {
  std::vector<std::string> ptrs, workspaces, ints, floats;
};

Params paramsOf(const GroupSpec &s) {
  Params p;
  switch (s.kind) {
  case GroupKind::SwiGluForward:
    p.ptrs = {"gate", "up", "y"};
    p.ints = {"rows", "cols", "gateStride", "upStride", "yStride"};
    break;
  case GroupKind::SwiGluBackward:
    p.ptrs = {"gate", "up", "dy", "dgate", "dup"};
    p.ints = {"rows",     "cols",        "gateStride", "upStride",
              "dyStride", "dgateStride", "dupStride"};
    if (s.recomputeY) {
      p.ptrs.push_back("y");
      p.ints.push_back("yStride");
    }
    break;
  case GroupKind::ResidualAdd:
    p.ptrs = {"a", "b", "y"};
    p.ints = {"n"};
    break;
  case GroupKind::RmsNormForward:
    p.ptrs = {"x", "w", "y"};
    if (s.writeRstd)
      p.ptrs.push_back("rstd");
    p.ints = {"rows", "dim", "xStride", "yStride"};
    p.floats = {"eps"};
    break;
  case GroupKind::AddRmsNormForward:
    p.ptrs = {"a", "b", "h", "w", "y"};
    if (s.writeRstd)
      p.ptrs.push_back("rstd");
    p.ints = {"rows", "dim"};
    p.floats = {"eps"};
    break;
  case GroupKind::RmsNormBackward:
    p.ptrs = {"x", "w", "rstd", "dy", "dx"};
    for (int k = 1; k < s.dyAddends; ++k)
      p.ptrs.push_back("dy" + std::to_string(k));
    if (s.addResidual)
      p.ptrs.push_back("res");
    if (s.accumulateDw)
      p.ptrs.push_back("dw");
    if (s.recomputeY)
      p.ptrs.push_back("y");
    p.ints = {"rows", "dim", "xStride", "dyStride", "dxStride"};
    if (s.recomputeY)
      p.ints.push_back("yStride");
    if (s.accumulateDw) {
      p.workspaces = {"dwPartial"};
      p.ints.push_back("dwParts");
      p.ints.push_back("dwPartItems");
    }
    break;
  case GroupKind::SigmoidGateForward:
    p.ptrs = {"o", "gate", "y"};
    p.ints = {"rows", "cols", "oStride", "gateStride", "yStride"};
    break;
  case GroupKind::SigmoidGateBackward:
    p.ptrs = {"o", "gate", "dy", "dout", "dgate"};
    p.ints = {"rows",     "cols",     "oStride",    "gateStride",
              "dyStride", "doStride", "dgateStride"};
    break;
  case GroupKind::L2NormForward:
    p.ptrs = {"x", "y", "rstd"};
    p.ints = {"rows", "dim"};
    p.floats = {"eps"};
    break;
  case GroupKind::L2NormBackward:
    p.ptrs = {"y", "rstd", "dy", "dx"};
    p.ints = {"rows", "dim"};
    break;
  case GroupKind::GatedNormForward:
    p.ptrs = {"x", "z", "w", "y", "rstd"};
    p.ints = {"rows", "dim"};
    p.floats = {"eps"};
    break;
  case GroupKind::GatedNormBackward:
    p.ptrs = {"x", "z", "w", "rstd", "dy", "dx", "dz"};
    if (s.accumulateDw)
      p.ptrs.push_back("dw");
    if (s.recomputeY)
      p.ptrs.push_back("y");
    p.ints = {"rows", "dim"};
    if (s.accumulateDw) {
      p.workspaces = {"dwPartial"};
      p.ints.push_back("dwParts");
      p.ints.push_back("dwPartItems");
    }
    break;
  case GroupKind::GdnGatesForward:
    p.ptrs = {"a", "b", "aLog", "dtBias", "g", "beta"};
    p.ints = {"rows", "heads"};
    break;
  case GroupKind::GdnGatesBackward:
    p.ptrs = {"a",     "aLog", "dtBias", "beta",  "dg",
              "dbeta", "da",   "db",     "dALog", "dDtBias"};
    p.workspaces = {"partial"};
    p.ints = {"rows", "heads", "parts"};
    break;
  case GroupKind::RopeForward:
  case GroupKind::RopeBackward:
    p.ptrs = {"x", "y"};
    if (s.packed)
      p.ptrs.push_back("docStart");
    p.ints = {"tokens", "seq",       "heads", "headDim",
              "offset", "rotaryDim", "cols",  "thetaBits"};
    break;
  case GroupKind::GradNormSquares:
    p.ptrs = {"grad", "partial"};
    p.ints = {"n"};
    break;
  case GroupKind::GradNormFinish:
    p.ptrs = {"partial", "initial", "norm", "clipCoef", "squares"};
    p.ints = {"parts", "maxNormBits"};
    break;
  case GroupKind::AdamW:
    p.ptrs = {"master", "expAvg", "expAvgSq", "grad", "clipCoef"};
    if (s.computeCopy)
      p.ptrs.push_back("computeCopy");
    p.ints = {"n"};
    p.floats = {"stepSize", "bc2Sqrt", "decay", "beta1", "beta2", "eps"};
    break;
  }
  return p;
}

} // namespace

std::vector<KernelParam> kernelParams(const GroupSpec &spec) {
  Params p = paramsOf(spec);
  std::vector<KernelParam> out;
  for (const std::string &n : p.ptrs)
    out.push_back({n, 'p'});
  for (const std::string &n : p.workspaces)
    out.push_back({n, 'w'});
  for (const std::string &n : p.ints)
    out.push_back({n, 'l'});
  for (const std::string &n : p.floats)
    out.push_back({n, 'f'});
  return out;
}

std::vector<GpuEntry> gpuEntries(const GroupSpec &spec) {
  std::vector<KernelParam> params = kernelParams(spec);
  auto index = [&](llvm::StringRef name) {
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].name == name)
        return int(i);
    abiBug("gpuEntries: no such kernel parameter");
  };
  std::vector<std::string> names = gpuKernelNames(spec);
  std::vector<GpuEntry> out;
  for (size_t phase = 0; phase < names.size(); ++phase) {
    GpuEntry e{names[phase], {}};
    switch (spec.kind) {
    case GroupKind::SwiGluForward:
    case GroupKind::SwiGluBackward:
    case GroupKind::SigmoidGateForward:
    case GroupKind::SigmoidGateBackward:
      e.workParams = {index("rows"), index("cols")};
      e.vector = int(vectorOf(spec));
      break;
    case GroupKind::ResidualAdd:
    case GroupKind::AdamW:
      e.workParams = {index("n")};
      e.vector = int(vectorOf(spec));
      break;
    case GroupKind::RmsNormForward:
    case GroupKind::AddRmsNormForward:
    case GroupKind::L2NormForward:
    case GroupKind::L2NormBackward:
    case GroupKind::GatedNormForward:
      // A warp per rowsPerWarp rows.
      if (spec.rowsPerWarp != 1 && spec.rowsPerWarp != 2 &&
          spec.rowsPerWarp != kRowsPerWarp)
        abiBug("gpuEntries: rowsPerWarp is not 1, 2 or 4");
      e.workParams = {index("rows")};
      e.threadsPerItem = int(kLanes);
      e.vector = spec.rowsPerWarp;
      break;
    case GroupKind::GdnGatesForward:
      e.workParams = {index("rows"), index("heads")};
      e.vector = int(vectorOf(spec));
      break;
    case GroupKind::RopeForward:
    case GroupKind::RopeBackward:
      // A block per kRopeTokensPerBlock tokens (their pairs' tables in
      // shared memory, then 8 pairs or 8 copied columns of a head a
      // thread).
      static_assert(kBlockSize % kRopeTokensPerBlock == 0);
      e.workParams = {index("tokens")};
      e.threadsPerItem = int(kBlockSize / kRopeTokensPerBlock);
      break;
    case GroupKind::GradNormSquares:
      // A block of kGradNormThreads threads per block of kGradNormBlock
      // elements.
      e.workParams = {index("n")};
      e.vector = int(kGradNormBlock);
      e.threadsPerItem = int(kGradNormThreads);
      e.blockSize = int(kGradNormThreads);
      break;
    case GroupKind::GradNormFinish:
      // One thread (of one warp) sums the partials in order.
      e.blockSize = int(kLanes);
      break;
    case GroupKind::GdnGatesBackward:
      // The element phase (da, db) as an element-wise group; then, for
      // dA_log and for dt_bias, the two phases of a norm's dw.
      if (phase == 0) {
        e.workParams = {index("rows"), index("heads")};
        e.vector = int(vectorOf(spec));
      } else if (phase % 2 == 1) {
        e.workParams = {index("parts"), index("heads")};
        e.threadsPerItem = int(kDwGroups);
        e.blockSize = int(kLanes * kDwGroups);
      } else {
        e.workParams = {index("heads")};
        e.threadsPerItem = int(kLanes);
        e.blockSize = int(kLanes * kLanes);
      }
      break;
    case GroupKind::RmsNormBackward:
    case GroupKind::GatedNormBackward:
      // Without dw: rows, a warp each. With dw: first a block of kDwGroups
      // warps per part (warp g the rows of group g, which also sums their
      // dw partials up to kRowDwMaxDim columns); then, for wider rows,
      // kDwGroups row groups per (part, column), kLanes columns a block
      // (dwPartItems items: none otherwise); then kLanes groups of parts
      // per column, kLanes columns a block.
      if (phase == 0 && !spec.accumulateDw) {
        e.workParams = {index("rows")};
        e.threadsPerItem = int(kLanes);
      } else if (phase == 0) {
        e.workParams = {index("dwParts")};
        e.threadsPerItem = int(kLanes * kDwGroups);
        e.blockSize = int(kLanes * kDwGroups);
      } else if (phase == 1) {
        e.workParams = {index("dwPartItems")};
        e.threadsPerItem = int(kDwGroups);
        e.blockSize = int(kLanes * kDwGroups);
      } else {
        e.workParams = {index("dim")};
        e.threadsPerItem = int(kLanes);
        e.blockSize = int(kLanes * kLanes);
      }
      break;
    }
    out.push_back(std::move(e));
  }
  return out;
}

uint64_t gpuBlocks(const GpuEntry &e, const std::vector<int64_t> &ints) {
  uint64_t factors[2] = {1, 1};
  size_t n = e.workParams.size();
  for (size_t i = 0; i < n; ++i)
    factors[i] = uint64_t(ints.at(size_t(e.workParams[i])));
  if (n > 0)
    factors[n - 1] =
        (factors[n - 1] + uint64_t(e.vector) - 1) / uint64_t(e.vector);
  uint64_t threads = factors[0] * factors[1] * uint64_t(e.threadsPerItem);
  return (threads + uint64_t(e.blockSize) - 1) / uint64_t(e.blockSize);
}

int64_t gradNormParts(int64_t n) {
  return n <= 0 ? 0 : (n + kGradNormBlock - 1) / kGradNormBlock;
}

int64_t rmsNormDwRowsPerPart(int64_t rows) {
  int64_t span = kDwPartRows * kMaxDwParts;
  return kDwPartRows * std::max<int64_t>(1, (rows + span - 1) / span);
}

int64_t rmsNormDwParts(int64_t rows) {
  if (rows <= 0)
    return 0;
  int64_t r = rmsNormDwRowsPerPart(rows);
  return (rows + r - 1) / r;
}

int64_t rmsNormDwPartItems(int64_t rows, int64_t dim) {
  if (rows <= 0 || dim <= kRowDwMaxDim)
    return 0;
  return rmsNormDwParts(rows) * dim;
}

uint64_t rmsNormDwWorkspaceBytes(int64_t rows, int64_t dim) {
  if (rows <= 0 || dim <= 0)
    return 0;
  return uint64_t(rmsNormDwParts(rows)) * uint64_t(dim) * sizeof(float);
}

uint64_t gdnGatesWorkspaceBytes(int64_t rows, int64_t heads) {
  return 2 * rmsNormDwWorkspaceBytes(rows, heads);
}

int64_t rowChunkOf(GroupKind kind, ElemType storage) {
  if (kind == GroupKind::L2NormForward || kind == GroupKind::L2NormBackward ||
      kind == GroupKind::GatedNormForward ||
      kind == GroupKind::GatedNormBackward)
    return 4;
  return storage == ElemType::BF16 ? 8 : 4;
}

int64_t vectorOf(const GroupSpec &spec) {
  switch (spec.kind) {
  case GroupKind::SwiGluForward:
  case GroupKind::SwiGluBackward:
  case GroupKind::SigmoidGateForward:
  case GroupKind::SigmoidGateBackward:
  case GroupKind::ResidualAdd:
    return spec.dtype == ElemType::BF16 ? 8 : 4;
  case GroupKind::AdamW:
    return 4; // f32 master weights and moments
  case GroupKind::GdnGatesForward:
  case GroupKind::GdnGatesBackward:
    return 4; // f32 g, dg and the per-head parameters
  default:
    return 1;
  }
}

std::string packedName(const GroupSpec &spec) {
  return kernelName(spec) + "_packed";
}

} // namespace ap::kernelgen
