//===- CostModel.h - predicted time and bytes of train ops ------*- C++ -*-===//
//
// A roofline time model of every train op (forward, backward, step and
// placement ops) plus the bandwidths of the host links. Placement passes use
// it to predict when a copy finishes relative to compute (StreamSimulation)
// and what each op needs as scratch (MemoryTimeline). Every device constant
// lives in DeviceProfile so that a measured profile (a JSON file) can replace
// the H200 defaults without touching the formulas; docs/cost-model.md states
// the formulas.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_COSTMODEL_H
#define ACTPLACE_PASSES_ANALYSIS_COSTMODEL_H

#include "mlir/IR/Operation.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace ap::train {

/// The device constants of the cost model. Defaults are one H200 (dense BF16
/// tensor-core peak, HBM3e bandwidth) and the PCIe rates measured on our H200
/// host: 55 GB/s one way, ~101 GB/s for both directions at once.
/// Per-op tables of a profile (op name -> value), looked up by an op's name
/// without building a string (std::less<> compares with string views).
using OpTable = std::map<std::string, double, std::less<>>;

struct DeviceProfile {
  /// Dense BF16 tensor-core FLOP/s.
  double peakFlops = 790e12;
  /// Device memory capacity in bytes (--memory-budget=device): the H200's
  /// as nvidia-smi reports it, 143771 MiB.
  double deviceMemoryBytes = 143771.0 * 1048576.0;
  /// Device memory bytes/s.
  double memBandwidth = 4.0e12;
  /// Seconds added to every kernel launch.
  double launchLatency = 4e-6;
  /// Host link bytes/s for one direction while the other is idle.
  double d2hBandwidth = 55e9, h2dBandwidth = 55e9;
  /// Host link bytes/s of both directions together while both are busy; each
  /// direction gets a share proportional to its one-way bandwidth.
  double duplexBandwidth = 101e9;
  /// Calibration (bench/qwen_train_bench.py calibrate): measured compute
  /// time over the time the rates above predict. Every op's predicted
  /// seconds are multiplied by it; 1 uses the rates as they are.
  double computeScale = 1.0;
  /// Measured time of kernelgen's kernel over the library kernel's, by train
  /// op ("train.swiglu"; "train.add_rms_norm": the fused kernel over the add
  /// and RMSNorm it replaces), at the model's shapes (bench/qwenbench's op
  /// times of a --kernels=generated arm against the library arm).
  /// --kernels=auto generates the ops below 1; absent ops stay library.
  OpTable generatedKernelRatio;
  /// The train ops whose generated kernel the planned step runs (not a
  /// profile key: the compile's --kernels choice, which fromProfile reads
  /// from the module's kModuleGeneratedOpsAttr). Each one's predicted seconds
  /// are multiplied by its generatedKernelRatio (1 where none is recorded);
  /// with "train.add_rms_norm" among them, a train.add whose sum a
  /// train.rms_norm normalizes, and that norm, by the fused kernel's ratio
  /// instead (it replaces both: each keeps that share of its time); with
  /// "train.rms_norm_grad_add", a train.rms_norm_grad whose dx only a
  /// train.add reads, and that add, by that fused ratio; with
  /// "train.rms_norm_grad_sum", each train.add of a chain whose sum only
  /// the next add or, at its end, a train.rms_norm_grad reads as dy, and
  /// that gradient (unless its residual add took it), by that ratio (the
  /// fused kernel over the adds and the gradient it replaces).
  std::set<std::string, std::less<>> generatedOps;
  /// Compute seconds lost per byte copied over the host link: D2H and H2D
  /// copies slow the kernels running beside them (they share HBM and the
  /// SMs' memory system), charged to the compute stream at the op that
  /// issues the copy. 0: copies never slow compute.
  double copySlowdownPerByte = 0.0;
  /// Copy slowdown by what runs beside the copy, in place of
  /// copySlowdownPerByte (a profile gives one or the other): compute seconds
  /// an op loses per byte of H2D (h2dSlowdown) or D2H (d2hSlowdown) that
  /// moves while it runs, by op name ("train.gated_delta_rule_grad"), "*"
  /// for the ops not named (no "*": they lose nothing). The stream
  /// simulation charges each op for the bytes its run overlaps. On the H200
  /// an H2D costs the GDN chunk backward a quarter of what it costs a
  /// model-shape GEMM per byte, and a D2H costs either almost nothing
  /// (bench/notes/runtime.md).
  OpTable h2dSlowdown, d2hSlowdown;
  /// Multiplies h2dSlowdown / d2hSlowdown in a step that runs recompute on
  /// the side stream (any op marked train.side_stream). Copies there land
  /// beside the side GEMMs as well as the kernel they overlap, and on the
  /// H200 one-stream placements fit the per-kernel rates x 2 while
  /// side-stream placements with offload fit x 3.5 (bench/notes/training.md).
  /// 1: the same rates either way.
  double sideStreamCopyScale = 1.0;
  /// Calibration: how long offloaded bytes stay reserved after a D2H is
  /// issued, as a multiple of the predicted issue-to-end time, minus 1. A D2H
  /// that ends later than predicted while the next writer of its region is
  /// already due stalls compute; on the H200 the tight holds (0) of placements
  /// made under a calibrated profile cost 6-7 ms per step, and 0.3 none
  /// (bench/notes/training.md). 0: held exactly as predicted.
  double copyHoldSlack = 0.0;
  /// Per op name ("train.gated_delta_rule"): measured over rate-based time
  /// of that op alone (from the kernel benchmarks); replaces computeScale
  /// for the ops it names.
  OpTable opScale;
  /// Side-stream capacity by op name ("*" for the ops not named; absent:
  /// 0): seconds of side-stream work (recompute issued ahead, at its own
  /// alone speed) that run beside one second of the op without slowing it.
  /// A kernel that leaves most SMs idle hosts side work; a GEMM or a
  /// bandwidth-bound kernel hosts none. The GDN chunk backward does so in
  /// its SM-sparing form (its sequential state passes unsplit: about 32 of
  /// 132 SMs at one sequence), which it runs where it hosts side work and
  /// which costs sideHostScale (below); the capacity is that form's. On
  /// the H200
  /// the H200: alone with one stream of GEMMs beside it, the chunk backward
  /// of one Qwen3.5-0.8B layer (0.887 ms) absorbed eight model-shape GEMMs
  /// (0.40 ms at full speed) run on 99 SMs at +0.013 ms, twelve (0.60 ms)
  /// at +0.14 ms: capacity about 0.45 (runtime_offload_bench overlap,
  /// bench/notes/runtime.md). In the training step the side stream hid
  /// about half as much: two placements measured as capacity 0.20 and 0.23
  /// would predict. With side work enqueued after its host and held until
  /// the host's first, SM-filling launch (exec-defer-side-issue, the
  /// default), the 60 % placement measured what 0.27 predicts; the default
  /// is that (bench/notes/training.md has the runs).
  OpTable sideCapacity = {{"train.gated_delta_rule_grad", 0.27}};
  /// By op name: the time of an op that hosts side work (marked
  /// train.side_host, which lowers it to its SM-sparing form) over its
  /// default time. The GDN chunk backward splits each state slice over 4
  /// warps at one sequence (every SM busy, 1.39x faster on an H100:
  /// bench/notes/gdn.md, "split state passes"); hosting, it runs unsplit.
  /// Ops not named: 1.
  OpTable sideHostScale = {{"train.gated_delta_rule_grad", 1.39}};
  /// The share of the SMs, in percent (1 to 100), that side-stream GEMMs
  /// ask for (cuBLASLt's SM count target), leaving the rest to the kernel
  /// they run beside: sideCapacity holds for this share only. The
  /// compiler writes it into the program (convert-train-to-exec sets
  /// exec.step's exec.side_sm_percent, the emitter ap_program's
  /// side_sm_percent) so the runtime runs what the model assumed. On the
  /// H200 with Qwen3.5-0.8B, 60, 80 and 99 of 132 SMs measured alike, 110
  /// SMs or no target two to three times the cost (bench/notes/training.md);
  /// every side capacity above was fitted at 75 (99 SMs).
  int64_t sideSmPercent = 75;

  /// Collectives over data-parallel ranks, priced in NCCL's bus-bandwidth
  /// convention (nccl-tests doc/PERFORMANCE.md): a ring all-reduce of S
  /// bytes over N ranks takes 2(N-1)/N * S / allReduceBusBandwidth +
  /// allReduceLatency, an all-gather or reduce-scatter of S bytes (the
  /// whole gathered size) (N-1)/N * S / its bus bandwidth + its latency.
  /// Bytes/s and seconds per collective. The defaults are not measured
  /// here: the bandwidths are a round figure of public nccl-tests results
  /// for large messages on H100 / H200 SXM nodes (NVLink 4, 450 GB/s per
  /// direction, NVLink SHARP off), the latencies the order of their
  /// small-message times. A measured profile should replace them.
  double allReduceBusBandwidth = 360e9, allReduceLatency = 15e-6;
  double allGatherBusBandwidth = 360e9, allGatherLatency = 15e-6;
  double reduceScatterBusBandwidth = 360e9, reduceScatterLatency = 15e-6;

  /// Whether copies slow the ops beside them (h2dSlowdown / d2hSlowdown)
  /// rather than the op that issues them (copySlowdownPerByte).
  bool slowdownBesideCopies() const {
    return !h2dSlowdown.empty() || !d2hSlowdown.empty();
  }

  /// Reads a JSON object whose keys are any subset of the field names above
  /// (`peakFlops`, `memBandwidth`, `launchLatency`, `d2hBandwidth`,
  /// `h2dBandwidth`, `duplexBandwidth`, `computeScale`,
  /// `copySlowdownPerByte`, `copyHoldSlack`, `sideStreamCopyScale`, the
  /// collectives' `allReduceBusBandwidth`, `allReduceLatency`,
  /// `allGatherBusBandwidth`, `allGatherLatency`,
  /// `reduceScatterBusBandwidth`, `reduceScatterLatency`) with
  /// positive numbers as values (launchLatency, copySlowdownPerByte,
  /// copyHoldSlack and the collective latencies may be 0), and
  /// the objects `opScale` (op name -> positive number), `h2dSlowdown` and
  /// `d2hSlowdown` (op name or "*" -> non-negative number; not together
  /// with a non-zero copySlowdownPerByte), `sideCapacity` (op name or "*"
  /// -> number in [0, 1]; replaces the default table), `sideHostScale`
  /// (op name -> number >= 1; replaces the default table), `sideSmPercent`
  /// (a whole number from 1 to 100);
  /// absent fields keep their defaults. An unknown key, a non-numeric or
  /// non-positive value, or malformed JSON is an error naming the file and
  /// the offending key.
  static llvm::Expected<DeviceProfile> load(llvm::StringRef jsonPath);
  /// The same, from JSON text; `origin` names the source in messages.
  static llvm::Expected<DeviceProfile> parse(llvm::StringRef json,
                                             llvm::StringRef origin);

  /// Which file load() read this profile from: one number per path and
  /// content it parsed (0 for a profile not from load()). Cost models of
  /// one loaded profile share their per-op-name cache through it
  /// (CostModel::fromProfile).
  uint64_t loadedAs = 0;
};

/// Predicted work of one op on the compute stream.
struct OpCost {
  /// Floating-point operations (multiply and add counted separately).
  double flops = 0;
  /// Device-memory bytes read plus written, main-grad and optimizer-state
  /// traffic included.
  double bytes = 0;
  /// launchLatency + max(flops / peakFlops, bytes / memBandwidth), or 0 for
  /// ops that launch no kernel (views, param_ref, yield, placement ops).
  double seconds = 0;
  // Scratch memory is not a prediction: the kernel library's queries state
  // it (passes/analysis/KernelWorkspace.h).
};

/// Which host link a copy uses.
enum class CopyDirection { DeviceToHost, HostToDevice };

/// A collective over data-parallel ranks (DeviceProfile prices each).
enum class Collective { AllReduce, AllGather, ReduceScatter };

class CostModel {
public:
  explicit CostModel(DeviceProfile p = {});

  /// Roofline cost of `op`. Ops outside the train dialect and regions (the
  /// microbatch loop op itself) cost nothing: their contents are costed op
  /// by op.
  OpCost cost(mlir::Operation *op) const;

  /// Seconds to move `bytes` over one host link when the other direction is
  /// (or is not) busy at the same time. Without a direction the slower of
  /// the two links is assumed.
  double copySeconds(int64_t bytes, bool otherDirectionBusy) const;
  double copySeconds(int64_t bytes, CopyDirection dir,
                     bool otherDirectionBusy) const;
  /// Bytes/s of one direction, alone or sharing the link with the other.
  double copyBandwidth(CopyDirection dir, bool otherDirectionBusy) const;
  /// Compute seconds `op` loses per byte copied in `dir` while it runs
  /// (DeviceProfile::h2dSlowdown / d2hSlowdown; 0 without them).
  double slowdownBeside(mlir::Operation *op, CopyDirection dir) const;
  /// DeviceProfile::sideCapacity of `op` (0 for ops it does not name).
  double sideCapacity(mlir::Operation *op) const;
  /// Seconds of one `kind` collective of `bytes` over `ranks` ranks (for an
  /// all-gather or reduce-scatter, `bytes` is the whole gathered size): the
  /// bus-bandwidth formula of DeviceProfile. 0 for one rank or no bytes.
  double collectiveSeconds(Collective kind, int64_t bytes, int64_t ranks) const;

  const DeviceProfile &profile() const { return prof; }

  /// The cost model of the profile at `profilePath`, or of the H200
  /// defaults when the path is empty. A profile that cannot be read or
  /// parsed is an error on `diagnosticOp`, prefixed with `who` (the pass
  /// name and ": ", or nothing).
  static mlir::FailureOr<CostModel> fromProfile(llvm::StringRef profilePath,
                                                mlir::Operation *diagnosticOp,
                                                llvm::StringRef who = "");

private:
  /// The profile's per-op-name values for one op name: its compute scale
  /// (opScale with the aliases cost() documents, or computeScale), copy
  /// slowdowns and side capacity.
  struct NameValues {
    double scale = 1, h2dSlowdown = 0, d2hSlowdown = 0, sideCapacity = 0,
           sideHostScale = 1;
    /// generatedKernelRatio where the op's kernel is generated, else 1.
    double generated = 1;
  };
  /// The generated-kernel factor of `op` (NameValues::generated, or the
  /// fused add + RMSNorm ratio for a fused pair's add and norm).
  double generatedFactor(mlir::Operation *op, const NameValues &v) const;
  /// NameValues of `op`'s name, resolved once per name, cost model and
  /// thread: the tables are string-keyed maps, and the placement search
  /// asks for every op of thousands of placed clones.
  NameValues valuesOf(mlir::Operation *op) const;
  NameValues resolve(mlir::Operation *op) const;

  DeviceProfile prof;
  /// Distinguishes cost models (and their profiles) in the per-thread cache;
  /// a copy shares its source's, as it shares its profile.
  uint64_t id;
};

/// The module attribute naming the train ops whose generated kernel the
/// step runs (an array of op names, set by actplace-compile from --kernels;
/// DeviceProfile::generatedOps).
inline constexpr llvm::StringLiteral kModuleGeneratedOpsAttr =
    "actplace.generated_ops";

/// The scope key used in reports: "L<layer>.<leaf>" for decoder layers,
/// "model.<leaf>" for model-level leaves (layer -1), "" when `op` has no
/// `scope` attribute.
std::string scopeKey(mlir::Operation *op);

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_COSTMODEL_H
