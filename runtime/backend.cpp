//===- backend.cpp - Backend names and selection ----------------*- C++ -*-===//
//
// Picks the backend at startup. A binary built with CUDA must still start on
// a machine without a GPU driver (CI has the CUDA libraries but no driver), so
// `--device auto` (the default) falls back to host and says why on one line;
// an explicit cuda request without a usable GPU is an error, so a run never
// reports host numbers as GPU ones.
//
//===----------------------------------------------------------------------===//
#include "runtime/backend.h"

#include "runtime/error.h"

namespace ap::rt {

Backend::~Backend() = default;

const char *deviceKindName(DeviceKind kind) {
  switch (kind) {
  case DeviceKind::Host:
    return "host";
  case DeviceKind::Cuda:
    return "cuda";
  }
  return "?";
}

std::optional<DeviceKind> parseDeviceKind(std::string_view text) {
  if (text == "host")
    return DeviceKind::Host;
  if (text == "cuda")
    return DeviceKind::Cuda;
  return std::nullopt;
}

const char *streamName(Stream stream) {
  switch (stream) {
  case Stream::Compute:
    return "compute";
  case Stream::D2H:
    return "d2h";
  case Stream::H2D:
    return "h2d";
  case Stream::Comm:
    return "comm";
  case Stream::Side:
    return "side";
  }
  return "?";
}

const char *kernelStatusName(kernels::Status status) {
  switch (status) {
  case kernels::Status::Ok:
    return "Ok";
  case kernels::Status::InvalidArgument:
    return "InvalidArgument";
  case kernels::Status::Unsupported:
    return "Unsupported";
  case kernels::Status::BackendError:
    return "BackendError";
  }
  return "?";
}

#ifndef ACTPLACE_HAVE_CUDA
// Built without CUDA (or the ThreadSanitizer build of the host sources): the
// cuda backend exists only as a reason to fall back.
std::unique_ptr<Backend> createCudaBackend(int, std::string *whyNot) {
  if (whyNot)
    *whyNot = "this binary was built without CUDA";
  return nullptr;
}

int visibleCudaDevices() { return 0; }
#endif

std::unique_ptr<Backend> createBackend(std::optional<DeviceKind> requested,
                                       int deviceIndex, std::string *notice) {
  if (notice)
    notice->clear();
  if (requested == DeviceKind::Host)
    return createHostBackend();
  std::string whyNot;
  if (auto cuda = createCudaBackend(deviceIndex, &whyNot))
    return cuda;
  if (requested == DeviceKind::Cuda)
    fail("--device cuda: no usable GPU (", whyNot,
         "); use --device host, or --device auto to fall back to the host "
         "backend");
  if (notice)
    *notice = "actplace: --device auto: no usable GPU (" + whyNot +
              "); falling back to the host backend";
  return createHostBackend();
}

} // namespace ap::rt
