//===- generated.cpp - launching generated kernels ------------------------===//
#include "runtime/generated.h"

#include "runtime/error.h"

#include <cstring>

namespace ap::rt {

uint64_t generatedWork(const GeneratedLaunch &launch,
                       const ap_generated_entry &entry) {
  uint64_t work = 1;
  for (int32_t w : entry.work_params) {
    if (w < 0)
      continue;
    int64_t v;
    std::memcpy(&v, &launch.slots[w], sizeof v);
    if (v < 0)
      fail("generated kernel '", launch.kernel->name, "' entry '", entry.name,
           "': thread count parameter ", w, " is ", v);
    work *= uint64_t(v);
  }
  return work;
}

kernels::Status launchGenerated(const kernels::KernelContext &ctx,
                                GeneratedLaunch &launch) {
  size_t n = std::strlen(launch.kernel->params);
  if (n == 0 || n > AP_GENERATED_MAX_PARAMS)
    fail("generated kernel '", launch.kernel->name, "': ", n,
         " parameters (1 to ", AP_GENERATED_MAX_PARAMS, " supported)");
  void *params[AP_GENERATED_MAX_PARAMS];
  for (size_t i = 0; i < n; ++i)
    params[i] = &launch.slots[i];
  if (ctx.backend == kernels::Backend::Host) {
    launch.kernel->host(params);
    return kernels::Status::Ok;
  }
  launchGeneratedCuda(ctx.stream, launch, params);
  return kernels::Status::Ok;
}

#ifndef ACTPLACE_HAVE_CUDA
void launchGeneratedCuda(void *, const GeneratedLaunch &launch, void **) {
  fail("generated kernel '", launch.kernel->name,
       "': this runtime was built without CUDA");
}
#endif

} // namespace ap::rt
