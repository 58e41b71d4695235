//===- gdn_entry.cpp - GDN entry points: backend dispatch -------*- C++ -*-===//
//
// Entries of kernels/gdn.h. Host goes to the reference templates. Cuda goes
// to the gdncuda:: functions of actplace_kernels_cuda, which this library
// cannot depend on (it is built without CUDA too): they are declared weak
// here, so that a binary linking the cuda library (and pulling
// kernels/cuda/gdn/gdn_chunk.cu through the anchor in kernels/gdn.h) gets
// them and a CPU-only binary gets Unsupported.
//
//===----------------------------------------------------------------------===//
#include "kernels/reference/gdn/gdn_reference.h"

namespace ap::kernels {
namespace gdncuda {
#define AP_GDN_CUDA_DECL(Name, Args)                                           \
  __attribute__((weak)) Status Name(const KernelContext &, const Args &);
AP_GDN_CUDA_DECL(convForward, GdnConvArgs)
AP_GDN_CUDA_DECL(convBackward, GdnConvArgs)
AP_GDN_CUDA_DECL(gatesForward, GdnGatesArgs)
AP_GDN_CUDA_DECL(gatesBackward, GdnGatesArgs)
AP_GDN_CUDA_DECL(l2NormForward, GdnL2NormArgs)
AP_GDN_CUDA_DECL(l2NormBackward, GdnL2NormArgs)
AP_GDN_CUDA_DECL(chunkForward, GdnChunkArgs)
AP_GDN_CUDA_DECL(chunkBackward, GdnChunkArgs)
AP_GDN_CUDA_DECL(gatedNormForward, GdnGatedNormArgs)
AP_GDN_CUDA_DECL(gatedNormBackward, GdnGatedNormArgs)
#undef AP_GDN_CUDA_DECL
} // namespace gdncuda

namespace {
template <typename Args, typename HostFn>
Status dispatchHost(const Args &a, HostFn &&fn) {
  switch (a.dtype) {
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

} // namespace

#define AP_GDN_ENTRY(Entry, Args, Fn)                                          \
  Status Entry(const KernelContext &ctx, const Args &a) {                      \
    if (ctx.backend == Backend::Cuda) {                                        \
      if (!gdncuda::Fn)                                                        \
        return Status::Unsupported;                                            \
      return gdncuda::Fn(ctx, a);                                              \
    }                                                                          \
    return dispatchHost(                                                       \
        a, [&](auto tag) { return gdnref::Fn<decltype(tag)>(a); });            \
  }
AP_GDN_ENTRY(gdnConvForward, GdnConvArgs, convForward)
AP_GDN_ENTRY(gdnConvBackward, GdnConvArgs, convBackward)
AP_GDN_ENTRY(gdnGatesForward, GdnGatesArgs, gatesForward)
AP_GDN_ENTRY(gdnGatesBackward, GdnGatesArgs, gatesBackward)
AP_GDN_ENTRY(gdnL2NormForward, GdnL2NormArgs, l2NormForward)
AP_GDN_ENTRY(gdnL2NormBackward, GdnL2NormArgs, l2NormBackward)
AP_GDN_ENTRY(gdnChunkForward, GdnChunkArgs, chunkForward)
AP_GDN_ENTRY(gdnChunkBackward, GdnChunkArgs, chunkBackward)
AP_GDN_ENTRY(gdnGatedNormForward, GdnGatedNormArgs, gatedNormForward)
AP_GDN_ENTRY(gdnGatedNormBackward, GdnGatedNormArgs, gatedNormBackward)
#undef AP_GDN_ENTRY

Status gdnRecurrentForwardReference(const GdnChunkArgs &a) {
  return dispatchHost(
      a, [&](auto tag) { return gdnref::recurrentForward<decltype(tag)>(a); });
}

// The workspace queries without a backend answer for the kernels this
// binary has (kernels/gdn.h): the cuda figure where the cuda entry of the
// same object is linked (its weak reference is set), else the host's none.
// The sizes are in kernels/workspace.cpp.
size_t gdnConvBackwardWorkspaceBytes(const GdnConvArgs &a) {
  return gdncuda::convBackward ? gdnConvBackwardWorkspaceBytes(Backend::Cuda, a)
                               : 0;
}
size_t gdnGatesBackwardWorkspaceBytes(const GdnGatesArgs &a) {
  return gdncuda::gatesBackward
             ? gdnGatesBackwardWorkspaceBytes(Backend::Cuda, a)
             : 0;
}
size_t gdnChunkForwardWorkspaceBytes(const GdnChunkArgs &a) {
  return gdncuda::chunkForward ? gdnChunkForwardWorkspaceBytes(Backend::Cuda, a)
                               : 0;
}
size_t gdnChunkBackwardWorkspaceBytes(const GdnChunkArgs &a) {
  return gdncuda::chunkBackward
             ? gdnChunkBackwardWorkspaceBytes(Backend::Cuda, a)
             : 0;
}
size_t gdnGatedNormBackwardWorkspaceBytes(const GdnGatedNormArgs &a) {
  return gdncuda::gatedNormBackward
             ? gdnGatedNormBackwardWorkspaceBytes(Backend::Cuda, a)
             : 0;
}

} // namespace ap::kernels
