//===- generated.h - launching the compiler's generated kernels -*- C++ -*-===//
//
// A generated kernel (runtime/abi.h ap_generated_kernel) takes one 8-byte
// argument slot per parameter. Both backends launch it from one array of
// pointers to the slots: the host backend calls the kernel's packed host
// function with it, the cuda backend hands it to cuLaunchKernel for each GPU
// entry in order, after loading the program's PTX once per process and
// device (CUDA driver API, libcuda opened at run time, so a binary starts
// without a driver).
//
// Invariants, checked on every launch: the kernel has 1 to
// AP_GENERATED_MAX_PARAMS parameters, each entry's thread count is a product
// of non-negative int64 parameters, a cuda launch has PTX holding every entry.
// Errors name the kernel, the entry and the failing driver call.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_GENERATED_H
#define ACTPLACE_RUNTIME_GENERATED_H

#include "kernels/kernels.h"
#include "runtime/abi.h"

#include <cstdint>

namespace ap::rt {

/// One launch: the kernel, the program's PTX (may be null) and a copy of the
/// argument slots.
struct GeneratedLaunch {
  const ap_generated_kernel *kernel = nullptr;
  const char *ptx = nullptr;
  /// The parameters' slots, then a Triton kernel's grid (x, y, z).
  uint64_t slots[AP_GENERATED_MAX_PARAMS + 3] = {};
};

/// The threads of `entry` for the arguments of `launch` (the product of its
/// work parameters); throws naming the kernel if one is negative.
uint64_t generatedWork(const GeneratedLaunch &launch,
                       const ap_generated_entry &entry);

/// Runs `launch` on ctx's backend (host: the packed host function, now;
/// cuda: each GPU entry on ctx.stream). Throws ap::rt::Error on failure.
kernels::Status launchGenerated(const kernels::KernelContext &ctx,
                                GeneratedLaunch &launch);

/// The cuda half (runtime/cuda/generated_cuda.cpp; without CUDA it throws,
/// naming the kernel): loads the PTX once per process and device and
/// launches every entry of the kernel on `stream`.
void launchGeneratedCuda(void *stream, const GeneratedLaunch &launch,
                         void **params);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_GENERATED_H
