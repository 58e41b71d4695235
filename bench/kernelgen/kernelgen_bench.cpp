//===- kernelgen_bench.cpp - generated kernels against the library --------===//
//
// Times each generated kernel (kernelgen, the PTX of this commit's
// benchSpecs(), compiled in) against the kernel library's kernel for the same
// op at the Qwen3.5-0.8B shapes (T = 4096 tokens), interleaved: every sample
// times each case's library launch and generated launch back to back (the
// order alternating between samples), `--calls` launches per timing over
// `--sets` copies of the operands so the working set exceeds the L2 cache.
// Reports per case the median and range of each, generated / library, and
// both against the copy roofline: the case's minimum traffic (each operand
// read once, each output written once) at the bandwidth of a device-to-device
// copy measured in the same process.
//
//   kernelgen_bench [--samples N] [--calls N] [--sets N] [--only SUBSTR]
//                   [--json FILE]
//
// Output: a table on stdout; with --json, one object per case. Exit 0, 1 on a
// CUDA failure (naming the call), 2 on a bad flag.
//
//===----------------------------------------------------------------------===//
#include "bench/kernelgen/bench_specs.h"
#include "kernels/kernels.h"

#include "kernelgen_bench_ptx.inc"

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace kg = ap::kernelgen;
using namespace ap::kernels;

namespace {

[[noreturn]] void die(const std::string &what) {
  std::fprintf(stderr, "kernelgen_bench: error: %s\n", what.c_str());
  std::exit(1);
}

#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess)                                                     \
      die(std::string(#call) + ": " + cudaGetErrorString(e_));                 \
  } while (0)
#define KS(call)                                                               \
  do {                                                                         \
    Status s_ = (call);                                                        \
    if (s_ != Status::Ok)                                                      \
      die(std::string(#call) + " returned status " + std::to_string(int(s_))); \
  } while (0)

/// The driver calls the generated kernels need, opened at run time.
struct Driver {
  decltype(&::cuModuleLoadDataEx) moduleLoad = nullptr;
  decltype(&::cuModuleGetFunction) getFunction = nullptr;
  decltype(&::cuLaunchKernel) launch = nullptr;
  Driver() {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
      die("libcuda.so.1 cannot be opened (no CUDA driver)");
    moduleLoad =
        reinterpret_cast<decltype(moduleLoad)>(dlsym(h, "cuModuleLoadDataEx"));
    getFunction = reinterpret_cast<decltype(getFunction)>(
        dlsym(h, "cuModuleGetFunction"));
    launch = reinterpret_cast<decltype(launch)>(dlsym(h, "cuLaunchKernel"));
    if (!moduleLoad || !getFunction || !launch)
      die("libcuda.so.1 lacks a driver entry this bench needs");
  }
};

Driver &drv() {
  static Driver *d = new Driver;
  return *d;
}

CUmodule benchModule() {
  static CUmodule module = [] {
    CK(cudaFree(nullptr)); // the primary context, current for the driver
    char log[8192] = {};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER,
                           CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, reinterpret_cast<void *>(uintptr_t(sizeof log))};
    CUmodule m = nullptr;
    if (drv().moduleLoad(&m, kBenchPtx, 2, opts, vals) != CUDA_SUCCESS)
      die(std::string("cuModuleLoadDataEx of the bench's PTX: ") + log);
    return m;
  }();
  return module;
}

/// A generated kernel's launch: every GPU entry of `spec` with one set of
/// argument slots (kernelParams order; workspace parameters get `ws`).
class GenLaunch {
public:
  using Args = std::map<std::string, uint64_t>;

  GenLaunch(const kg::GroupSpec &spec, const Args &args, void *ws)
      : name(kg::kernelName(spec)) {
    std::vector<kg::KernelParam> params = kg::kernelParams(spec);
    std::vector<int64_t> ints(params.size(), 0);
    for (size_t i = 0; i < params.size(); ++i) {
      const kg::KernelParam &p = params[i];
      if (p.kind == 'w') {
        slots.push_back(uint64_t(reinterpret_cast<uintptr_t>(ws)));
        continue;
      }
      auto it = args.find(p.name);
      if (it == args.end())
        die(name + ": the case gives no parameter '" + p.name + "'");
      slots.push_back(it->second);
      if (p.kind == 'l')
        ints[i] = int64_t(it->second);
    }
    for (const kg::GpuEntry &e : kg::gpuEntries(spec)) {
      CUfunction f = nullptr;
      if (drv().getFunction(&f, benchModule(), e.name.c_str()) != CUDA_SUCCESS)
        die("the bench's PTX has no entry " + e.name);
      entries.push_back({f, kg::gpuBlocks(e, ints), unsigned(e.blockSize)});
    }
    for (uint64_t &s : slots)
      pointers.push_back(&s);
  }

  void operator()(cudaStream_t stream) {
    for (const Entry &e : entries) {
      if (e.blocks == 0)
        continue;
      if (drv().launch(e.function, unsigned(e.blocks), 1, 1, e.block, 1, 1, 0,
                       reinterpret_cast<CUstream>(stream), pointers.data(),
                       nullptr) != CUDA_SUCCESS)
        die("cuLaunchKernel of " + name);
    }
  }

private:
  struct Entry {
    CUfunction function;
    uint64_t blocks;
    unsigned block;
  };
  std::string name;
  std::vector<uint64_t> slots;
  std::vector<void *> pointers;
  std::vector<Entry> entries;
};

uint64_t ptr(const void *p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }
uint64_t f32(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
uint64_t f64Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  return b;
}

/// Device operands: one buffer per role, `sets` copies of `elems` elements.
struct Pool {
  int sets = 4;
  int64_t elems = 0;
  std::map<std::string, char *> buffers;
  char *get(const std::string &role, int set, size_t elemBytes) {
    auto it = buffers.find(role);
    if (it == buffers.end()) {
      char *p = nullptr;
      size_t bytes = size_t(elems) * 4 * size_t(sets);
      CK(cudaMalloc(&p, bytes));
      fill(p, bytes, role);
      it = buffers.emplace(role, p).first;
    }
    return it->second + size_t(set) * size_t(elems) * elemBytes;
  }
  /// Random bf16 in [-1, 1) in both halves of each 4-byte word (so an f32
  /// view reads finite values of magnitude about 1e-2 .. 1); positive for
  /// the saved rstd.
  static void fill(char *p, size_t bytes, const std::string &role) {
    std::mt19937 rng(uint32_t(std::hash<std::string>()(role)));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<uint16_t> host(1 << 20);
    for (uint16_t &h : host) {
      float v = u(rng);
      if (role == "rstd")
        v = 0.5f + std::fabs(v);
      uint32_t b;
      std::memcpy(&b, &v, 4);
      h = uint16_t(b >> 16);
    }
    for (size_t off = 0; off < bytes; off += host.size() * 2)
      CK(cudaMemcpy(p + off, host.data(),
                    std::min(bytes - off, host.size() * 2),
                    cudaMemcpyHostToDevice));
  }
};

struct Case {
  std::string name, shape;
  double bytes = 0; ///< minimum traffic: operands read once, outputs written
  std::vector<std::function<void(cudaStream_t)>> lib, gen; ///< one per set
};

struct Result {
  std::vector<float> lib, gen; ///< ms per call, one per sample
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Milliseconds per call of `calls` calls of fn (set i % sets).
float timeCalls(cudaStream_t stream, int calls,
                const std::vector<std::function<void(cudaStream_t)>> &fn) {
  static cudaEvent_t start = nullptr, stop = nullptr;
  if (!start) {
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
  }
  CK(cudaEventRecord(start, stream));
  for (int i = 0; i < calls; ++i)
    fn[size_t(i) % fn.size()](stream);
  CK(cudaEventRecord(stop, stream));
  CK(cudaEventSynchronize(stop));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, start, stop));
  return ms / float(calls);
}

/// Bytes per second of a device-to-device copy of 1 GiB (read + write).
double copyBandwidth(cudaStream_t stream) {
  size_t bytes = size_t(1) << 30;
  char *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemsetAsync(a, 1, bytes, stream));
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i)
    ms.push_back(timeCalls(stream, 3, {[&](cudaStream_t s) {
                             CK(cudaMemcpyAsync(b, a, bytes,
                                                cudaMemcpyDeviceToDevice, s));
                           }}));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * double(bytes) / (median(ms) * 1e-3);
}

constexpr int64_t T = 4096, D = 1024, I = 3584;

std::vector<Case> buildCases(Pool &pool, const KernelContext &ctx0,
                             void *genWs) {
  std::vector<Case> cases;
  const int sets = pool.sets;
  auto bf = [&](const char *role, int s) { return pool.get(role, s, 2); };
  auto fl = [&](const char *role, int s) { return pool.get(role, s, 4); };
  auto spec = [](kg::GroupKind k) { return kg::bench::stepSpec(k); };
  KernelContext ctx = ctx0;
  // The norms' generated arguments for operand set s: every role's buffer
  // under the kernels' parameter names (the same buffers the library calls
  // get), the shape, contiguous strides, eps and the dw parts; GenLaunch
  // takes the names its kernel has.
  auto normArgs = [&](int s, int64_t rows, int64_t dim) {
    GenLaunch::Args a;
    for (const char *role : {"x", "y", "z", "dy", "dx", "dz", "res"})
      a[role] = ptr(bf(role, s));
    a["w"] = ptr(bf("w", 0));
    a["rstd"] = ptr(fl("rstd", s));
    a["dw"] = ptr(fl("dw", 0));
    for (const char *n : {"dim", "xStride", "yStride", "dyStride", "dxStride"})
      a[n] = uint64_t(dim);
    a["rows"] = uint64_t(rows);
    a["eps"] = f32(1e-6f);
    a["dwParts"] = uint64_t(kg::rmsNormDwParts(rows));
    a["dwPartItems"] = uint64_t(kg::rmsNormDwPartItems(rows, dim));
    return a;
  };

  // The library's RMSNorm backward (with dw) of operand set s.
  auto normGradArgs = [&](int s, int64_t rows, int64_t dim) {
    RmsNormBackwardArgs ba;
    ba.x = bf("x", s);
    ba.w = bf("w", 0);
    ba.rstd = fl("rstd", s);
    ba.dy = bf("dy", s);
    ba.dx = bf("dx", s);
    ba.dw = fl("dw", 0);
    ba.rows = rows;
    ba.dim = dim;
    ba.xStride = ba.dyStride = ba.dxStride = dim;
    return ba;
  };

  // RMSNorm forward and backward (with dw) at the hidden size and at the
  // q/k norms' [T x 8 heads, 256].
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{T, D}, {T * 8, 256}}) {
    std::string shape = std::to_string(rows) + "x" + std::to_string(dim);
    double tensor = double(rows * dim * 2);
    Case f{"rms_norm", shape, 2 * tensor + rows * 4.0};
    Case b{"rms_norm_grad", shape, 3 * tensor + rows * 4.0};
    // The backward without the register path (dw partials in shared
    // memory, rows read twice), where the step takes it.
    Case bs{"rms_norm_grad (dw in shared memory)", shape,
            3 * tensor + rows * 4.0};
    kg::GroupSpec bstep =
        kg::bench::stepSpec(kg::GroupKind::RmsNormBackward, dim);
    Case fb{"rms_norm_grad_add (vs grad + add)", shape,
            4 * tensor + rows * 4.0};
    // The same forward with one row a warp read once into registers.
    Case fk{"rms_norm (row in registers)", shape, 2 * tensor + rows * 4.0};
    kg::GroupSpec keep = kg::bench::stepSpec(kg::GroupKind::RmsNormForward);
    keep.rowInRegisters = true;
    for (int s = 0; s < sets; ++s) {
      RmsNormForwardArgs fa;
      fa.x = bf("x", s);
      fa.w = bf("w", 0);
      fa.y = bf("y", s);
      fa.rstd = fl("rstd", s);
      fa.rows = rows;
      fa.dim = dim;
      fa.xStride = fa.yStride = dim;
      f.lib.push_back([=](cudaStream_t) { KS(rmsNormForward(ctx, fa)); });
      f.gen.push_back(
          GenLaunch(kg::bench::stepSpec(kg::GroupKind::RmsNormForward, dim),
                    normArgs(s, rows, dim), genWs));
      fk.lib.push_back(f.lib.back());
      fk.gen.push_back(GenLaunch(keep, normArgs(s, rows, dim), genWs));
      RmsNormBackwardArgs ba = normGradArgs(s, rows, dim);
      b.lib.push_back([=](cudaStream_t) { KS(rmsNormBackward(ctx, ba)); });
      GenLaunch::Args bargs = normArgs(s, rows, dim);
      b.gen.push_back(GenLaunch(bstep, bargs, genWs));
      bs.lib.push_back(b.lib.back());
      bs.gen.push_back(
          GenLaunch(spec(kg::GroupKind::RmsNormBackward), bargs, genWs));
      ResidualAddArgs add;
      add.a = bf("dx", s);
      add.b = bf("res", s);
      add.y = bf("sum", s);
      add.n = rows * dim;
      fb.lib.push_back([=](cudaStream_t) {
        KS(rmsNormBackward(ctx, ba));
        KS(residualAddForward(ctx, add));
      });
      kg::GroupSpec fused = spec(kg::GroupKind::RmsNormBackward);
      fused.addResidual = true;
      GenLaunch::Args fargs = bargs;
      fargs["dx"] = ptr(add.y);
      fb.gen.push_back(GenLaunch(fused, fargs, genWs));
    }
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
    if (bstep.rowInRegisters)
      cases.push_back(std::move(bs));
    if (dim == D) {
      cases.push_back(std::move(fk));
      cases.push_back(std::move(fb));
    }
  }

  // RMSNorm backward fused with the chain of adds forming its dy and with
  // the residual add of its dx (the GDN layers' input norm: 4 addends; the
  // MLP norm: 2) against the library's adds, backward and add.
  for (int addends : {2, kg::kMaxDyAddends}) {
    double tensor = double(T * D * 2);
    Case c{"rms_norm_grad_add sum" + std::to_string(addends) + " (vs " +
               std::to_string(addends - 1) + " adds + grad + add)",
           std::to_string(T) + "x" + std::to_string(D),
           (addends + 3) * tensor + T * 4.0};
    const char *parts[] = {"g0", "g1", "g2", "g3"};
    const char *sums[] = {"s1", "s2", "dy"};
    for (int s = 0; s < sets; ++s) {
      std::vector<ResidualAddArgs> adds;
      for (int k = 1; k < addends; ++k) {
        ResidualAddArgs a;
        a.a = k == 1 ? bf(parts[0], s) : adds.back().y;
        a.b = bf(parts[k], s);
        a.y = bf(k == addends - 1 ? "dy" : sums[k - 1], s);
        a.n = T * D;
        adds.push_back(a);
      }
      RmsNormBackwardArgs ba = normGradArgs(s, T, D);
      ResidualAddArgs res;
      res.a = bf("dx", s);
      res.b = bf("res", s);
      res.y = bf("sum", s);
      res.n = T * D;
      c.lib.push_back([=](cudaStream_t) {
        for (const ResidualAddArgs &a : adds)
          KS(residualAddForward(ctx, a));
        KS(rmsNormBackward(ctx, ba));
        KS(residualAddForward(ctx, res));
      });
      kg::GroupSpec fused = kg::bench::stepSpec(kg::GroupKind::RmsNormBackward);
      fused.addResidual = true;
      fused.dyAddends = addends;
      GenLaunch::Args fargs = normArgs(s, T, D);
      fargs["dy"] = ptr(bf(parts[0], s));
      for (int k = 1; k < addends; ++k)
        fargs["dy" + std::to_string(k)] = ptr(bf(parts[k], s));
      fargs["dx"] = ptr(res.y);
      c.gen.push_back(GenLaunch(fused, fargs, genWs));
    }
    cases.push_back(std::move(c));
  }

  {
    // The fused residual add + RMSNorm against the two library kernels.
    double tensor = double(T * D * 2);
    Case ck{"add_rms_norm (row in registers)",
            std::to_string(T) + "x" + std::to_string(D),
            4 * double(T * D * 2) + T * 4.0};
    kg::GroupSpec keep = kg::bench::stepSpec(kg::GroupKind::AddRmsNormForward);
    keep.rowInRegisters = true;
    Case c{"add_rms_norm (vs add + rms_norm)",
           std::to_string(T) + "x" + std::to_string(D), 4 * tensor + T * 4.0};
    for (int s = 0; s < sets; ++s) {
      ResidualAddArgs add;
      add.a = bf("x", s);
      add.b = bf("res", s);
      add.y = bf("sum", s);
      add.n = T * D;
      RmsNormForwardArgs fa;
      fa.x = add.y;
      fa.w = bf("w", 0);
      fa.y = bf("y", s);
      fa.rstd = fl("rstd", s);
      fa.rows = T;
      fa.dim = D;
      fa.xStride = fa.yStride = D;
      c.lib.push_back([=](cudaStream_t) {
        KS(residualAddForward(ctx, add));
        KS(rmsNormForward(ctx, fa));
      });
      GenLaunch::Args args{
          {"a", ptr(add.a)},     {"b", ptr(add.b)},    {"h", ptr(add.y)},
          {"w", ptr(fa.w)},      {"y", ptr(fa.y)},     {"rstd", ptr(fa.rstd)},
          {"rows", uint64_t(T)}, {"dim", uint64_t(D)}, {"eps", f32(1e-6f)}};
      c.gen.push_back(
          GenLaunch(kg::bench::stepSpec(kg::GroupKind::AddRmsNormForward, D),
                    args, genWs));
      ck.lib.push_back(c.lib.back());
      ck.gen.push_back(GenLaunch(keep, args, genWs));
    }
    cases.push_back(std::move(c));
    cases.push_back(std::move(ck));
  }

  // GDN's per-head norms: [T, 16 heads, 128].
  const int32_t H = 16, K = 128;
  const int64_t rows = T * H;
  const std::string headShape = std::to_string(rows) + "x" + std::to_string(K);
  const double head = double(rows * K * 2);
  {
    Case f{"l2_norm", headShape, 2 * head + rows * 4.0};
    Case b{"l2_norm_grad", headShape, 3 * head + rows * 4.0};
    for (int s = 0; s < sets; ++s) {
      GdnL2NormArgs a;
      a.tokens = T;
      a.heads = H;
      a.dim = K;
      a.x = bf("x", s);
      a.y = bf("y", s);
      a.rstd = fl("rstd", s);
      a.dy = bf("dy", s);
      a.dx = bf("dx", s);
      f.lib.push_back([=](cudaStream_t) { KS(gdnL2NormForward(ctx, a)); });
      b.lib.push_back([=](cudaStream_t) { KS(gdnL2NormBackward(ctx, a)); });
      f.gen.push_back(
          GenLaunch(kg::bench::stepSpec(kg::GroupKind::L2NormForward, K),
                    normArgs(s, rows, K), genWs));
      b.gen.push_back(
          GenLaunch(kg::bench::stepSpec(kg::GroupKind::L2NormBackward, K),
                    normArgs(s, rows, K), genWs));
    }
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
  }
  {
    Case f{"gated_rms_norm", headShape, 3 * head + rows * 4.0};
    Case b{"gated_rms_norm_grad", headShape, 5 * head + rows * 4.0};
    Case bs{"gated_rms_norm_grad (dw in shared memory)", headShape,
            5 * head + rows * 4.0};
    for (int s = 0; s < sets; ++s) {
      GdnGatedNormArgs a;
      a.tokens = T;
      a.heads = H;
      a.dim = K;
      a.x = bf("x", s);
      a.z = bf("z", s);
      a.w = bf("w", 0);
      a.y = bf("y", s);
      a.rstd = fl("rstd", s);
      f.lib.push_back([=](cudaStream_t) { KS(gdnGatedNormForward(ctx, a)); });
      GdnGatedNormArgs g = a;
      g.y = nullptr; // the step's backward without the recomputed y
      g.dy = bf("dy", s);
      g.dx = bf("dx", s);
      g.dz = bf("dz", s);
      g.dw = fl("dw", 0);
      b.lib.push_back([=](cudaStream_t) { KS(gdnGatedNormBackward(ctx, g)); });
      f.gen.push_back(
          GenLaunch(kg::bench::stepSpec(kg::GroupKind::GatedNormForward, K),
                    normArgs(s, rows, K), genWs));
      b.gen.push_back(
          GenLaunch(kg::bench::stepSpec(kg::GroupKind::GatedNormBackward, K),
                    normArgs(s, rows, K), genWs));
      bs.lib.push_back(b.lib.back());
      bs.gen.push_back(GenLaunch(spec(kg::GroupKind::GatedNormBackward),
                                 normArgs(s, rows, K), genWs));
    }
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
    cases.push_back(std::move(bs));
  }
  // The two gated element-wise pairs: SwiGLU over the MLP's [T, I] and the
  // attention output gate over [T x 8 heads, 256]. Forward (a, b) -> y,
  // backward (a, b, dy) -> (da, db); the generated kernels' parameter names
  // in `names`: a, b, y, da, db, then the strides' prefixes.
  struct Pair {
    const char *op;
    int64_t rows, cols;
    kg::GroupKind fwd, bwd;
    const char *a, *b, *da, *db;
  };
  for (const Pair &p :
       {Pair{"swiglu", T, I, kg::GroupKind::SwiGluForward,
             kg::GroupKind::SwiGluBackward, "gate", "up", "dgate", "dup"},
        Pair{"output_gate", T * 8, 256, kg::GroupKind::SigmoidGateForward,
             kg::GroupKind::SigmoidGateBackward, "o", "gate", "dout",
             "dgate"}}) {
    double t = double(p.rows * p.cols * 2);
    std::string shape = std::to_string(p.rows) + "x" + std::to_string(p.cols);
    Case f{p.op, shape, 3 * t};
    Case b{std::string(p.op) + "_grad", shape, 5 * t};
    bool swiglu = p.fwd == kg::GroupKind::SwiGluForward;
    for (int s = 0; s < sets; ++s) {
      const void *a = bf("x", s), *g = bf("z", s), *dy = bf("dy", s);
      void *y = bf("y", s), *da = bf("dx", s), *db = bf("dz", s);
      int64_t r = p.rows, c = p.cols;
      if (swiglu) {
        SwiGluForwardArgs fa{DType::BF16, a, g, y, r, c, c, c, c};
        SwiGluBackwardArgs ba{DType::BF16, a, g, dy, da, db, r,
                              c,           c, c, c,  c,  c};
        f.lib.push_back([=](cudaStream_t) { KS(swiGluForward(ctx, fa)); });
        b.lib.push_back([=](cudaStream_t) { KS(swiGluBackward(ctx, ba)); });
      } else {
        SigmoidGateForwardArgs fa{DType::BF16, a, g, y, r, c, c, c, c};
        SigmoidGateBackwardArgs ba{DType::BF16, a, g, dy, da, db, r,
                                   c,           c, c, c,  c,  c};
        f.lib.push_back([=](cudaStream_t) { KS(sigmoidGateForward(ctx, fa)); });
        b.lib.push_back(
            [=](cudaStream_t) { KS(sigmoidGateBackward(ctx, ba)); });
      }
      auto stride = [](const char *n) { return std::string(n) + "Stride"; };
      const uint64_t cu = uint64_t(c);
      GenLaunch::Args fargs{{p.a, ptr(a)},     {p.b, ptr(g)},
                            {"y", ptr(y)},     {"rows", uint64_t(r)},
                            {"cols", cu},      {stride(p.a), cu},
                            {stride(p.b), cu}, {"yStride", cu}};
      GenLaunch::Args bargs{{p.a, ptr(a)},
                            {p.b, ptr(g)},
                            {"dy", ptr(dy)},
                            {p.da, ptr(da)},
                            {p.db, ptr(db)},
                            {"rows", uint64_t(r)},
                            {"cols", cu},
                            {stride(p.a), cu},
                            {stride(p.b), cu},
                            {"dyStride", cu},
                            {stride(swiglu ? p.da : "do"), cu},
                            {stride(p.db), cu}};
      f.gen.push_back(GenLaunch(spec(p.fwd), fargs, genWs));
      b.gen.push_back(GenLaunch(spec(p.bwd), bargs, genWs));
    }
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
  }
  {
    // RoPE on the attention's q: [1 x T, 8 heads, 256], 64 rotary dims.
    const int64_t heads = 8, hd = 256, rot = 64;
    double t = double(T * heads * hd * 2);
    std::string shape = std::to_string(T) + "x" + std::to_string(heads) + "x" +
                        std::to_string(hd);
    Case f{"rope", shape, 2 * t};
    Case b{"rope_grad", shape, 2 * t};
    for (int s = 0; s < sets; ++s) {
      RopeArgs a;
      a.x = bf("x", s);
      a.y = bf("y", s);
      a.batch = 1;
      a.seq = T;
      a.heads = heads;
      a.headDim = hd;
      a.offset = 0;
      a.rotaryDim = rot;
      a.theta = 1e7;
      f.lib.push_back([=](cudaStream_t) { KS(ropeForward(ctx, a)); });
      b.lib.push_back([=](cudaStream_t) { KS(ropeBackward(ctx, a)); });
      GenLaunch::Args args{{"x", ptr(a.x)},
                           {"y", ptr(a.y)},
                           {"tokens", uint64_t(T)},
                           {"seq", uint64_t(T)},
                           {"heads", uint64_t(heads)},
                           {"headDim", uint64_t(hd)},
                           {"offset", 0},
                           {"rotaryDim", uint64_t(rot)},
                           {"cols", uint64_t(hd - rot / 2)},
                           {"thetaBits", f64Bits(1e7)}};
      f.gen.push_back(GenLaunch(spec(kg::GroupKind::RopeForward), args, genWs));
      b.gen.push_back(
          GenLaunch(spec(kg::GroupKind::RopeBackward), args, genWs));
    }
    cases.push_back(std::move(f));
    cases.push_back(std::move(b));
  }
  {
    Case c{"add", std::to_string(T) + "x" + std::to_string(D), 3.0 * T * D * 2};
    for (int s = 0; s < sets; ++s) {
      ResidualAddArgs a;
      a.a = bf("x", s);
      a.b = bf("res", s);
      a.y = bf("sum", s);
      a.n = T * D;
      c.lib.push_back([=](cudaStream_t) { KS(residualAddForward(ctx, a)); });
      c.gen.push_back(GenLaunch(spec(kg::GroupKind::ResidualAdd),
                                {{"a", ptr(a.a)},
                                 {"b", ptr(a.b)},
                                 {"y", ptr(a.y)},
                                 {"n", uint64_t(a.n)}},
                                genWs));
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

int usage(const char *msg) {
  if (msg)
    std::fprintf(stderr, "kernelgen_bench: %s\n", msg);
  std::fprintf(
      stderr,
      "usage: kernelgen_bench [--samples N] [--calls N] [--sets N] "
      "[--only SUBSTR] [--json FILE]\n"
      "Times each generated kernel against the library kernel of its op at "
      "the Qwen3.5-0.8B shapes, interleaved (median and range of --samples "
      "samples, default 9, of --calls launches, default 20, over --sets "
      "operand copies, default 4), with the copy roofline.\n");
  return msg ? 2 : 0;
}

} // namespace

int main(int argc, char **argv) {
  int samples = 9, calls = 20, sets = 4;
  std::string only, jsonPath;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        std::exit(usage(("missing value after " + a).c_str()));
      return argv[++i];
    };
    auto positive = [&](const std::string &v) {
      char *end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (!end || *end || n < 1 || n > 100000)
        std::exit(
            usage((a + " needs a positive integer, got '" + v + "'").c_str()));
      return int(n);
    };
    if (a == "--help" || a == "-h")
      return usage(nullptr);
    if (a == "--samples")
      samples = positive(value());
    else if (a == "--calls")
      calls = positive(value());
    else if (a == "--sets")
      sets = positive(value());
    else if (a == "--only")
      only = value();
    else if (a == "--json")
      jsonPath = value();
    else
      return usage(("unknown flag " + a).c_str());
  }

  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  KernelContext ctx;
  ctx.backend = Backend::Cuda;
  ctx.stream = stream;
  ctx.smCount = sms;
  size_t wsBytes = size_t(256) << 20;
  CK(cudaMalloc(&ctx.workspace, wsBytes));
  ctx.workspaceBytes = wsBytes;
  void *genWs = nullptr;
  CK(cudaMalloc(&genWs, wsBytes));

  Pool pool;
  pool.sets = sets;
  pool.elems = T * I; // the largest operand (SwiGLU's [T, I])
  std::vector<Case> cases = buildCases(pool, ctx, genWs);
  double bw = copyBandwidth(stream);
  std::printf("device: %s (%d SMs); copy bandwidth %.0f GB/s; %d samples of "
              "%d calls over %d operand sets\n",
              prop.name, sms, bw / 1e9, samples, calls, sets);

  std::vector<Case *> chosen;
  for (Case &c : cases)
    if (only.empty() || c.name.find(only) != std::string::npos)
      chosen.push_back(&c);
  if (chosen.empty())
    return usage(("no case matches --only " + only).c_str());
  std::vector<Result> results(chosen.size());
  // Warm-up (the driver's JIT, first touches), then interleaved samples.
  for (Case *c : chosen) {
    timeCalls(stream, 2 * sets, c->lib);
    timeCalls(stream, 2 * sets, c->gen);
  }
  for (int s = 0; s < samples; ++s) {
    for (size_t i = 0; i < chosen.size(); ++i) {
      bool libFirst = s % 2 == 0;
      float a =
          timeCalls(stream, calls, libFirst ? chosen[i]->lib : chosen[i]->gen);
      float b =
          timeCalls(stream, calls, libFirst ? chosen[i]->gen : chosen[i]->lib);
      results[i].lib.push_back(libFirst ? a : b);
      results[i].gen.push_back(libFirst ? b : a);
    }
    std::fprintf(stderr, "kernelgen_bench: sample %d of %d\n", s + 1, samples);
  }

  std::printf("%-36s %-14s %22s %22s %7s %6s %6s\n", "op", "shape",
              "library us (range)", "generated us (range)", "gen/lib", "lib %",
              "gen %");
  FILE *json = jsonPath.empty() ? nullptr : std::fopen(jsonPath.c_str(), "w");
  if (!jsonPath.empty() && !json)
    die("cannot write " + jsonPath);
  if (json)
    std::fprintf(json,
                 "{\"device\": \"%s\", \"copy_bandwidth\": %.6g, "
                 "\"samples\": %d, \"calls\": %d, \"sets\": %d, "
                 "\"cases\": [\n",
                 prop.name, bw, samples, calls, sets);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Case &c = *chosen[i];
    Result &r = results[i];
    float lm = median(r.lib), gm = median(r.gen);
    auto lo = [](const std::vector<float> &v) {
      return *std::min_element(v.begin(), v.end());
    };
    auto hi = [](const std::vector<float> &v) {
      return *std::max_element(v.begin(), v.end());
    };
    double roofUs = c.bytes / bw * 1e6;
    char lib[64], gen[64];
    std::snprintf(lib, sizeof lib, "%.1f (%.1f-%.1f)", lm * 1e3,
                  lo(r.lib) * 1e3, hi(r.lib) * 1e3);
    std::snprintf(gen, sizeof gen, "%.1f (%.1f-%.1f)", gm * 1e3,
                  lo(r.gen) * 1e3, hi(r.gen) * 1e3);
    std::printf("%-36s %-14s %22s %22s %7.3f %5.0f%% %5.0f%%\n", c.name.c_str(),
                c.shape.c_str(), lib, gen, gm / lm, 100 * roofUs / (lm * 1e3),
                100 * roofUs / (gm * 1e3));
    if (json)
      std::fprintf(json,
                   "  {\"op\": \"%s\", \"shape\": \"%s\", \"bytes\": %.0f, "
                   "\"roofline_us\": %.3f, \"library_us\": %.3f, "
                   "\"library_us_min\": %.3f, \"library_us_max\": %.3f, "
                   "\"generated_us\": %.3f, \"generated_us_min\": %.3f, "
                   "\"generated_us_max\": %.3f, \"ratio\": %.4f}%s\n",
                   c.name.c_str(), c.shape.c_str(), c.bytes, roofUs, lm * 1e3,
                   lo(r.lib) * 1e3, hi(r.lib) * 1e3, gm * 1e3, lo(r.gen) * 1e3,
                   hi(r.gen) * 1e3, gm / lm, i + 1 < chosen.size() ? "," : "");
  }
  if (json) {
    std::fprintf(json, "]}\n");
    std::fclose(json);
  }
  return 0;
}
