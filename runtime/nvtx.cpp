//===- nvtx.cpp - NVTX ranges (compiled out without NVTX) -------*- C++ -*-===//
#include "runtime/nvtx.h"

#include "runtime/error.h"

#if defined(ACTPLACE_HAVE_NVTX) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define AP_RT_USE_NVTX 1
#else
#define AP_RT_USE_NVTX 0
#endif

namespace ap::rt {
namespace {
thread_local int depth = 0;
} // namespace

void rangePush(const char *name) {
  ++depth;
#if AP_RT_USE_NVTX
  nvtxRangePushA(name ? name : "?");
#else
  (void)name;
#endif
}

void rangePop() {
  if (depth == 0)
    fail("nvtx: rangePop without a matching rangePush");
  --depth;
#if AP_RT_USE_NVTX
  nvtxRangePop();
#endif
}

int rangeDepth() { return depth; }

bool rangesReachNvtx() { return AP_RT_USE_NVTX != 0; }

} // namespace ap::rt
