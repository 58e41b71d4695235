//===- generated.cpp - launching generated kernels ------------------------===//
#include "runtime/generated.h"

#include "runtime/error.h"

#include <cstring>

namespace ap::rt {

uint64_t generatedWork(const GeneratedLaunch &launch,
                       const ap_generated_entry &entry) {
  uint64_t factors[2] = {1, 1};
  int last = -1;
  for (int i = 0; i < 2; ++i) {
    int32_t w = entry.work_params[i];
    if (w < 0)
      continue;
    int64_t v;
    std::memcpy(&v, &launch.slots[w], sizeof v);
    if (v < 0)
      fail("generated kernel '", launch.kernel->name, "' entry '", entry.name,
           "': thread count parameter ", w, " is ", v);
    factors[i] = uint64_t(v);
    last = i;
  }
  // The last factor counts elements; an item is `vector` of them.
  uint64_t vec = entry.vector > 1 ? uint64_t(entry.vector) : 1;
  if (last >= 0)
    factors[last] = (factors[last] + vec - 1) / vec;
  return factors[0] * factors[1];
}

kernels::Status launchGenerated(const kernels::KernelContext &ctx,
                                GeneratedLaunch &launch) {
  size_t n = std::strlen(launch.kernel->params);
  if (n == 0 || n > AP_GENERATED_MAX_PARAMS)
    fail("generated kernel '", launch.kernel->name, "': ", n,
         " parameters (1 to ", AP_GENERATED_MAX_PARAMS, " supported)");
  // A Triton kernel's hidden trailing pointers (its scratch) are null.
  static const uint64_t kNull = 0;
  // The arguments: the slots, with the stream's workspace in place of the
  // bytes a 'w' parameter asks for (a copy: the launch may run again).
  uint64_t slots[AP_GENERATED_MAX_PARAMS];
  void *params[AP_GENERATED_MAX_PARAMS];
  for (size_t i = 0; i < n; ++i) {
    slots[i] = launch.slots[i];
    params[i] = &slots[i];
    if (launch.kernel->params[i] != 'w')
      continue;
    uint64_t need = launch.slots[i];
    if (need > 0 && (!ctx.workspace || ctx.workspaceBytes < need))
      fail("generated kernel '", launch.kernel->name, "': parameter ", i,
           " needs ", need, " bytes of kernel workspace, the stream has ",
           ctx.workspace ? ctx.workspaceBytes : 0);
    slots[i] = reinterpret_cast<uintptr_t>(ctx.workspace);
  }
  if (launch.kernel->triton) {
    if (n + size_t(launch.kernel->hidden_params) > AP_GENERATED_MAX_PARAMS)
      fail("Triton kernel '", launch.kernel->name, "': too many parameters");
    for (int32_t h = 0; h < launch.kernel->hidden_params; ++h)
      params[n + size_t(h)] = const_cast<uint64_t *>(&kNull);
    if (ctx.backend == kernels::Backend::Host)
      fail("Triton kernel '", launch.kernel->name,
           "' runs on the cuda backend only (it has no host form; compile "
           "without --triton-kernel for the host backend)");
  }
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
