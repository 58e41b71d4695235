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
/// The CUDA context (driver, module images of the kernels) as the driver
/// counts it for the process (nvidia-smi's per-process memory): what
/// `--memory-budget=process:SIZE` keeps back beside the library reserves.
/// The process's count beyond its arena was about 520 MiB on an H100.
inline constexpr uint64_t kCudaContextReserveBytes = uint64_t(768) << 20;
/// What a device does not offer a fresh process: its capacity (nvidia-smi's
/// total, a device profile's deviceMemoryBytes) less the free memory the
/// binary's start-up check reads after creating its context. That is the
/// context plus what the driver holds back for the device itself, more than
/// the process's own count: 1,011 MiB on an H100 80GB (CUDA 13, driver 580;
/// 81,559 MiB total, 80,548 MiB free). `--memory-budget=device` keeps this
/// back, with a margin, so a plan that uses its whole budget passes the
/// check.
inline constexpr uint64_t kDeviceStartGapBytes = uint64_t(1152) << 20;

/// Bytes kept back from the free device memory at start.
inline constexpr uint64_t startReserveBytes(int64_t worldSize) {
  return kCudaLibraryReserveBytes + (worldSize > 1 ? kNcclReserveBytes : 0);
}

/// Bytes kept back from a process's whole device memory as the driver
/// counts it (`--memory-budget=process:SIZE`).
inline constexpr uint64_t processReserveBytes(int64_t worldSize) {
  return kCudaContextReserveBytes + startReserveBytes(worldSize);
}

/// Bytes kept back from the device's capacity (`--memory-budget=device`):
/// the start-up gap, then what the binary keeps back from the free memory.
inline constexpr uint64_t deviceReserveBytes(int64_t worldSize) {
  return kDeviceStartGapBytes + startReserveBytes(worldSize);
}

} // namespace ap::support

#endif // ACTPLACE_SUPPORT_DEVICERESERVE_H
