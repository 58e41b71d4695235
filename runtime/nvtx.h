//===- nvtx.h - NVTX ranges for ops and scopes ------------------*- C++ -*-===//
//
// Generated code brackets every op and every module scope with a range so a
// profiler (Nsight Systems) shows the compiled plan on the timeline. With
// NVTX available (CUDA builds) the ranges go to NVTX; without it they compile
// to a depth counter only. The counter is kept in both cases so tests can
// check that generated code pushes and pops in balance.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_NVTX_H
#define ACTPLACE_RUNTIME_NVTX_H

namespace ap::rt {

/// Opens a named range on the calling thread (e.g. "L3/gdn_core_attn").
void rangePush(const char *name);
/// Closes the innermost range of the calling thread.
void rangePop();
/// Ranges currently open on the calling thread.
int rangeDepth();
/// True when ranges reach NVTX (built with CUDA and nvtx3).
bool rangesReachNvtx();

/// Range for the lifetime of a C++ scope.
class ScopedRange {
public:
  explicit ScopedRange(const char *name) { rangePush(name); }
  ~ScopedRange() { rangePop(); }
  ScopedRange(const ScopedRange &) = delete;
  ScopedRange &operator=(const ScopedRange &) = delete;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_NVTX_H
