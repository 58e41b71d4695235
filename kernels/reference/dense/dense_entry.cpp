//===- dense_entry.cpp - dense kernels: entries and dispatch ------*- C++
//-*-===//
//
// The ABI entries of kernels/dense.h: validate the arguments, then run the
// reference kernel (Host) or the CUDA one (Cuda). The workspace queries are
// in kernels/workspace.cpp. The CUDA hooks are weak
// references: in a build without actplace_kernels_cuda they stay null and the
// entry answers Unsupported.
//
//===----------------------------------------------------------------------===//
#define AP_DENSE_CUDA_HOOK __attribute__((weak))
#include "kernels/reference/dense/dense_internal.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace ap::kernels {
namespace {

/// Calls `fn(T{})` with T the storage type named by `dtype`.
template <class Fn> Status byDType(DType dtype, Fn &&fn) {
  switch (dtype) {
  case DType::BF16:
    return fn(bf16{});
  case DType::F32:
    return fn(float{});
  case DType::F64:
    return fn(double{});
  default:
    return Status::InvalidArgument;
  }
}

/// Runs the host kernel or the CUDA hook; `hook` may be a null weak symbol.
template <class Args, class HostFn>
Status dispatch(const KernelContext &ctx, const Args &args,
                Status (*hook)(const KernelContext &, const Args &),
                HostFn &&host) {
  if (ctx.backend == Backend::Host)
    return host();
  if (ctx.backend == Backend::Cuda)
    return hook ? hook(ctx, args) : Status::Unsupported;
  return Status::InvalidArgument;
}

bool isFloatType(DType t) {
  return t == DType::BF16 || t == DType::F32 || t == DType::F64;
}
bool strideOk(int64_t stride, int64_t cols) {
  return stride == 0 || stride >= cols;
}
/// A split vocabulary's group (read only when ranks > 1): the rank's `vocab`
/// rows lie inside the whole table of vocab x ranks rows, whose row count
/// fits in int64.
bool vocabGroupOk(const VocabGroup &g, int64_t vocab) {
  if (g.ranks == 1)
    return true;
  if (g.ranks < 1 || vocab > std::numeric_limits<int64_t>::max() / g.ranks)
    return false;
  return g.offset >= 0 && g.offset <= vocab * (g.ranks - 1);
}

} // namespace

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

Status linearForward(const KernelContext &ctx, const LinearForwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.x || !a.w || !a.y || a.rows <= 0 ||
      a.in <= 0 || a.out <= 0)
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::linearForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      return ref::linearForward<T>(static_cast<const T *>(a.x),
                                   static_cast<const T *>(a.w),
                                   static_cast<T *>(a.y), a.rows, a.in, a.out);
    });
  });
}

Status linearBackward(const KernelContext &ctx, const LinearBackwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.dy || a.rows <= 0 || a.in <= 0 ||
      a.out <= 0 || (a.dx && !a.w) || (a.dw && !a.x))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::linearBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      return ref::linearBackward<T>(
          static_cast<const T *>(a.x), static_cast<const T *>(a.w),
          static_cast<const T *>(a.dy), static_cast<T *>(a.dx),
          static_cast<ref::Acc<T> *>(a.dw), a.rows, a.in, a.out);
    });
  });
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

Status rmsNormForward(const KernelContext &ctx, const RmsNormForwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.x || !a.w || !a.y || a.rows <= 0 ||
      a.dim <= 0 || !strideOk(a.xStride, a.dim) ||
      !strideOk(a.yStride, a.dim) || !(a.eps >= 0))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::rmsNormForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::rmsNormForward<decltype(tag)>(a);
    });
  });
}

Status rmsNormBackward(const KernelContext &ctx, const RmsNormBackwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.x || !a.w || !a.rstd || !a.dy ||
      a.rows <= 0 || a.dim <= 0 || !strideOk(a.xStride, a.dim) ||
      !strideOk(a.dyStride, a.dim) || !strideOk(a.dxStride, a.dim))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::rmsNormBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::rmsNormBackward<decltype(tag)>(a);
    });
  });
}

//===----------------------------------------------------------------------===//
// RoPE
//===----------------------------------------------------------------------===//

static bool ropeOk(const RopeArgs &a) {
  return isFloatType(a.dtype) && a.x && a.y && a.batch > 0 && a.seq > 0 &&
         a.heads > 0 && a.headDim > 0 && a.rotaryDim > 0 &&
         a.rotaryDim % 2 == 0 && a.offset >= 0 &&
         a.offset + a.rotaryDim <= a.headDim && a.theta > 0;
}

/// Packed documents (kernels/kernels.h): the host checks the array's
/// contract; on the cuda backend the array is device memory, written by
/// documentStarts.
static Status ropeDocStartOk(const KernelContext &ctx, const RopeArgs &a) {
  if (!a.docStart || ctx.backend != Backend::Host)
    return Status::Ok;
  return docStartValid(a.docStart, a.batch, a.seq) ? Status::Ok
                                                   : Status::InvalidArgument;
}

Status ropeForward(const KernelContext &ctx, const RopeArgs &a) {
  if (!ropeOk(a))
    return Status::InvalidArgument;
  if (Status st = ropeDocStartOk(ctx, a); st != Status::Ok)
    return st;
  return dispatch(ctx, a, &cuda::ropeForward, [&] {
    return byDType(
        a.dtype, [&](auto tag) { return ref::rope<decltype(tag)>(a, false); });
  });
}

Status ropeBackward(const KernelContext &ctx, const RopeArgs &a) {
  if (!ropeOk(a))
    return Status::InvalidArgument;
  if (Status st = ropeDocStartOk(ctx, a); st != Status::Ok)
    return st;
  return dispatch(ctx, a, &cuda::ropeBackward, [&] {
    return byDType(a.dtype,
                   [&](auto tag) { return ref::rope<decltype(tag)>(a, true); });
  });
}

Status documentStarts(const KernelContext &ctx, const DocumentStartsArgs &a) {
  // Positions are int32: a row longer than that has no docStart array.
  if (!a.tokens || !a.docStart || a.batch <= 0 || a.seq <= 0 ||
      a.seq > std::numeric_limits<int32_t>::max())
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::documentStarts,
                  [&] { return ref::documentStarts(a); });
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

Status swiGluForward(const KernelContext &ctx, const SwiGluForwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.gate || !a.up || !a.y || a.rows <= 0 ||
      a.cols <= 0 || !strideOk(a.gateStride, a.cols) ||
      !strideOk(a.upStride, a.cols) || !strideOk(a.yStride, a.cols))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::swiGluForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::swiGluForward<decltype(tag)>(a);
    });
  });
}

Status swiGluBackward(const KernelContext &ctx, const SwiGluBackwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.gate || !a.up || !a.dy || a.rows <= 0 ||
      a.cols <= 0 || !strideOk(a.gateStride, a.cols) ||
      !strideOk(a.upStride, a.cols) || !strideOk(a.dyStride, a.cols) ||
      !strideOk(a.dgateStride, a.cols) || !strideOk(a.dupStride, a.cols))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::swiGluBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::swiGluBackward<decltype(tag)>(a);
    });
  });
}

Status sigmoidGateForward(const KernelContext &ctx,
                          const SigmoidGateForwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.o || !a.gate || !a.y || a.rows <= 0 ||
      a.cols <= 0 || !strideOk(a.oStride, a.cols) ||
      !strideOk(a.gateStride, a.cols) || !strideOk(a.yStride, a.cols))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::sigmoidGateForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::sigmoidGateForward<decltype(tag)>(a);
    });
  });
}

Status sigmoidGateBackward(const KernelContext &ctx,
                           const SigmoidGateBackwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.o || !a.gate || !a.dy || a.rows <= 0 ||
      a.cols <= 0 || !strideOk(a.oStride, a.cols) ||
      !strideOk(a.gateStride, a.cols) || !strideOk(a.dyStride, a.cols) ||
      !strideOk(a.doStride, a.cols) || !strideOk(a.dgateStride, a.cols))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::sigmoidGateBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::sigmoidGateBackward<decltype(tag)>(a);
    });
  });
}

Status residualAddForward(const KernelContext &ctx, const ResidualAddArgs &a) {
  if (!isFloatType(a.dtype) || !a.a || !a.b || !a.y || a.n <= 0)
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::residualAddForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::residualAddForward<decltype(tag)>(a);
    });
  });
}

Status residualAddBackward(const KernelContext &ctx,
                           const ResidualAddBackwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.dy || a.n <= 0)
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::residualAddBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::residualAddBackward<decltype(tag)>(a);
    });
  });
}

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

Status embeddingForward(const KernelContext &ctx,
                        const EmbeddingForwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.ids || !a.w || !a.y || a.tokens <= 0 ||
      a.vocab <= 0 || a.dim <= 0 || !vocabGroupOk(a.group, a.vocab))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::embeddingForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::embeddingForward<decltype(tag)>(a);
    });
  });
}

Status embeddingBackward(const KernelContext &ctx,
                         const EmbeddingBackwardArgs &a) {
  if (!isFloatType(a.dtype) || !a.ids || !a.dy || !a.dw || a.tokens <= 0 ||
      a.vocab <= 0 || a.dim <= 0 || !vocabGroupOk(a.group, a.vocab))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::embeddingBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::embeddingBackward<decltype(tag)>(a);
    });
  });
}

//===----------------------------------------------------------------------===//
// LM head + cross-entropy
//===----------------------------------------------------------------------===//

static bool ceOk(const LmHeadCrossEntropyArgs &a) {
  return isFloatType(a.dtype) && a.hidden && a.weight && a.labels &&
         a.lossSum && a.tokens > 0 && a.dim > 0 && a.vocab > 0 &&
         a.chunkTokens > 0 && vocabGroupOk(a.group, a.vocab) &&
         (a.group.ranks == 1 || a.group.allGather);
}

Status lmHeadCrossEntropyForward(const KernelContext &ctx,
                                 const LmHeadCrossEntropyArgs &a) {
  if (!ceOk(a))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::lmHeadCrossEntropyForward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::lmHeadCrossEntropy<decltype(tag)>(ctx, a, false);
    });
  });
}

Status lmHeadCrossEntropyBackward(const KernelContext &ctx,
                                  const LmHeadCrossEntropyArgs &a) {
  if (!ceOk(a))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::lmHeadCrossEntropyBackward, [&] {
    return byDType(a.dtype, [&](auto tag) {
      return ref::lmHeadCrossEntropy<decltype(tag)>(ctx, a, true);
    });
  });
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

Status gradNorm(const KernelContext &ctx, const GradNormArgs &a) {
  if (!a.norm || a.numTensors < 0 || (a.numTensors > 0 && !a.tensors))
    return Status::InvalidArgument;
  for (int64_t t = 0; t < a.numTensors; ++t)
    if (a.tensors[t].n < 0 || (a.tensors[t].n > 0 && !a.tensors[t].data) ||
        (a.tensors[t].dtype != DType::F32 && a.tensors[t].dtype != DType::BF16))
      return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::gradNorm, [&] { return ref::gradNorm(a); });
}

AdamWScalars adamWScalars(const AdamWArgs &a) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  return {float(a.lr / bc1),
          float(std::sqrt(bc2)),
          float(1.0 - a.lr * a.weightDecay),
          float(a.beta1),
          float(a.beta2),
          float(a.eps)};
}

namespace {
bool adamWArgsOk(const AdamWArgs &a) {
  return a.master && a.expAvg && a.expAvgSq && a.grad && a.n >= 0 &&
         a.step >= 1 &&
         (a.gradDType == DType::F32 || a.gradDType == DType::BF16) &&
         (!a.computeCopy || a.computeDType == DType::BF16 ||
          a.computeDType == DType::F32);
}
} // namespace

Status adamWStep(const KernelContext &ctx, const AdamWArgs &a) {
  if (!adamWArgsOk(a))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::adamWStep, [&] { return ref::adamWStep(a); });
}

Status adamWSteps(const KernelContext &ctx, const AdamWBatchArgs &a) {
  if (a.numTensors < 0 || (a.numTensors > 0 && !a.tensors))
    return Status::InvalidArgument;
  for (int64_t t = 0; t < a.numTensors; ++t)
    if (!adamWArgsOk(a.tensors[t]))
      return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::adamWSteps, [&] {
    for (int64_t t = 0; t < a.numTensors; ++t) {
      const AdamWArgs &x = a.tensors[t];
      if (Status st = ref::adamWStep(x); st != Status::Ok)
        return st;
      if (a.zeroGrads)
        std::memset(const_cast<void *>(x.grad), 0,
                    size_t(x.n) * (x.gradDType == DType::BF16 ? 2 : 4));
    }
    return Status::Ok;
  });
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

Status copyRows(const KernelContext &ctx, const CopyRowsArgs &a) {
  if (a.outer < 0 || a.rowBytes < 0 || a.repeats < 0 ||
      a.srcPitch < a.rowBytes || a.dstPitch < a.repeats * a.rowBytes)
    return Status::InvalidArgument;
  if (a.outer == 0 || a.rowBytes == 0 || a.repeats == 0)
    return Status::Ok;
  if (!a.src || !a.dst)
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::copyRows, [&] { return ref::copyRows(a); });
}

Status sumRepeats(const KernelContext &ctx, const SumRepeatsArgs &a) {
  if (!isFloatType(a.dtype) || a.outer < 0 || a.repeats < 0 || a.inner < 0 ||
      (a.outer * a.inner > 0 && (!a.x || !a.y)))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::sumRepeats, [&] {
    return byDType(a.dtype,
                   [&](auto tag) { return ref::sumRepeats<decltype(tag)>(a); });
  });
}

Status convertDType(const KernelContext &ctx, const ConvertArgs &a) {
  if (!isFloatType(a.from) || !isFloatType(a.to) || a.n < 0 ||
      (a.n > 0 && (!a.x || !a.y)))
    return Status::InvalidArgument;
  return dispatch(ctx, a, &cuda::convertDType,
                  [&] { return ref::convertDType(a); });
}

} // namespace ap::kernels
