//===- runtime.h - The runtime's public header set --------------*- C++ -*-===//
//
// The one include of generated training steps (docs/architecture.md section 2:
// the compiler and the runtime meet only here). Everything is in ap::rt:
//   Device         streams, events, the device arena, kernel launches
//   PinnedPool     planned pinned slots and the staging pool
//   OffloadEngine  D2H / H2D of saved activations with checked invariants
//   StepMetrics    the per-step JSON line, fingerprints, progress line
//   TrainFlags     the training binary's command line
// plus, where present, RNG, data, checkpoints and collectives.
//
// The shape of a generated step (test/unit/runtime/step_tsan_test.cpp runs
// one end to end):
//
//   ap::rt::Device dev({flags.device});            // cuda, or host fallback
//   dev.allocateArena(kPlanBytes, kWorkspaceBytes); // once per run
//   ap::rt::PinnedPool pool(dev, kPinnedLayout);    // once per run
//   ap::rt::OffloadEngine engine(dev, pool);
//   auto sL3 = engine.scope("L3.gdn_core_attn");    // once per scope
//   auto eProd = dev.createEvent(), eD2H = ..., eH2D = ...;
//   // forward
//   dev.launch(Stream::Compute, "L3.gdn_core_attn/fwd",
//              [a = args](const KernelContext &c) { return gdnFwd(c, a); });
//   dev.record(eProd, Stream::Compute);
//   engine.offload(sL3, /*slot=*/4, dev.at(kOffQ), kBytesQ, eProd, eD2H);
//   dev.wait(Stream::Compute, eD2H);   // before a later writer reuses it
//   // backward: at the prefetch anchor, then at the consumer
//   dev.wait(Stream::H2D, eDstFree);   // the destination's last user
//   engine.reload(sL3, 4, dev.at(kOffQ2), kBytesQ, eD2H, eH2D);
//   dev.wait(Stream::Compute, eH2D);
//   // end of step
//   dev.synchronize();
//   pool.assertNoneInUse("step " + std::to_string(step));
//   collectRuntimeMetrics(m, dev, pool, &engine); writer.write(m);
//   engine.resetCounters();
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_RUNTIME_H
#define ACTPLACE_RUNTIME_RUNTIME_H

#include "kernels/kernels.h"
#include "runtime/backend.h"
#include "runtime/cli.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/metrics.h"
#include "runtime/nvtx.h"
#include "runtime/offload.h"
#include "runtime/pinned_pool.h"

#if __has_include("runtime/sha256.h")
#include "runtime/sha256.h"
#endif
#if __has_include("runtime/rng.h")
#include "runtime/rng.h"
#endif
#if __has_include("runtime/data.h")
#include "runtime/data.h"
#endif
#if __has_include("runtime/safetensors.h")
#include "runtime/safetensors.h"
#endif
#if __has_include("runtime/checkpoint.h")
#include "runtime/checkpoint.h"
#endif
#if __has_include("runtime/collectives.h")
#include "runtime/collectives.h"
#endif
#if __has_include("runtime/launch.h")
#include "runtime/launch.h"
#endif

#endif // ACTPLACE_RUNTIME_RUNTIME_H
