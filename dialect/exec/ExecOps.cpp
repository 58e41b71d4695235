//===- ExecOps.cpp - exec dialect operations ------------------------------===//
//
// Verifiers. Messages name the op, the operand or attribute, what was
// expected and what was found.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "dialect/exec/KernelSignatures.h"

#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace ap::exec;

namespace {
/// `value` of attribute `name` is at most `limit` (`what` says why): the
/// memory plan adds offsets, sizes and workspaces, which must not overflow.
LogicalResult verifyAtMost(Operation *op, StringRef name, int64_t value,
                           int64_t limit, StringRef what) {
  if (value <= limit)
    return success();
  return op->emitOpError() << name << " " << value << " exceeds " << limit
                           << " (" << what << ")";
}

/// Checks that a planned extent is 256-byte aligned and large enough for
/// `tensor`.
LogicalResult verifyExtent(Operation *op, std::optional<int64_t> offset,
                           int64_t bytes, RankedTensorType tensor) {
  if (offset && *offset % kAlignment != 0)
    return op->emitOpError() << "offset must be a multiple of " << kAlignment
                             << ", got " << *offset;
  if (bytes % kAlignment != 0)
    return op->emitOpError()
           << "bytes must be a multiple of " << kAlignment << ", got " << bytes;
  if (failed(verifyAtMost(op, "bytes", bytes, ap::kMaxTensorBytes,
                          "the most one tensor may hold")) ||
      (offset && failed(verifyAtMost(op, "offset", *offset, kMaxOffsetBytes,
                                     "the largest arena or pool offset"))))
    return failure();
  int64_t need = tensorBytes(tensor);
  if (bytes < need)
    return op->emitOpError()
           << "bytes " << bytes << " < " << need << " bytes of " << tensor;
  return success();
}

RankedTensorType tensorOf(Type t) {
  if (auto b = dyn_cast<BufferType>(t))
    return b.getTensor();
  return cast<HostSlotType>(t).getTensor();
}
} // namespace

LogicalResult StepOp::verify() {
  int loops = 0;
  for (Operation &op : getBody().front())
    if (isa<MicrobatchLoopOp>(op))
      ++loops;
  if (loops > 1)
    return emitOpError() << "expects at most one exec.microbatch_loop, found "
                         << loops;
  if (getBody().front().empty() || !isa<ReturnOp>(getBody().front().back()))
    return emitOpError() << "body must end with exec.return";
  return success();
}

LogicalResult BufferOp::verify() {
  return verifyExtent(*this, getOffset(), getBytes(),
                      getResult().getType().getTensor());
}

LogicalResult PersistentOp::verify() {
  RankedTensorType t = getResult().getType().getTensor();
  BufferRole r = getRole();
  bool fp32 = r == BufferRole::Master || r == BufferRole::MainGrad ||
              r == BufferRole::AdamM || r == BufferRole::AdamV ||
              r == BufferRole::TiedGrad;
  // A bf16 main grad exists only under ZeRO-3, where kernels accumulate
  // into f32 window buffers and only the runtime touches the shard.
  if (r == BufferRole::MainGrad && t.getElementType().isBF16()) {
    auto step = (*this)->getParentOfType<StepOp>();
    auto mode =
        step ? step->getAttrOfType<StringAttr>(kDataParallelModeAttr) : nullptr;
    if (!mode || mode.getValue() != "zero3")
      return emitOpError() << "a bf16 main_grad buffer needs a step with "
                              "data_parallel = \"zero3\" (kernels accumulate "
                              "into f32 main grads), got "
                           << t;
  } else if (fp32 && !t.getElementType().isF32()) {
    return emitOpError() << "a " << stringifyBufferRole(r)
                         << " buffer must be f32"
                         << (r == BufferRole::MainGrad
                                 ? " (or bf16 under zero3)"
                                 : "")
                         << ", got " << t;
  }
  if (getName().empty())
    return emitOpError() << "name must not be empty";
  return verifyExtent(*this, getOffset(), getBytes(), t);
}

LogicalResult ViewOp::verify() {
  RankedTensorType from = getSource().getType().getTensor();
  RankedTensorType to = getResult().getType().getTensor();
  if (from.getElementType() != to.getElementType())
    return emitOpError() << "element type changes from "
                         << from.getElementType() << " to "
                         << to.getElementType();
  if (getPrefix()) {
    if (to.getNumElements() > from.getNumElements())
      return emitOpError() << "prefix of " << to.getNumElements()
                           << " elements is longer than its source of "
                           << from.getNumElements();
    return success();
  }
  if (from.getNumElements() != to.getNumElements())
    return emitOpError() << "element count changes from "
                         << from.getNumElements() << " to "
                         << to.getNumElements();
  return success();
}

LogicalResult ZeroOp::verify() {
  if (getStream() != Stream::Compute && getStream() != Stream::Comm)
    return emitOpError() << "runs on the compute or comm stream, not "
                         << stringifyStream(getStream());
  return success();
}

LogicalResult PoolAcquireOp::verify() {
  return verifyExtent(*this, getOffset(), getBytes(),
                      getResult().getType().getTensor());
}

LogicalResult PoolReleaseOp::verify() {
  if (!getSlot().getDefiningOp<PoolAcquireOp>())
    return emitOpError() << "slot must come from exec.pool_acquire";
  return success();
}

LogicalResult LoadInputOp::verify() {
  if (getName() != "tokens" && getName() != "labels")
    return emitOpError() << "name must be \"tokens\" or \"labels\", got \""
                         << getName() << "\"";
  RankedTensorType t = getDest().getType().getTensor();
  if (t.getRank() != 2 || !t.getElementType().isInteger(32))
    return emitOpError() << "dest must hold a 2-D i32 tensor [B, T], got " << t;
  if (getTpShard() && t.getDimSize(0) != 1)
    return emitOpError() << "tp_shard loads a [1, N/T] token shard, got " << t;
  return success();
}

LogicalResult KernelOp::verify() {
  bool testKernel = getCallee().starts_with("test.");
  if (!getCallee().starts_with("train.") && !testKernel)
    return emitOpError() << "callee must name a train op (\"train.<op>\") or "
                            "a test kernel (\"test.<name>\"), got \""
                         << getCallee() << "\"";
  if (getInputs().empty() && getOutputs().empty())
    return emitOpError() << "expects at least one buffer operand";
  for (Value out : getOutputs())
    for (Value in : getInputs())
      if (in == out)
        return emitOpError() << "buffer is both an input and an output; "
                                "an accumulated buffer is an output only";
  if (getStream() != Stream::Compute && getStream() != Stream::Side)
    return emitOpError() << "runs on the compute or side stream, not "
                         << stringifyStream(getStream());
  // What the kernel takes (dialect/exec/KernelSignatures.cpp). A test
  // kernel is opaque: exec pass tests schedule it, no emitter lowers it.
  if (!testKernel &&
      failed(verifyKernelCall(
          getCallee(), getInputs().size(), getOutputs().size(), getArgs(),
          [&](const llvm::Twine &msg) { emitOpError() << msg; })))
    return failure();
  return verifyAtMost(*this, "workspace", getWorkspace(), ap::kMaxTensorBytes,
                      "the most one kernel's scratch may take");
}

template <typename CopyOp>
static LogicalResult verifyCopy(CopyOp op, Value device, Value host,
                                Stream expected) {
  RankedTensorType d = tensorOf(device.getType());
  RankedTensorType h = tensorOf(host.getType());
  if (d != h)
    return op.emitOpError()
           << "device buffer holds " << d << " but the host slot holds " << h;
  if (op.getStream() != expected && op.getStream() != Stream::Compute)
    return op.emitOpError()
           << "runs on the " << stringifyStream(expected)
           << " (or compute) stream, not " << stringifyStream(op.getStream());
  return success();
}

LogicalResult D2HOp::verify() {
  return verifyCopy(*this, getSource(), getSlot(), Stream::D2H);
}

LogicalResult H2DOp::verify() {
  return verifyCopy(*this, getDest(), getSlot(), Stream::H2D);
}

LogicalResult AllReduceOp::verify() {
  RankedTensorType t = getBuffer().getType().getTensor();
  // The tensor-parallel group also sums bf16 activations and gradients
  // inside the loop (every microbatch: they are that microbatch's values).
  bool tensorParallel = getCommunicator() == "tp";
  if (!t.getElementType().isF32() && !t.getElementType().isInteger(32) &&
      !(tensorParallel && t.getElementType().isBF16()))
    return emitOpError() << "sums f32 (main grads, loss) or i32 (token "
                            "counts) buffers, or bf16 ones over \"tp\"; got "
                         << t;
  if (getStream() != Stream::Comm && getStream() != Stream::Compute)
    return emitOpError() << "runs on the comm (or compute) stream, not "
                         << stringifyStream(getStream());
  if (getCommunicator().empty())
    return emitOpError() << "communicator must not be empty";
  bool inLoop = (*this)->getParentOfType<MicrobatchLoopOp>() != nullptr;
  if (inLoop && tensorParallel) {
    if (getLastMicrobatch())
      return emitOpError() << "over \"tp\" sums one microbatch's values and "
                              "runs every microbatch; it cannot be "
                              "last_microbatch";
    return success();
  }
  if (inLoop && !getLastMicrobatch())
    return emitOpError() << "inside exec.microbatch_loop must be marked "
                            "last_microbatch (main grads accumulate over "
                            "microbatches and are summed once)";
  if (!inLoop && getLastMicrobatch())
    return emitOpError() << "is marked last_microbatch outside "
                            "exec.microbatch_loop";
  return success();
}

static LogicalResult verifyPipelineTransfer(Operation *op, Stream stream) {
  if (stream != Stream::Comm)
    return op->emitOpError()
           << "runs on the comm stream, not " << stringifyStream(stream);
  if (!op->getParentOfType<MicrobatchLoopOp>())
    return op->emitOpError()
           << "belongs in exec.microbatch_loop (a microbatch's boundary "
              "value)";
  return success();
}

LogicalResult SendOp::verify() {
  return verifyPipelineTransfer(*this, getStream());
}

LogicalResult RecvOp::verify() {
  return verifyPipelineTransfer(*this, getStream());
}

LogicalResult MicrobatchOp::verify() {
  auto loop = (*this)->getParentOfType<MicrobatchLoopOp>();
  if (loop.getCount() != 1)
    return emitOpError() << "marks an unrolled schedule, whose "
                            "exec.microbatch_loop runs once; this one runs "
                         << loop.getCount() << " times";
  auto step = (*this)->getParentOfType<StepOp>();
  auto micro =
      step ? step->getAttrOfType<IntegerAttr>("micro_batches") : IntegerAttr();
  if (micro && int64_t(getIndex()) >= micro.getInt())
    return emitOpError() << "microbatch " << getIndex() << " of a step with "
                         << micro.getInt() << " microbatches";
  return success();
}

/// Shared checks of exec.all_gather and exec.reduce_scatter: one element
/// type (bf16 or f32), the full buffer N shards long (N the step's
/// data_parallel_size when it has one), the comm or compute stream.
static LogicalResult verifyShardCollective(Operation *op, BufferType shard,
                                           BufferType full, Stream stream,
                                           StringRef communicator,
                                           bool accumulate = false) {
  RankedTensorType s = shard.getTensor(), f = full.getTensor();
  // A bf16 main-grad shard accumulates the f32 sum of an f32 buffer.
  bool mixed = s.getElementType().isBF16() && f.getElementType().isF32();
  if (s.getElementType() != f.getElementType() && !(accumulate && mixed))
    return op->emitOpError() << "shard " << s << " and full buffer " << f
                             << " differ in element type"
                             << (mixed ? " (only an accumulating scatter adds "
                                         "f32 into a bf16 shard)"
                                       : "");
  if (!s.getElementType().isBF16() && !s.getElementType().isF32())
    return op->emitOpError() << "moves bf16 or f32 buffers, got " << s;
  if (stream != Stream::Comm && stream != Stream::Compute)
    return op->emitOpError() << "runs on the comm (or compute) stream, not "
                             << stringifyStream(stream);
  if (communicator.empty())
    return op->emitOpError() << "communicator must not be empty";
  int64_t ns = s.getNumElements(), nf = f.getNumElements();
  if (nf % ns != 0)
    return op->emitOpError()
           << "full buffer of " << nf
           << " elements is not a whole number of shards of " << ns;
  // The group's size, where the step records it: data_parallel_size for
  // "dp", tensor_parallel for "tp" (sequence-parallel token shards).
  bool tensorParallel = communicator == "tp";
  StringRef sizeAttr = tensorParallel ? StringRef(kTensorParallelAttr)
                                      : StringRef(kDataParallelSizeAttr);
  if (auto step = op->getParentOfType<StepOp>())
    if (auto size = step->getAttrOfType<IntegerAttr>(sizeAttr))
      if (nf != ns * size.getInt())
        return op->emitOpError()
               << "full buffer of " << nf << " elements is not "
               << size.getInt() << " (the step's " << sizeAttr << ") shards of "
               << ns;
  return success();
}

LogicalResult AllGatherOp::verify() {
  return verifyShardCollective(*this, getShard().getType(), getFull().getType(),
                               getStream(), getCommunicator());
}

LogicalResult ReduceScatterOp::verify() {
  return verifyShardCollective(*this, getShard().getType(), getFull().getType(),
                               getStream(), getCommunicator(), getAccumulate());
}

#define GET_OP_CLASSES
#include "dialect/exec/ExecOps.cpp.inc"
