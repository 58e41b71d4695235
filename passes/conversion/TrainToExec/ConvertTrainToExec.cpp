//===- ConvertTrainToExec.cpp - convert-train-to-exec ---------------------===//
//
// Lowers the placed train step (func @train_step after train-autodiff and the
// placement passes) to an exec.step: every tensor becomes a buffer, placement
// ops become copies on the d2h / h2d streams with pinned slots and events,
// parameters, main grads and optimizer states become persistent buffers.
// Offsets stay unplanned (exec-plan-memory) and cross-stream ordering other
// than the placement's wait anchors is left to exec-schedule-streams.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "dialect/train/TrainOps.h"
#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/KernelWorkspace.h"
#include "passes/analysis/StreamSimulation.h"
#include "runtime/abi.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

namespace ap {
#define GEN_PASS_DEF_CONVERTTRAINTOEXEC
#include "passes/conversion/TrainToExec/TrainToExecPasses.h.inc"
} // namespace ap

using namespace mlir;
namespace ex = ap::exec;
namespace tr = ap::train;

namespace {
/// The persistent buffers of one parameter; the last four are null when it
/// is frozen.
struct ParamBuffers {
  Value weight, master, grad, adamM, adamV;
  /// A tied weight's LM-head gradient part (null when untied).
  Value tiedGrad;
};

/// Attribute names whose symbol names the parameter a backward op
/// accumulates into (TrainBackwardOps.td).
bool isGradSymbolAttr(NamedAttribute a) {
  return isa<FlatSymbolRefAttr>(a.getValue()) &&
         a.getName().getValue().ends_with("_grad");
}

class Lowering {
public:
  Lowering(ModuleOp module, func::FuncOp func, int64_t gemmWorkspace,
           tr::CostModel cost, int64_t sideSmPercent, bool zero3,
           bool tiedGradParts)
      : module(module), func(func), b(module.getContext()),
        gemmWorkspace(gemmWorkspace), cost(std::move(cost)),
        sideSmPercent(sideSmPercent), zero3(zero3),
        tiedGradParts(tiedGradParts) {}

  LogicalResult run();

private:
  Type bufferOf(Type t) {
    return ex::BufferType::get(b.getContext(), cast<RankedTensorType>(t));
  }
  Value persistent(Location loc, StringRef name, ex::BufferRole role,
                   RankedTensorType t) {
    checkBytes(loc, t,
               (llvm::Twine("the ") + ex::stringifyBufferRole(role) +
                " buffer of @" + name)
                   .str());
    return ex::PersistentOp::create(
        b, loc, ex::BufferType::get(b.getContext(), t), name, role,
        /*offset=*/IntegerAttr(), ex::alignTo256(ex::tensorBytes(t)));
  }
  Value transient(Location loc, Type t) {
    auto rt = cast<RankedTensorType>(t);
    checkBytes(loc, rt, "a buffer");
    return ex::BufferOp::create(b, loc, bufferOf(t), /*offset=*/IntegerAttr(),
                                ex::alignTo256(ex::tensorBytes(rt)));
  }
  /// A train tensor may hold up to ap::kMaxTensorBytes, but its f32 master,
  /// main grad and Adam moments are twice a bf16 weight, and a kernel's
  /// scratch has no bound in the train dialect: what the exec dialect
  /// cannot hold is an error here, before an op that does not verify.
  void checkBytes(Location loc, RankedTensorType t, const std::string &what) {
    int64_t bytes = ex::tensorBytes(t);
    if ((bytes >= 0 && bytes <= ap::kMaxTensorBytes) || oversized)
      return;
    oversized = true;
    emitError(loc) << "convert-train-to-exec: " << what << " holds " << t
                   << ", more than the " << ap::kMaxTensorBytes
                   << " bytes one buffer may hold";
  }
  Value lookup(Operation *user, Value v) {
    Value m = map.lookupOrNull(v);
    if (!m)
      user->emitError() << "convert-train-to-exec: operand has no buffer "
                           "(unsupported producer)";
    return m;
  }
  /// The kernel scratch of `op`: the kernel library's own query
  /// (kernelWorkspaceBytes: the chunked GDN, attention backward and the
  /// chunked LM head's chunk buffers) plus the fixed cuBLASLt workspace of
  /// GEMM kernels, fixed so that the GEMM algorithm never depends on the
  /// space handed in (kernels/dense.h). The LM head's query counts its GEMM
  /// workspace on top of its chunk buffers; a linear needs the GEMM
  /// workspace alone.
  int64_t workspaceOf(Operation *op) {
    int64_t ws = tr::kernelWorkspaceBytes(op, tr::kPlannedBackend);
    if (isa<tr::LMHeadCrossEntropyOp, tr::LMHeadCrossEntropyGradOp,
            tr::LMHeadCrossEntropyWithGradOp>(op))
      ws = ex::alignTo256(ws) + gemmWorkspace;
    else if (isa<tr::LinearOp, tr::LinearGradOp, tr::LinearInputGradOp>(op))
      ws = std::max(ws, gemmWorkspace);
    return ex::alignTo256(ws);
  }
  void predictCopies(Block &body);
  LogicalResult lowerKernel(Operation *op, ArrayRef<Value> extraOutputs,
                            ArrayRef<Value> resultBuffers);
  LogicalResult lowerBodyOp(Operation *op);
  LogicalResult lowerStepOp(Operation *op);

  ModuleOp module;
  func::FuncOp func;
  OpBuilder b;
  int64_t gemmWorkspace;
  tr::CostModel cost;
  /// exec.step's side_sm_percent when it has side-stream kernels.
  int64_t sideSmPercent;
  /// ZeRO-3: main grads are reduce-scattered per window
  /// (exec-shard-params), not all-reduced after the loop.
  bool zero3;
  /// tied-grad-parts: the LM head's part of a tied gradient apart.
  bool tiedGradParts;
  IRMapping map;
  llvm::StringMap<ParamBuffers> params;
  /// train.offload result -> its pinned slot.
  DenseMap<Value, Value> slots;
  /// train.reload result -> the event its H2D records.
  DenseMap<Value, Value> reloadEvents;
  /// train.offload -> ordinal of the first body kernel predicted to start
  /// after its D2H completed.
  DenseMap<Operation *, std::optional<int64_t>> doneByKernel;
  Value lossAcc, countAcc;
  Operation *execLoop = nullptr;
  /// A buffer over the exec dialect's limit was refused (the first one
  /// gets an error); the lowering fails.
  bool oversized = false;
  int64_t nextSlot = 0, pinnedOffset = 0;
};

/// An op of the model's LM head (scope lm_head).
static bool isLMHeadOp(Operation *op) {
  auto scope = op->getAttrOfType<tr::ScopeAttr>("scope");
  return scope && scope.getLayer() < 0 && scope.getModule() == "lm_head";
}

/// Ops of the loop body that lower to no kernel call.
static bool lowersToKernel(Operation *op) {
  return !isa<tr::ParamRefOp, tr::ReshapeOp, tr::OffloadOp, tr::ReloadOp,
              tr::WaitOp, tr::TensorParallelCopyOp, tr::TensorParallelReduceOp>(
      op);
}

void Lowering::predictCopies(Block &body) {
  // The same queue model the placement passes use: when does each D2H end,
  // and which kernel is the first to start after that.
  tr::StreamSimulation sim = tr::StreamSimulation::simulate(body, cost);
  SmallVector<std::pair<double, int64_t>> kernelStarts;
  int64_t ordinal = 0;
  // Side-stream kernels count in the ordinals (the memory plan numbers
  // every kernel call) but are no candidates: their start is on the side
  // stream, and the compute kernels after them in program order may start
  // before the copy ends.
  for (const tr::SimulatedOp &s : sim.ops)
    if (lowersToKernel(s.op)) {
      if (!s.side)
        kernelStarts.push_back({s.start, ordinal});
      ++ordinal;
    }
  for (const tr::SimulatedCopy &c : sim.copies) {
    if (c.direction != tr::CopyDirection::DeviceToHost)
      continue;
    int at = sim.indexOf(c.op);
    // holdEnd, not end: the profile's margin against a copy that ends late,
    // which the memory timeline (report, SVG) assumes too.
    int64_t done = ordinal; // still running at the end of the body
    for (auto [start, k] : kernelStarts)
      if (start >= c.holdEnd && start >= sim.ops[at].start) {
        done = k;
        break;
      }
    doneByKernel[c.op] = done;
  }
}

LogicalResult Lowering::lowerKernel(Operation *op, ArrayRef<Value> extraOutputs,
                                    ArrayRef<Value> resultBuffers) {
  SmallVector<Value> ins, outs(resultBuffers.begin(), resultBuffers.end());
  for (Value v : op->getOperands()) {
    Value m = lookup(op, v);
    if (!m)
      return failure();
    ins.push_back(m);
  }
  outs.append(extraOutputs.begin(), extraOutputs.end());
  // The kernel's inputs are one flat list: the train op's operand groups
  // (operandSegmentSizes) do not carry over.
  SmallVector<NamedAttribute> args;
  for (NamedAttribute a : op->getAttrs())
    if (a.getName() != tr::kPlacementAttrName &&
        a.getName() != "operandSegmentSizes")
      args.push_back(a);
  int64_t workspace = workspaceOf(op);
  if (workspace > ap::kMaxTensorBytes)
    return op->emitError() << "convert-train-to-exec: the kernel of "
                           << op->getName() << " needs " << workspace
                           << " bytes of scratch, more than the "
                           << ap::kMaxTensorBytes
                           << " bytes one kernel's scratch may take";
  auto k =
      ex::KernelOp::create(b, op->getLoc(), op->getName().getStringRef(), ins,
                           outs, workspace, b.getDictionaryAttr(args));
  // Recompute issued ahead (train-recompute-stream) runs on the side stream.
  if (op->hasAttr(tr::kSideStreamAttrName))
    k.setStream(ex::Stream::Side);
  return success();
}

LogicalResult Lowering::lowerBodyOp(Operation *op) {
  Location loc = op->getLoc();
  if (auto ref = dyn_cast<tr::ParamRefOp>(op)) {
    auto it = params.find(ref.getParam());
    if (it == params.end())
      return op->emitError() << "convert-train-to-exec: unknown parameter "
                             << ref.getParamAttr();
    map.map(ref.getResult(), it->second.weight);
    return success();
  }
  if (auto reshape = dyn_cast<tr::ReshapeOp>(op)) {
    Value src = lookup(op, reshape.getInput());
    if (!src)
      return failure();
    map.map(reshape.getResult(),
            ex::ViewOp::create(b, loc, bufferOf(reshape.getType()), src));
    return success();
  }
  // Megatron's f is a view; g sums its input over the tensor-parallel
  // ranks in place (the row-parallel projection's partial output, whose
  // only reader it is), on the compute stream, every microbatch.
  if (auto copy = dyn_cast<tr::TensorParallelCopyOp>(op)) {
    Value src = lookup(op, copy.getInput());
    if (!src)
      return failure();
    map.map(copy.getResult(),
            ex::ViewOp::create(b, loc, bufferOf(copy.getType()), src));
    return success();
  }
  // Sequence parallelism: a region's entry all-gathers the token shards,
  // its exit reduce-scatters the partial output (in place: the input's
  // only reader); the token shard op was lowered with the inputs.
  if (auto shard = dyn_cast<tr::SequenceParallelShardOp>(op)) {
    if (!map.lookupOrNull(shard.getResult()))
      return op->emitError()
             << "convert-train-to-exec: train.sp_shard must take a "
                "microbatch input (tokens or labels) as its only reader";
    return success();
  }
  if (auto gather = dyn_cast<tr::SequenceParallelGatherOp>(op)) {
    Value src = lookup(op, gather.getInput());
    if (!src)
      return failure();
    Value full = transient(loc, gather.getType());
    ex::AllGatherOp::create(b, loc, src, full, "tp", ex::Stream::Compute);
    map.map(gather.getResult(), full);
    return success();
  }
  if (auto scatter = dyn_cast<tr::SequenceParallelScatterOp>(op)) {
    Value src = lookup(op, scatter.getInput());
    if (!src)
      return failure();
    if (!scatter.getInput().hasOneUse())
      return op->emitError()
             << "convert-train-to-exec: train.sp_scatter may reduce its "
                "input in place, but the input has other users";
    Value shard = transient(loc, scatter.getType());
    ex::ReduceScatterOp::create(b, loc, src, shard, "tp", ex::Stream::Compute,
                                /*accumulate=*/false);
    map.map(scatter.getResult(), shard);
    return success();
  }
  if (auto reduce = dyn_cast<tr::TensorParallelReduceOp>(op)) {
    Value src = lookup(op, reduce.getInput());
    if (!src)
      return failure();
    if (!reduce.getInput().hasOneUse())
      return op->emitError()
             << "convert-train-to-exec: train.tp_reduce sums its input in "
                "place, but the input has other users (copy it first)";
    Value sum = ex::ViewOp::create(b, loc, bufferOf(reduce.getType()), src);
    ex::AllReduceOp::create(b, loc, sum, "tp", ex::Stream::Compute);
    map.map(reduce.getResult(), sum);
    return success();
  }
  if (auto off = dyn_cast<tr::OffloadOp>(op)) {
    Value src = lookup(op, off.getInput());
    if (!src)
      return failure();
    RankedTensorType t = off.getHost().getType().getTensor();
    int64_t bytes = ex::alignTo256(ex::tensorBytes(t));
    Value slot = ex::PoolAcquireOp::create(
        b, loc, ex::HostSlotType::get(b.getContext(), t), nextSlot++,
        pinnedOffset, bytes);
    pinnedOffset += bytes;
    Value ev =
        ex::EventCreateOp::create(b, loc, ex::EventType::get(b.getContext()));
    auto d2h = ex::D2HOp::create(b, loc, src, slot, ev, ex::Stream::D2H,
                                 /*done_by_kernel=*/IntegerAttr());
    if (auto k = doneByKernel.lookup(off))
      d2h.setDoneByKernelAttr(b.getI64IntegerAttr(*k));
    slots[off.getHost()] = slot;
    return success();
  }
  if (auto reload = dyn_cast<tr::ReloadOp>(op)) {
    Value slot = slots.lookup(reload.getHost());
    if (!slot)
      return op->emitError()
             << "convert-train-to-exec: reload of a value that was not "
                "offloaded in this microbatch";
    Value dest = transient(loc, reload.getType());
    Value ev =
        ex::EventCreateOp::create(b, loc, ex::EventType::get(b.getContext()));
    ex::H2DOp::create(b, loc, slot, dest, ev, ex::Stream::H2D);
    ex::PoolReleaseOp::create(b, loc, slot, ev);
    map.map(reload.getResult(), dest);
    reloadEvents[reload.getResult()] = ev;
    return success();
  }
  if (auto wait = dyn_cast<tr::WaitOp>(op)) {
    Value ev = reloadEvents.lookup(wait.getInput());
    if (!ev)
      return op->emitError()
             << "convert-train-to-exec: train.wait must take a train.reload";
    ex::WaitOp::create(b, loc, ev, ex::Stream::Compute);
    map.map(wait.getResult(), map.lookupOrNull(wait.getInput()));
    return success();
  }
  if (auto yield = dyn_cast<tr::YieldOp>(op)) {
    // Sums the microbatch's loss and token count into the step's state; a
    // pipeline stage without the loss yields nothing (its sums stay 0 until
    // the step adds the stages' sums).
    if (yield.getValues().empty())
      return success();
    return lowerKernel(op, {lossAcc, countAcc}, {});
  }
  if (auto send = dyn_cast<tr::PipelineSendOp>(op)) {
    Value src = lookup(op, send.getValue());
    if (!src)
      return failure();
    ex::SendOp::create(b, loc, src,
                       send.getPeer() == tr::PipelinePeer::Next
                           ? ex::PipelinePeer::Next
                           : ex::PipelinePeer::Prev,
                       send.getChannel(), ex::Stream::Comm);
    return success();
  }
  if (auto recv = dyn_cast<tr::PipelineRecvOp>(op)) {
    Value dest = transient(loc, recv.getType());
    ex::RecvOp::create(b, loc, dest,
                       recv.getPeer() == tr::PipelinePeer::Next
                           ? ex::PipelinePeer::Next
                           : ex::PipelinePeer::Prev,
                       recv.getChannel(), ex::Stream::Comm);
    map.map(recv.getResult(), dest);
    return success();
  }
  if (!isa<tr::TrainDialect>(op->getDialect()))
    return op->emitError() << "convert-train-to-exec: unsupported op in the "
                              "microbatch loop";
  SmallVector<Value> results, grads;
  for (Value r : op->getResults())
    results.push_back(transient(loc, r.getType()));
  for (NamedAttribute a : op->getAttrs()) {
    if (!isGradSymbolAttr(a))
      continue;
    StringRef name = cast<FlatSymbolRefAttr>(a.getValue()).getValue();
    auto it = params.find(name);
    if (it == params.end() || !it->second.grad)
      return op->emitError()
             << "convert-train-to-exec: '" << a.getName().getValue()
             << "' names no trainable parameter: @" << name;
    // The LM head's part of a tied weight's gradient accumulates apart.
    Value grad = it->second.grad;
    if (it->second.tiedGrad && isLMHeadOp(op))
      grad = it->second.tiedGrad;
    grads.push_back(grad);
  }
  if (failed(lowerKernel(op, grads, results)))
    return failure();
  for (auto [r, buf] : llvm::zip(op->getResults(), results))
    map.map(r, buf);
  return success();
}

LogicalResult Lowering::lowerStepOp(Operation *op) {
  Location loc = op->getLoc();
  // Step values live in persistent state buffers declared with the others,
  // before the loop, so the step's top level reads as declarations then work.
  auto stateOf = [&](Value v, StringRef name) {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPoint(execLoop);
    Value buf = persistent(loc, name, ex::BufferRole::State,
                           cast<RankedTensorType>(v.getType()));
    map.map(v, buf);
    return buf;
  };
  if (auto fin = dyn_cast<tr::FinalizeGradsOp>(op)) {
    // Main grads, the loss sum and the token count are summed over
    // data-parallel ranks before the token mean and the norm, so the step's
    // loss is the token-weighted mean over every rank's tokens. Under ZeRO-3
    // each rank's main-grad shards already hold their sums (reduce-scattered
    // in the loop) and the norm sums the ranks' partial squares (runtime).
    SmallVector<Value> grads;
    // Pipeline stages: only the last holds the loss sum and token count
    // (the others hold 0), so their sum over the stages is exact.
    if (auto stages =
            module->getAttrOfType<IntegerAttr>(tr::kPipelineStagesAttrName);
        stages && stages.getInt() > 1) {
      ex::AllReduceOp::create(b, loc, lossAcc, "pp", ex::Stream::Comm);
      ex::AllReduceOp::create(b, loc, countAcc, "pp", ex::Stream::Comm);
    }
    // Sequence parallelism with a loss on each rank's tokens: summed over
    // the ranks. A vocab-parallel loss is the whole sequence's on every
    // rank already, and a stage without the loss holds zeros (summed over
    // the stages above; summing them over the ranks again would count the
    // loss stage's tokens once per rank).
    bool shardedLoss = false;
    module.walk([&](Operation *op) {
      if (isa<tr::LMHeadCrossEntropyOp, tr::LMHeadCrossEntropyWithGradOp>(op))
        shardedLoss |= !op->hasAttr("vocab_parallel");
    });
    if (module->hasAttr(tr::kSequenceParallelAttrName) && shardedLoss) {
      ex::AllReduceOp::create(b, loc, lossAcc, "tp", ex::Stream::Comm);
      ex::AllReduceOp::create(b, loc, countAcc, "tp", ex::Stream::Comm);
    }
    ex::AllReduceOp::create(b, loc, lossAcc, "dp", ex::Stream::Comm);
    ex::AllReduceOp::create(b, loc, countAcc, "dp", ex::Stream::Comm);
    // Replicated parameters each tensor-parallel rank applied to its own
    // heads: their main grads are partial sums, summed over the ranks.
    for (tr::ParamOp p : module.getOps<tr::ParamOp>())
      if (p.getTpGradSum())
        for (Value g :
             {params[p.getSymName()].grad, params[p.getSymName()].tiedGrad})
          if (g)
            ex::AllReduceOp::create(b, loc, g, "tp", ex::Stream::Comm);
    for (tr::ParamOp p : module.getOps<tr::ParamOp>())
      if (Value g = params[p.getSymName()].grad) {
        if (!zero3)
          ex::AllReduceOp::create(b, loc, g, "dp", ex::Stream::Comm);
        grads.push_back(g);
      }
    // The LM-head parts of tied weights, summed over the ranks like the
    // main grads (the runtime adds each into its main grad afterwards).
    for (tr::ParamOp p : module.getOps<tr::ParamOp>())
      if (Value g = params[p.getSymName()].tiedGrad) {
        ex::AllReduceOp::create(b, loc, g, "dp", ex::Stream::Comm);
        grads.push_back(g);
      }
    Value norm = stateOf(fin.getGradNorm(), "grad_norm");
    grads.insert(grads.begin(), norm);
    return lowerKernel(op, {}, grads);
  }
  if (auto lr = dyn_cast<tr::LRScheduleOp>(op))
    return lowerKernel(op, {}, {stateOf(lr.getLr(), "lr")});
  if (auto mean = dyn_cast<tr::LossMeanOp>(op))
    return lowerKernel(op, {}, {stateOf(mean.getLoss(), "loss")});
  if (auto adam = dyn_cast<tr::AdamWOp>(op)) {
    auto it = params.find(adam.getParam());
    if (it == params.end() || !it->second.grad)
      return op->emitError() << "convert-train-to-exec: adamw of a frozen or "
                                "unknown parameter "
                             << adam.getParamAttr();
    ParamBuffers &pb = it->second;
    return lowerKernel(op, {pb.weight, pb.master, pb.grad, pb.adamM, pb.adamV},
                       {});
  }
  if (auto ret = dyn_cast<func::ReturnOp>(op)) {
    SmallVector<Value> outs;
    for (Value v : ret.getOperands()) {
      Value m = lookup(op, v);
      if (!m)
        return failure();
      outs.push_back(m);
    }
    ex::ReturnOp::create(b, loc, outs);
    return success();
  }
  return op->emitError() << "convert-train-to-exec: unsupported op outside "
                            "the microbatch loop";
}

LogicalResult Lowering::run() {
  b.setInsertionPoint(func);
  auto step = ex::StepOp::create(b, func.getLoc(), func.getSymName());
  b.setInsertionPointToStart(&step.getBody().emplaceBlock());

  // Persistent buffers in parameter order: the checkpoint and the runtime's
  // parameter table use the same order.
  for (tr::ParamOp p : module.getOps<tr::ParamOp>()) {
    auto t = cast<RankedTensorType>(p.getType());
    auto f32 = RankedTensorType::get(t.getShape(), b.getF32Type());
    ParamBuffers pb;
    StringRef n = p.getSymName();
    pb.weight = persistent(p.getLoc(), n, ex::BufferRole::Weight, t);
    if (!p.getFrozen()) {
      pb.master = persistent(p.getLoc(), n, ex::BufferRole::Master, f32);
      pb.grad = persistent(p.getLoc(), n, ex::BufferRole::MainGrad, f32);
      pb.adamM = persistent(p.getLoc(), n, ex::BufferRole::AdamM, f32);
      pb.adamV = persistent(p.getLoc(), n, ex::BufferRole::AdamV, f32);
    }
    params[n] = pb;
  }
  if (oversized)
    return failure();

  // A weight tied between the embedding and the LM head (both accumulate
  // its gradient in the loop) gets a second gradient buffer for the LM
  // head's part; the runtime adds it to the main grad once per step, before
  // the norm, so the sum is (embedding part) + (LM-head part) as on a
  // pipeline whose ends hold one part each; it costs one f32 copy of the
  // weight (4 V D bytes), so only when asked. Not under ZeRO-3, whose grads
  // are reduce-scattered per window.
  if (tiedGradParts && !zero3) {
    llvm::StringMap<std::pair<bool, bool>> writers; // LM head, other
    func.walk([&](Operation *op) {
      for (NamedAttribute a : op->getAttrs())
        if (isGradSymbolAttr(a)) {
          auto &w = writers[cast<FlatSymbolRefAttr>(a.getValue()).getValue()];
          (isLMHeadOp(op) ? w.first : w.second) = true;
        }
    });
    for (tr::ParamOp p : module.getOps<tr::ParamOp>()) {
      auto w = writers.find(p.getSymName());
      ParamBuffers &pb = params[p.getSymName()];
      if (w == writers.end() || !w->second.first || !w->second.second ||
          !pb.grad)
        continue;
      auto t = cast<RankedTensorType>(p.getType());
      pb.tiedGrad =
          persistent(p.getLoc(), p.getSymName(), ex::BufferRole::TiedGrad,
                     RankedTensorType::get(t.getShape(), b.getF32Type()));
    }
  }

  tr::MicrobatchLoopOp loop;
  for (Operation &op : func.getBody().front()) {
    if (auto l = dyn_cast<tr::MicrobatchLoopOp>(op)) {
      if (loop)
        return l.emitError("convert-train-to-exec: more than one microbatch "
                           "loop");
      loop = l;
    }
  }
  if (!loop)
    return func.emitError("convert-train-to-exec: @")
           << func.getSymName() << " has no train.microbatch_loop";

  for (Operation &op : func.getBody().front()) {
    if (&op != loop.getOperation()) {
      if (failed(lowerStepOp(&op)))
        return failure();
      continue;
    }
    Location loc = loop.getLoc();
    lossAcc = persistent(loc, "loss_sum", ex::BufferRole::State,
                         cast<RankedTensorType>(loop.getLossSum().getType()));
    countAcc =
        persistent(loc, "token_count", ex::BufferRole::State,
                   cast<RankedTensorType>(loop.getTokenCount().getType()));
    map.map(loop.getLossSum(), lossAcc);
    map.map(loop.getTokenCount(), countAcc);
    auto xloop = ex::MicrobatchLoopOp::create(
        b, loc, loop.getTokens().getType().getDimSize(0),
        /*max_inflight=*/IntegerAttr());
    execLoop = xloop;
    if (auto mi = loop->getAttrOfType<IntegerAttr>(tr::kMaxInflightAttrName))
      xloop.setMaxInflightAttr(b.getI64IntegerAttr(mi.getInt()));
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(&xloop.getBody().emplaceBlock());
    Block &body = loop.getBody().front();
    predictCopies(body);
    static const StringRef inputNames[] = {"tokens", "labels"};
    for (auto [arg, name] : llvm::zip(body.getArguments(), inputNames)) {
      // A pipeline stage loads only what it reads (the first stage the
      // tokens, the last the labels).
      if (arg.use_empty())
        continue;
      // Sequence parallelism: the rank's token shard is loaded directly.
      if (arg.hasOneUse())
        if (auto shard = dyn_cast<tr::SequenceParallelShardOp>(
                *arg.getUsers().begin())) {
          Value buf = transient(loc, shard.getType());
          ex::LoadInputOp::create(b, loc, name, buf, /*tp_shard=*/true);
          map.map(shard.getResult(), buf);
          continue;
        }
      Value buf = transient(loc, arg.getType());
      ex::LoadInputOp::create(b, loc, name, buf);
      map.map(arg, buf);
    }
    for (Operation &op : body)
      if (failed(lowerBodyOp(&op)))
        return failure();
  }
  if (auto mb = module->getAttrOfType<IntegerAttr>(tr::kMicroBatchesAttrName))
    step->setAttr("micro_batches", mb);
  // A pipeline stage records the microbatch shape and the vocabulary, which
  // every rank's data loader needs, also on a stage that loads no tokens or
  // has no embedding (a whole step has its load_input and embedding); so
  // does a tensor-parallel rank, whose embedding holds a block of the
  // vocabulary.
  auto tpSize = module->getAttrOfType<IntegerAttr>(tr::kTensorParallelAttrName);
  if (loop && (module->hasAttr(tr::kPipelineStagesAttrName) ||
               module->hasAttr(tr::kSequenceParallelAttrName) ||
               (tpSize && tpSize.getInt() > 1))) {
    ArrayRef<int64_t> shape = loop.getTokens().getType().getShape();
    step->setAttr("batch", b.getI64IntegerAttr(shape[1]));
    step->setAttr("seq", b.getI64IntegerAttr(shape[2]));
    if (auto cfg =
            module->getAttrOfType<DictionaryAttr>(tr::kModelConfigAttrName))
      if (auto v = cfg.getAs<StringAttr>("vocab_size")) {
        int64_t vocab = 0;
        if (!v.getValue().getAsInteger(10, vocab) && vocab > 0)
          step->setAttr("vocab", b.getI64IntegerAttr(vocab));
      }
  }
  // A pipeline stage's program says which stage it is and which of its
  // parameters another stage also holds.
  for (StringRef name :
       {tr::kPipelineStagesAttrName, tr::kPipelineStageAttrName,
        tr::kPipelineTiedAttrName, tr::kTensorParallelAttrName})
    if (Attribute a = module->getAttr(name))
      step->setAttr(name.drop_front(strlen("train.")), a);
  // The driver scratch, a persistent buffer the plan places like any other
  // (before the loop, after the parameters and state): the runtime's
  // scalars (AP_SCRATCH_SCALAR_BYTES), then two staging arrays for the GDN
  // gates in the kernels' accumulation type (beta in, dbeta out), 8 bytes an
  // element at most, as large as the largest gate tensor.
  int64_t gateElems = 0;
  step.walk([&](ex::KernelOp k) {
    StringRef c = k.getCallee();
    if (c == "train.gdn_gates" || c == "train.gdn_gates_grad")
      gateElems =
          std::max(gateElems, cast<ex::BufferType>(k.getInputs()[0].getType())
                                  .getTensor()
                                  .getNumElements());
    if (c == "train.gated_delta_rule" || c == "train.gated_delta_rule_grad")
      gateElems =
          std::max(gateElems, cast<ex::BufferType>(k.getInputs()[3].getType())
                                  .getTensor()
                                  .getNumElements());
  });
  {
    OpBuilder::InsertionGuard g(b);
    if (execLoop)
      b.setInsertionPoint(execLoop);
    else
      b.setInsertionPointToEnd(&step.getBody().front());
    int64_t stage = ex::alignTo256(gateElems * 8);
    persistent(step.getLoc(), "driver_scratch", ex::BufferRole::Scratch,
               RankedTensorType::get({AP_SCRATCH_SCALAR_BYTES + 2 * stage},
                                     b.getIntegerType(8)));
  }
  // A step with side-stream kernels runs their GEMMs on the SM share the
  // cost model's side capacity was measured under: one value, from the
  // profile.
  bool sideKernels = step.walk([](ex::KernelOp k) {
                           return k.getStream() == ex::Stream::Side
                                      ? WalkResult::interrupt()
                                      : WalkResult::advance();
                         })
                         .wasInterrupted();
  if (sideKernels)
    step->setAttr(ex::kSideSmPercentAttr, b.getI64IntegerAttr(sideSmPercent));
  if (oversized)
    return failure();
  func.erase();
  return success();
}

struct ConvertTrainToExecPass
    : ap::impl::ConvertTrainToExecBase<ConvertTrainToExecPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto func = module.lookupSymbol<func::FuncOp>(stepFunction);
    if (!func) {
      module.emitError() << "convert-train-to-exec: no function @"
                         << stepFunction << " (run train-autodiff first)";
      return signalPassFailure();
    }
    if (func.isExternal()) {
      func.emitError() << "convert-train-to-exec: @" << stepFunction
                       << " is a declaration; the step needs its body";
      return signalPassFailure();
    }
    // The copy-completion predictions must come from the cost model that
    // placed the copies: a faster compute model (the defaults against a
    // calibrated profile) predicts each D2H done many kernels later and
    // reserves its bytes that much longer.
    FailureOr<tr::CostModel> cost =
        tr::CostModel::fromProfile(profile, module, "convert-train-to-exec: ");
    if (failed(cost))
      return signalPassFailure();
    int64_t share = sideSmPercent != 0 ? int64_t(sideSmPercent)
                                       : cost->profile().sideSmPercent;
    if (share < 1 || share > 100) {
      module.emitError() << "convert-train-to-exec: side-sm-percent " << share
                         << " (expected 1 to 100, the side-stream GEMMs' "
                            "share of the SMs; 0 for the profile's)";
      return signalPassFailure();
    }
    if (dataParallelSize < 1 || dataParallelSize > (int64_t(1) << 20)) {
      module.emitError() << "convert-train-to-exec: data-parallel-size "
                         << int64_t(dataParallelSize)
                         << " (expected 1 or more ranks)";
      return signalPassFailure();
    }
    bool zero3 = dataParallel == ap::train::DataParallelMode::Zero3;
    if (failed(Lowering(module, func, gemmWorkspaceBytes, *cost, share, zero3,
                        tiedGradParts)
                   .run()))
      return signalPassFailure();
    // One replicated rank is what a step without the attributes means, so
    // single-rank IR stays as it was; ZeRO-3 is recorded at any size.
    if (dataParallelSize > 1 || zero3)
      for (ex::StepOp step : module.getOps<ex::StepOp>()) {
        Builder b(module.getContext());
        step->setAttr(ex::kDataParallelSizeAttr,
                      b.getI64IntegerAttr(dataParallelSize));
        step->setAttr(
            ex::kDataParallelModeAttr,
            b.getStringAttr(ap::train::dataParallelName(dataParallel)));
      }
  }
};
} // namespace
