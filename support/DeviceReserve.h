//===- DeviceReserve.h - Device memory the plan cannot have -----*- C++ -*-===//
//
// What a training binary keeps back from the device memory before its
// planned arena: one set of numbers for the binary's start-up check
// (runtime/trainer.cpp, against the free memory it finds) and for the
// compiler's `--memory-budget=device` (against the device profile's
// capacity, before any process exists). Header-only so the runtime needs no
// new library.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_SUPPORT_DEVICERESERVE_H
#define ACTPLACE_SUPPORT_DEVICERESERVE_H

#include <cstdint>

namespace ap::support {

/// cuBLASLt's handle and its heuristics' scratch, allocated by the library
/// beside the arena.
inline constexpr uint64_t kCudaLibraryReserveBytes = uint64_t(256) << 20;
/// NCCL's buffers and channels on a run of several ranks.
inline constexpr uint64_t kNcclReserveBytes = uint64_t(512) << 20;
/// The CUDA context (driver, module images of the kernels): the free memory
/// the binary checks against is already net of it, a capacity is not.
inline constexpr uint64_t kCudaContextReserveBytes = uint64_t(768) << 20;

/// Bytes kept back from the free device memory at start.
inline constexpr uint64_t startReserveBytes(int64_t worldSize) {
  return kCudaLibraryReserveBytes + (worldSize > 1 ? kNcclReserveBytes : 0);
}

/// Bytes kept back from the device's capacity (the compiler's view).
inline constexpr uint64_t capacityReserveBytes(int64_t worldSize) {
  return kCudaContextReserveBytes + startReserveBytes(worldSize);
}

} // namespace ap::support

#endif // ACTPLACE_SUPPORT_DEVICERESERVE_H
