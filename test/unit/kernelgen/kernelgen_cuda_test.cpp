//===- kernelgen_cuda_test.cpp - generated GPU kernels vs reference -------===//
//
// Loads the PTX of the GPU kernels (kernelgen/, sm_90a; generated when the
// test was built, kernelgen_cuda_test_ptx.cpp) with the CUDA driver API
// (cuModuleLoadDataEx: the driver JIT-compiles it for the GPU present) and runs
// each kernel at the Qwen3.5-0.8B shapes (D = 1024, I = 3584, T = 4096 tokens)
// and at odd small shapes, against the CPU reference kernel on the same inputs.
// Skipped without a usable GPU.
//
// Expected (docs/kernelgen.md): residual add and AdamW are bitwise equal to
// the reference (correctly rounded operations in the reference's order);
// RMSNorm forward (y, rstd), backward (dx, y, dw) and the fused residual
// add + RMSNorm are bitwise equal to the C++ model of kernelgen's reduction
// order (kernelgen_test_util.h: the host kernels' bits too) and within
// bounds of the reference; SwiGLU
// uses libdevice's expf, not glibc's, so each bf16 output may differ from
// the reference by at most one bf16 ulp. SwiGLU runs twice and must give the
// same bits both times (determinism).
//
// The loader here is the test's own, so that a kernel can be checked apart
// from the runtime's (runtime/cuda/generated_cuda.cpp), which the GPU
// end-to-end arms exercise.
//
//===----------------------------------------------------------------------===//
#include "test/unit/kernelgen/kernelgen_cuda_specs.h"
#include "test/unit/kernelgen/kernelgen_test_util.h"

#include "kernelgen_cuda_test_ptx.inc"

#include <cuda.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>

using namespace ap::kernelgen::test;

namespace {

// The driver API, opened at run time (libcuda.so.1), so that the binary
// starts on a machine without a driver and reports itself skipped. cuda.h
// maps some names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2): the
// two-level stringizing looks up the versioned name.
#define AP_CU_FUNCS(X)                                                         \
  X(cuInit)                                                                    \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuCtxSetCurrent)                                                           \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleGetFunction)                                                       \
  X(cuMemAlloc)                                                                \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemFree)                                                                 \
  X(cuLaunchKernel)                                                            \
  X(cuCtxSynchronize)                                                          \
  X(cuGetErrorString)
#define AP_STR(x) #x
#define AP_XSTR(x) AP_STR(x)

struct Driver {
#define AP_DECLARE(f) decltype(&::f) f = nullptr;
  AP_CU_FUNCS(AP_DECLARE)
#undef AP_DECLARE
  std::string missing; ///< why the driver is unusable; empty when loaded

  Driver() {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      missing = "libcuda.so.1 cannot be opened (no CUDA driver)";
      return;
    }
#define AP_LOAD(f)                                                             \
  f = reinterpret_cast<decltype(&::f)>(dlsym(h, AP_XSTR(f)));                  \
  if (!f && missing.empty())                                                   \
    missing = std::string("libcuda.so.1 has no ") + AP_XSTR(f);
    AP_CU_FUNCS(AP_LOAD)
#undef AP_LOAD
  }
};

Driver &drv() {
  static Driver *d = new Driver; // lives until exit, as the driver does
  return *d;
}

#define CU(call)                                                               \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char *s_ = nullptr;                                                \
      drv().cuGetErrorString(r_, &s_);                                         \
      FAIL() << #call << ": " << (s_ ? s_ : "unknown CUDA error");             \
    }                                                                          \
  } while (0)

/// The generated kernels of the test, in one PTX module loaded once.
struct GpuKernels {
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;
  std::string skip, error;
  size_t ptxBytes = 0;
  const std::string ptxText = kTestPtx;

  static std::vector<kg::GroupSpec> specs() { return cudaTestSpecs(); }

  GpuKernels() {
    if (!drv().missing.empty()) {
      skip = drv().missing;
      return;
    }
    int count = 0;
    if (drv().cuInit(0) != CUDA_SUCCESS ||
        drv().cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      skip = "no usable CUDA device (cuInit or cuDeviceGetCount)";
      return;
    }
    if (drv().cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
        drv().cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
        drv().cuCtxSetCurrent(context) != CUDA_SUCCESS) {
      error = "cannot make the primary context of device 0 current";
      return;
    }
    // The PTX kernelgen generated for specs() at build time
    // (kernelgen_cuda_test_ptx.cpp): this binary links no MLIR.
    if (sizeof(kTestPtx) <= 1) {
      error = std::string("the test was built without PTX: ") + kTestPtxError;
      return;
    }
    const std::string *ptx = &ptxText;
    ptxBytes = ptx->size();
    char log[8192] = {0};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER,
                           CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, reinterpret_cast<void *>(sizeof(log))};
    if (drv().cuModuleLoadDataEx(&module, ptx->c_str(), 2, opts, vals) !=
        CUDA_SUCCESS)
      error = std::string("cuModuleLoadDataEx failed: ") + log;
  }

  CUfunction function(const std::string &name) {
    CUfunction f = nullptr;
    if (drv().cuModuleGetFunction(&f, module, name.c_str()) != CUDA_SUCCESS)
      return nullptr;
    return f;
  }
};

GpuKernels &gpu() {
  static GpuKernels *instance = new GpuKernels; // lives until exit
  return *instance;
}

/// A device copy of a host byte buffer.
struct DevBuf {
  CUdeviceptr p = 0;
  size_t bytes = 0;
  explicit DevBuf(const void *host, size_t n) : bytes(n) {
    if (drv().cuMemAlloc(&p, n ? n : 1) == CUDA_SUCCESS && n)
      drv().cuMemcpyHtoD(p, host, n);
  }
  template <class T>
  explicit DevBuf(const std::vector<T> &v)
      : DevBuf(v.data(), v.size() * sizeof(T)) {}
  ~DevBuf() { drv().cuMemFree(p); }
  DevBuf(const DevBuf &) = delete;
  std::vector<uint8_t> bytesBack() const {
    std::vector<uint8_t> out(bytes);
    drv().cuMemcpyDtoH(out.data(), p, bytes);
    return out;
  }
  std::vector<float> floatsBack() const {
    std::vector<float> out(bytes / 4);
    drv().cuMemcpyDtoH(out.data(), p, bytes);
    return out;
  }
};

/// The launch shape of GPU entry `name` (gpuEntries of the test's specs).
kg::GpuEntry entryOf(const std::string &name) {
  for (const kg::GroupSpec &s : GpuKernels::specs())
    for (const kg::GpuEntry &e : kg::gpuEntries(s))
      if (e.name == name)
        return e;
  return kg::GpuEntry{name, {}};
}

/// An int64 parameter's value (the others count no work).
template <class T> int64_t intOf(T v) {
  if constexpr (std::is_integral_v<T> && sizeof(T) == 8)
    return int64_t(v);
  else
    return 0;
}

/// Launches `name` with the parameters as the ABI lists them, in the
/// runtime's grid: kg::gpuBlocks of the entry's work parameters (their
/// values taken from `args`), blockSize threads a block.
template <class... Args>
CUresult launch(const std::string &name, Args... args) {
  CUfunction f = gpu().function(name);
  if (!f)
    return CUDA_ERROR_NOT_FOUND;
  kg::GpuEntry e = entryOf(name);
  void *params[] = {static_cast<void *>(&args)...};
  uint64_t blocks = kg::gpuBlocks(e, {intOf(args)...});
  if (blocks == 0)
    return CUDA_SUCCESS;
  CUresult r =
      drv().cuLaunchKernel(f, unsigned(blocks), 1, 1, unsigned(e.blockSize), 1,
                           1, 0, nullptr, params, nullptr);
  if (r != CUDA_SUCCESS)
    return r;
  return drv().cuCtxSynchronize();
}

/// Each bf16 of `got` within one ulp of `want` (same sign, adjacent bits).
::testing::AssertionResult withinOneUlp(const std::vector<uint8_t> &want,
                                        const std::vector<uint8_t> &got,
                                        const char *what) {
  size_t differ = 0, nans = 0;
  auto isNan = [](uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); };
  for (size_t i = 0; i + 1 < want.size(); i += 2) {
    uint16_t w, g;
    std::memcpy(&w, want.data() + i, 2);
    std::memcpy(&g, got.data() + i, 2);
    int d = int(w) - int(g);
    if (d == 0)
      continue;
    // An invalid operation (inf x 0 from the inputs' infinities) gives the
    // hardware's default NaN: negative on x86 (the reference), positive with
    // all payload bits on the GPU. Any NaN matches a NaN.
    if (isNan(w) && isNan(g)) {
      ++nans;
      continue;
    }
    ++differ;
    if ((w ^ g) & 0x8000 || d > 1 || d < -1)
      return ::testing::AssertionFailure()
             << what << ": element " << i / 2 << " bf16 bits " << g
             << ", the reference " << w << " (more than one ulp)";
  }
  std::cout << "  " << what << ": " << differ << " of " << want.size() / 2
            << " bf16 outputs one ulp from the reference";
  if (nans)
    std::cout << " (" << nans << " NaN with another sign or payload)";
  std::cout << "\n";
  return ::testing::AssertionSuccess();
}

class KernelGenCuda : public ::testing::Test {
protected:
  void SetUp() override {
    if (!gpu().skip.empty())
      GTEST_SKIP() << gpu().skip;
    ASSERT_TRUE(gpu().error.empty()) << gpu().error;
  }
};

struct Shape {
  I rows, cols;
};
// Qwen3.5-0.8B: the MLP's [T, I] and the norms' [T, D], and odd shapes.
const Shape kMlp[] = {{4096, 3584}, {3, 7}, {17, 33}};
// RMSNorm at the hidden size and at the q/k norms (Qwen3.5-0.8B, 4096
// tokens: 8 heads of 256), and odd shapes.
// {37, 1536} is wider than kRowDwMaxDim: its backward's dw partials come
// from their own kernel. {1000, 200} takes the backward's register path
// (_k) with lanes that own no chunk and parts whose rows do not fill the
// last pair of rows a warp.
const Shape kNorm[] = {{4096, 1024}, {32768, 256}, {5, 1023},
                       {1, 1},       {37, 1536},   {1000, 200}};

/// The spec of `kind` with `rpw` rows a warp (kernelgen_cuda_specs.h); 1:
/// one row a warp kept in registers (rowInRegisters, the _k kernel).
kg::GroupSpec rowsSpec(kg::GroupKind kind, int rpw) {
  kg::GroupSpec s;
  s.kind = kind;
  s.rowsPerWarp = rpw;
  s.rowInRegisters = rpw == 1;
  return s;
}

const kg::GroupSpec &specOf(kg::GroupKind kind) {
  static const std::vector<kg::GroupSpec> all = GpuKernels::specs();
  for (const kg::GroupSpec &s : all)
    if (s.kind == kind)
      return s;
  std::abort();
}

TEST_F(KernelGenCuda, SwiGluWithinOneUlpOfReference) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : kMlp) {
    size_t n = size_t(s.rows * s.cols);
    auto g = randomStorage(t, n, 71, 3.0), u = randomStorage(t, n, 72),
         dy = randomStorage(t, n, 73);
    std::vector<uint8_t> yW(n * 2), dgW(n * 2), duW(n * 2), yBW(n * 2);
    SwiGluForwardArgs f;
    f.gate = g.data();
    f.up = u.data();
    f.y = yW.data();
    f.rows = s.rows;
    f.cols = s.cols;
    ASSERT_EQ(swiGluForward(kHost, f), Status::Ok);
    SwiGluBackwardArgs b;
    b.gate = g.data();
    b.up = u.data();
    b.dy = dy.data();
    b.dgate = dgW.data();
    b.dup = duW.data();
    b.y = yBW.data();
    b.rows = s.rows;
    b.cols = s.cols;
    ASSERT_EQ(swiGluBackward(kHost, b), Status::Ok);

    DevBuf dg(g), du(u), ddy(dy), dyOut(std::vector<uint8_t>(n * 2, 0xff)),
        ddg(std::vector<uint8_t>(n * 2, 0xff)),
        ddu(std::vector<uint8_t>(n * 2, 0xff)),
        dyB(std::vector<uint8_t>(n * 2, 0xff));
    I c = s.cols;
    std::vector<uint8_t> first;
    for (int run = 0; run < 2; ++run) {
      CU(launch(kg::kernelName(specOf(kg::GroupKind::SwiGluForward)), dg.p,
                du.p, dyOut.p, s.rows, c, c, c, c));
      CU(launch(kg::kernelName(specOf(kg::GroupKind::SwiGluBackward)), dg.p,
                du.p, ddy.p, ddg.p, ddu.p, dyB.p, s.rows, c, c, c, c, c, c, c));
      auto y = dyOut.bytesBack();
      if (run == 0)
        first = y;
      else
        EXPECT_EQ(first, y) << "swiglu y differs between two runs";
    }
    std::string where = std::to_string(s.rows) + "x" + std::to_string(c);
    EXPECT_TRUE(withinOneUlp(yW, dyOut.bytesBack(), "swiglu y")) << where;
    EXPECT_TRUE(withinOneUlp(dgW, ddg.bytesBack(), "dgate")) << where;
    EXPECT_TRUE(withinOneUlp(duW, ddu.bytesBack(), "dup")) << where;
    EXPECT_TRUE(withinOneUlp(yBW, dyB.bytesBack(), "recomputed y")) << where;
    // The backward's recomputed y is the forward's y, bit for bit.
    EXPECT_TRUE(sameBits(dyOut.bytesBack(), dyB.bytesBack(), 2,
                         "recomputed y vs forward y"))
        << where;
  }
}

// The sigmoid output gate at Qwen3.5-0.8B's attention shape ([T x H, hd]
// = [4096 x 8, 256]) and odd ones: libdevice's exp, so within one bf16 ulp
// of the reference; two runs bitwise equal.
TEST_F(KernelGenCuda, SigmoidGateWithinOneUlpOfReference) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : {Shape{32768, 256}, Shape{3, 7}, Shape{17, 33}}) {
    size_t n = size_t(s.rows * s.cols);
    auto o = randomStorage(t, n, 91), g = randomStorage(t, n, 92, 3.0),
         dy = randomStorage(t, n, 93);
    std::vector<uint8_t> yW(n * 2), doW(n * 2), dgW(n * 2);
    SigmoidGateForwardArgs f;
    f.o = o.data();
    f.gate = g.data();
    f.y = yW.data();
    f.rows = s.rows;
    f.cols = s.cols;
    ASSERT_EQ(sigmoidGateForward(kHost, f), Status::Ok);
    SigmoidGateBackwardArgs b;
    b.o = o.data();
    b.gate = g.data();
    b.dy = dy.data();
    b.dout = doW.data();
    b.dgate = dgW.data();
    b.rows = s.rows;
    b.cols = s.cols;
    ASSERT_EQ(sigmoidGateBackward(kHost, b), Status::Ok);
    DevBuf dO(o), dG(g), dDy(dy), dY(std::vector<uint8_t>(n * 2, 0xff)),
        dDo(std::vector<uint8_t>(n * 2, 0xff)),
        dDg(std::vector<uint8_t>(n * 2, 0xff));
    I c = s.cols;
    std::vector<uint8_t> first;
    for (int run = 0; run < 2; ++run) {
      CU(launch(kg::kernelName(specOf(kg::GroupKind::SigmoidGateForward)), dO.p,
                dG.p, dY.p, s.rows, c, c, c, c));
      CU(launch(kg::kernelName(specOf(kg::GroupKind::SigmoidGateBackward)),
                dO.p, dG.p, dDy.p, dDo.p, dDg.p, s.rows, c, c, c, c, c, c));
      auto dgate = dDg.bytesBack();
      if (run == 0)
        first = dgate;
      else
        EXPECT_EQ(first, dgate) << "gate dgate differs between two runs";
    }
    std::string where = std::to_string(s.rows) + "x" + std::to_string(c);
    EXPECT_TRUE(withinOneUlp(yW, dY.bytesBack(), "gate y")) << where;
    EXPECT_TRUE(withinOneUlp(doW, dDo.bytesBack(), "gate do")) << where;
    EXPECT_TRUE(withinOneUlp(dgW, dDg.bytesBack(), "gate dgate")) << where;
  }
}

TEST_F(KernelGenCuda, ResidualAddBitwise) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (I n : {I(4096 * 1024), I(1), I(1001)}) {
    auto a = randomStorage(t, size_t(n), 81, 4.0),
         b = randomStorage(t, size_t(n), 82);
    std::vector<uint8_t> want(size_t(n) * 2);
    ResidualAddArgs r;
    r.a = a.data();
    r.b = b.data();
    r.y = want.data();
    r.n = n;
    ASSERT_EQ(residualAddForward(kHost, r), Status::Ok);
    DevBuf da(a), db(b), dy(std::vector<uint8_t>(size_t(n) * 2, 0xff));
    CU(launch(kg::kernelName(specOf(kg::GroupKind::ResidualAdd)), da.p, db.p,
              dy.p, n));
    EXPECT_TRUE(sameBits(want, dy.bytesBack(), 2, "residual y")) << n;
  }
}

TEST_F(KernelGenCuda, RmsNormForwardAndBackwardBitwiseToModel) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : kNorm) {
    size_t n = size_t(s.rows * s.cols);
    I d = s.cols;
    auto x = randomStorage(t, n, 91, 2.0, false),
         w = randomStorage(t, size_t(d), 92, 0.5, false),
         dy = randomStorage(t, n, 93, 1.0, false);
    // Bits: the model of kernelgen's order; bounds: the reference.
    std::vector<uint8_t> yW(n * 2), yR(n * 2);
    std::vector<float> rstdW(size_t(s.rows)), rstdR(size_t(s.rows));
    ASSERT_EQ(referenceRmsNorm(t, x.data(), w.data(), yR.data(), rstdR.data(),
                               s.rows, d, d, /*zc=*/true),
              Status::Ok);
    modelRmsNorm(t, x.data(), w.data(), yW.data(), rstdW.data(), s.rows, d, d,
                 /*zc=*/true, float(1e-6));
    std::vector<float> dw0;
    for (double v : ap::test::randn(size_t(d), 94))
      dw0.push_back(float(v));
    std::vector<float> dwW = dw0, dwR = dw0;
    std::vector<uint8_t> dxW(n * 2), yBW(n * 2), dxR(n * 2);
    RmsNormBackwardArgs b;
    b.x = x.data();
    b.w = w.data();
    b.rstd = rstdW.data();
    b.dy = dy.data();
    b.dx = dxR.data();
    b.dw = dwR.data();
    b.rows = s.rows;
    b.dim = d;
    ASSERT_EQ(rmsNormBackward(kHost, b), Status::Ok);
    modelRmsNormBackward(t, x.data(), w.data(), rstdW.data(), dy.data(),
                         dxW.data(), dwW.data(), yBW.data(), s.rows, d, d,
                         /*zc=*/true);

    DevBuf dx_(x), dw_(w), ddy(dy), dyOut(std::vector<uint8_t>(n * 2, 0xff)),
        drstd(std::vector<float>(size_t(s.rows), -1.f)),
        ddx(std::vector<uint8_t>(n * 2, 0xff)), ddw(dw0),
        dyB(std::vector<uint8_t>(n * 2, 0xff));
    float eps = float(1e-6);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(d);
    // One row a warp kept in registers, and 2 and 4 rows a warp (the
    // register path where a row is up to 4, 2 or 1 chunks a lane): the same
    // bits.
    for (int rpw : {1, 2, 4}) {
      DevBuf y2(std::vector<uint8_t>(n * 2, 0xff)),
          r2(std::vector<float>(size_t(s.rows), -1.f));
      CU(launch(kg::kernelName(rowsSpec(kg::GroupKind::RmsNormForward, rpw)),
                dx_.p, dw_.p, y2.p, r2.p, s.rows, d, d, d, eps));
      EXPECT_TRUE(sameBits(yW, y2.bytesBack(), 2, "rmsnorm y, rows a warp"))
          << where << " " << rpw;
      EXPECT_TRUE(sameBits(rawBytes(rstdW), rawBytes(r2.floatsBack()), 4,
                           "rstd, rows a warp"))
          << where << " " << rpw;
    }
    CU(launch(kg::kernelName(specOf(kg::GroupKind::RmsNormForward)), dx_.p,
              dw_.p, dyOut.p, drstd.p, s.rows, d, d, d, eps));
    EXPECT_TRUE(sameBits(yW, dyOut.bytesBack(), 2, "rmsnorm y")) << where;
    EXPECT_TRUE(
        closeTo(t, yR, dyOut.bytesBack(), orderTol(t), "y vs reference"))
        << where;
    EXPECT_TRUE(
        sameBits(rawBytes(rstdW), rawBytes(drstd.floatsBack()), 4, "rstd"))
        << where;
    // The backward from the GPU's rstd (equal to the reference's, checked
    // above): the row kernel, then the dw column kernel.
    // The row kernel, the dw partial sums (into the workspace) and their
    // sum into dw.
    auto names = kg::gpuKernelNames(specOf(kg::GroupKind::RmsNormBackward));
    ASSERT_EQ(names.size(), 3u);
    I parts = kg::rmsNormDwParts(s.rows);
    DevBuf ws(std::vector<float>(size_t(parts * d), -3.f));
    for (const std::string &name : names)
      CU(launch(name, dx_.p, dw_.p, drstd.p, ddy.p, ddx.p, ddw.p, dyB.p, ws.p,
                s.rows, d, d, d, d, d, parts,
                kg::rmsNormDwPartItems(s.rows, d)));
    EXPECT_TRUE(sameBits(dxW, ddx.bytesBack(), 2, "rmsnorm dx")) << where;
    EXPECT_TRUE(sameBits(yBW, dyB.bytesBack(), 2, "recomputed y")) << where;
    EXPECT_TRUE(
        sameBits(rawBytes(dwW), rawBytes(ddw.floatsBack()), 4, "rmsnorm dw"))
        << where;
    // The rows in registers with their dw partials (the _k kernels; rows
    // too wide or unaligned take the shared-memory path): the same bits.
    {
      kg::GroupSpec k = specOf(kg::GroupKind::RmsNormBackward);
      k.rowInRegisters = true;
      DevBuf kdx(std::vector<uint8_t>(n * 2, 0xff)), kdw(dw0),
          ky(std::vector<uint8_t>(n * 2, 0xff)),
          kws(std::vector<float>(size_t(parts * d), -3.f));
      for (const std::string &name : kg::gpuKernelNames(k))
        CU(launch(name, dx_.p, dw_.p, drstd.p, ddy.p, kdx.p, kdw.p, ky.p, kws.p,
                  s.rows, d, d, d, d, d, parts,
                  kg::rmsNormDwPartItems(s.rows, d)));
      EXPECT_TRUE(sameBits(dxW, kdx.bytesBack(), 2, "rmsnorm dx, _k")) << where;
      EXPECT_TRUE(sameBits(yBW, ky.bytesBack(), 2, "recomputed y, _k"))
          << where;
      EXPECT_TRUE(sameBits(rawBytes(dwW), rawBytes(kdw.floatsBack()), 4,
                           "rmsnorm dw, _k"))
          << where;
    }
    EXPECT_TRUE(
        closeTo(t, dxR, ddx.bytesBack(), orderTol(t), "dx vs reference"))
        << where;
    EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dwR),
                        rawBytes(ddw.floatsBack()), 1e-5, "dw vs reference"))
        << where;
  }
}

/// RMSNorm backward fused with the residual add of its dx, its dy the sum
/// of `addends` addends (1: dy itself; else the chain of adds forming it,
/// dy = ((d0 + d1) + d2) + ..., each sum rounded to storage as the add
/// kernel stores it): the sum is the model's dx of that dy rounded to bf16
/// plus the other addend (the generated add's arithmetic), dw the model's,
/// bit for bit.
void checkNormBackwardAdd(int addends, int seed) {
  const kg::ElemType t = kg::ElemType::BF16;
  kg::GroupSpec spec;
  for (const kg::GroupSpec &g : GpuKernels::specs())
    if (g.kind == kg::GroupKind::RmsNormBackward && g.addResidual &&
        g.dyAddends == addends)
      spec = g;
  ASSERT_TRUE(spec.addResidual);
  ASSERT_TRUE(addends == 1 || addends == kg::kMaxDyAddends);
  for (Shape s : kNorm) {
    size_t n = size_t(s.rows * s.cols);
    I d = s.cols;
    auto x = randomStorage(t, n, seed, 2.0, false),
         w = randomStorage(t, size_t(d), seed + 1, 0.5, false),
         res = randomStorage(t, n, seed + 2, 1.0, false);
    std::vector<std::vector<uint8_t>> part;
    for (int k = 0; k < addends; ++k)
      part.push_back(randomStorage(t, n, seed + 5 + k, 1.0, false));
    std::vector<uint8_t> dy = part[0];
    for (int k = 1; k < addends; ++k)
      for (I i = 0; i < I(n); ++i)
        storeAt(t, dy.data(), i,
                loadAt(t, dy.data(), i) + loadAt(t, part[k].data(), i));
    std::vector<float> rstd(size_t(s.rows));
    std::vector<uint8_t> y(n * 2);
    modelRmsNorm(t, x.data(), w.data(), y.data(), rstd.data(), s.rows, d, d,
                 /*zc=*/true, float(1e-6));
    std::vector<float> dw0;
    for (double v : ap::test::randn(size_t(d), seed + 3))
      dw0.push_back(float(v));
    std::vector<float> dwW = dw0;
    std::vector<uint8_t> dxW(n * 2), sumW(n * 2);
    modelRmsNormBackward(t, x.data(), w.data(), rstd.data(), dy.data(),
                         dxW.data(), dwW.data(), nullptr, s.rows, d, d,
                         /*zc=*/true);
    for (I i = 0; i < I(n); ++i)
      storeAt(t, sumW.data(), i,
              loadAt(t, res.data(), i) + loadAt(t, dxW.data(), i));
    std::vector<std::unique_ptr<DevBuf>> dd;
    for (const auto &p : part)
      dd.push_back(std::make_unique<DevBuf>(p));
    DevBuf dx_(x), dw_(w), dres(res), drstd(rstd),
        dsum(std::vector<uint8_t>(n * 2, 0xff)), ddw(dw0);
    I parts = kg::rmsNormDwParts(s.rows),
      items = kg::rmsNormDwPartItems(s.rows, d);
    DevBuf ws(std::vector<float>(size_t(parts * d), -3.f));
    // (x, w, rstd, dy, dx: the sum, [dy1, dy2, dy3,] res, dw, dwPartial,
    //  rows, dim, xStride, dyStride, dxStride, dwParts, dwPartItems)
    for (const std::string &name : kg::gpuKernelNames(spec))
      CU(addends == 1
             ? launch(name, dx_.p, dw_.p, drstd.p, dd[0]->p, dsum.p, dres.p,
                      ddw.p, ws.p, s.rows, d, d, d, d, parts, items)
             : launch(name, dx_.p, dw_.p, drstd.p, dd[0]->p, dsum.p, dd[1]->p,
                      dd[2]->p, dd[3]->p, dres.p, ddw.p, ws.p, s.rows, d, d, d,
                      d, parts, items));
    std::string where = std::to_string(s.rows) + "x" + std::to_string(d) +
                        ", " + std::to_string(addends) + " addends";
    EXPECT_TRUE(sameBits(sumW, dsum.bytesBack(), 2, "dx + res")) << where;
    EXPECT_TRUE(
        sameBits(rawBytes(dwW), rawBytes(ddw.floatsBack()), 4, "rmsnorm dw"))
        << where;
  }
}

TEST_F(KernelGenCuda, RmsNormBackwardAddBitwiseToModel) {
  checkNormBackwardAdd(1, 191);
}

/// With the chain of three adds forming dy (the GDN layers' input norm).
TEST_F(KernelGenCuda, RmsNormBackwardOfAnAddChainBitwiseToModel) {
  checkNormBackwardAdd(kg::kMaxDyAddends, 291);
}

TEST_F(KernelGenCuda, FusedAddRmsNormBitwiseToUnfusedKernels) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : kNorm) {
    size_t n = size_t(s.rows * s.cols);
    I d = s.cols;
    auto a = randomStorage(t, n, 121, 3.0, false),
         b = randomStorage(t, n, 122, 1.0, false),
         w = randomStorage(t, size_t(d), 123, 0.5, false);
    std::vector<uint8_t> hW(n * 2), yW(n * 2);
    std::vector<float> rstdW(size_t(s.rows));
    ResidualAddArgs r;
    r.a = a.data();
    r.b = b.data();
    r.y = hW.data();
    r.n = I(n);
    ASSERT_EQ(residualAddForward(kHost, r), Status::Ok);
    modelRmsNorm(t, hW.data(), w.data(), yW.data(), rstdW.data(), s.rows, d, d,
                 /*zc=*/true, float(1e-6));
    DevBuf da(a), db(b), dw(w), dh(std::vector<uint8_t>(n * 2, 0xff)),
        dy(std::vector<uint8_t>(n * 2, 0xff)),
        drstd(std::vector<float>(size_t(s.rows), -1.f));
    float eps = float(1e-6);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(d);
    for (int rpw : {1, 2, 4}) {
      DevBuf h2(std::vector<uint8_t>(n * 2, 0xff)),
          y2(std::vector<uint8_t>(n * 2, 0xff)),
          r2(std::vector<float>(size_t(s.rows), -1.f));
      CU(launch(kg::kernelName(rowsSpec(kg::GroupKind::AddRmsNormForward, rpw)),
                da.p, db.p, h2.p, dw.p, y2.p, r2.p, s.rows, d, eps));
      EXPECT_TRUE(sameBits(hW, h2.bytesBack(), 2, "h, rows a warp"))
          << where << " " << rpw;
      EXPECT_TRUE(sameBits(yW, y2.bytesBack(), 2, "y, rows a warp"))
          << where << " " << rpw;
      EXPECT_TRUE(sameBits(rawBytes(rstdW), rawBytes(r2.floatsBack()), 4,
                           "rstd, rows a warp"))
          << where << " " << rpw;
    }
    CU(launch(kg::kernelName(specOf(kg::GroupKind::AddRmsNormForward)), da.p,
              db.p, dh.p, dw.p, dy.p, drstd.p, s.rows, d, eps));
    EXPECT_TRUE(sameBits(hW, dh.bytesBack(), 2, "h")) << where;
    EXPECT_TRUE(sameBits(yW, dy.bytesBack(), 2, "y")) << where;
    EXPECT_TRUE(
        sameBits(rawBytes(rstdW), rawBytes(drstd.floatsBack()), 4, "rstd"))
        << where;
  }
}

// GDN's L2 norm at Qwen3.5-0.8B's q/k shape ([4096 x 16, 128]) and odd
// ones: bitwise to the model of kernelgen's row order.
TEST_F(KernelGenCuda, L2NormBitwiseToModel) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : {Shape{65536, 128}, Shape{5, 1023}, Shape{1, 1}}) {
    size_t n = size_t(s.rows * s.cols);
    I d = s.cols;
    auto x = randomStorage(t, n, 141, 2.0, false),
         dy = randomStorage(t, n, 142, 1.0, false);
    float eps = 1e-6f;
    std::vector<uint8_t> yW(n * 2), dxW(n * 2);
    std::vector<float> rW(size_t(s.rows));
    modelL2Norm(t, x.data(), yW.data(), rW.data(), s.rows, d, eps);
    modelL2NormBackward(t, yW.data(), rW.data(), dy.data(), dxW.data(), s.rows,
                        d);
    kg::GroupSpec f, b;
    f.kind = kg::GroupKind::L2NormForward;
    b.kind = kg::GroupKind::L2NormBackward;
    DevBuf dx_(x), ddy(dy), dy_(std::vector<uint8_t>(n * 2, 0xff)),
        dr(std::vector<float>(size_t(s.rows), -1.f)),
        ddx(std::vector<uint8_t>(n * 2, 0xff));
    CU(launch(kg::kernelName(f), dx_.p, dy_.p, dr.p, s.rows, d, eps));
    std::string where = std::to_string(s.rows) + "x" + std::to_string(d);
    EXPECT_TRUE(sameBits(yW, dy_.bytesBack(), 2, "l2norm y")) << where;
    EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(dr.floatsBack()), 4, "rstd"))
        << where;
    CU(launch(kg::kernelName(b), dy_.p, dr.p, ddy.p, ddx.p, s.rows, d));
    EXPECT_TRUE(sameBits(dxW, ddx.bytesBack(), 2, "l2norm dx")) << where;
    for (int rpw : {1, 2, 4}) {
      DevBuf y2(std::vector<uint8_t>(n * 2, 0xff)),
          r2(std::vector<float>(size_t(s.rows), -1.f)),
          dx2(std::vector<uint8_t>(n * 2, 0xff));
      CU(launch(kg::kernelName(rowsSpec(kg::GroupKind::L2NormForward, rpw)),
                dx_.p, y2.p, r2.p, s.rows, d, eps));
      EXPECT_TRUE(sameBits(yW, y2.bytesBack(), 2, "l2norm y, rows a warp"))
          << where << " " << rpw;
      EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(r2.floatsBack()), 4,
                           "rstd, rows a warp"))
          << where << " " << rpw;
      CU(launch(kg::kernelName(rowsSpec(kg::GroupKind::L2NormBackward, rpw)),
                y2.p, r2.p, ddy.p, dx2.p, s.rows, d));
      EXPECT_TRUE(sameBits(dxW, dx2.bytesBack(), 2, "l2norm dx, rows a warp"))
          << where << " " << rpw;
    }
  }
}

// GDN's gated RMSNorm at Qwen3.5-0.8B's shape ([4096 x 16, 128]) and odd
// ones: rstd bitwise to the model of kernelgen's order; y, dz, dx and dw
// within bounds of it (sigmoid's exp is libdevice's, not glibc's, and its
// last bit reaches the sums); two runs bitwise equal.
TEST_F(KernelGenCuda, GatedNormWithinBoundsAndDeterministic) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : {Shape{65536, 128}, Shape{5, 1023}, Shape{1, 1},
                  Shape{37, 1536}, Shape{1000, 100}}) {
    size_t n = size_t(s.rows * s.cols);
    I d = s.cols;
    auto x = randomStorage(t, n, 151, 2.0, false),
         z = randomStorage(t, n, 152, 2.0, false),
         w = randomStorage(t, size_t(d), 153, 0.5, false),
         dy = randomStorage(t, n, 154, 1.0, false);
    float eps = 1e-6f;
    std::vector<uint8_t> yW(n * 2), dxW(n * 2), dzW(n * 2), ybW(n * 2);
    std::vector<float> rW(size_t(s.rows)), dw0;
    for (double v : ap::test::randn(size_t(d), 155))
      dw0.push_back(float(v));
    std::vector<float> dwW = dw0;
    modelGatedNorm(t, x.data(), z.data(), w.data(), yW.data(), rW.data(),
                   s.rows, d, eps);
    modelGatedNormBackward(t, x.data(), z.data(), w.data(), rW.data(),
                           dy.data(), dxW.data(), dzW.data(), dwW.data(),
                           ybW.data(), s.rows, d);
    kg::GroupSpec f, b;
    f.kind = kg::GroupKind::GatedNormForward;
    b.kind = kg::GroupKind::GatedNormBackward;
    b.recomputeY = true;
    I parts = kg::rmsNormDwParts(s.rows);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(d);
    std::vector<uint8_t> first;
    for (int run = 0; run < 2; ++run) {
      DevBuf dx_(x), dz_(z), dw_(w), ddy(dy),
          dyOut(std::vector<uint8_t>(n * 2, 0xff)),
          dr(std::vector<float>(size_t(s.rows), -1.f)),
          ddx(std::vector<uint8_t>(n * 2, 0xff)),
          ddz(std::vector<uint8_t>(n * 2, 0xff)),
          dyB(std::vector<uint8_t>(n * 2, 0xff)), ddw(dw0),
          ws(std::vector<float>(size_t(parts * d), -3.f));
      CU(launch(kg::kernelName(f), dx_.p, dz_.p, dw_.p, dyOut.p, dr.p, s.rows,
                d, eps));
      EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(dr.floatsBack()), 4, "rstd"))
          << where;
      // One row in registers, 2 and 4 rows a warp: the bits of one row a
      // warp.
      for (int rpw : {1, 2, 4}) {
        DevBuf y2(std::vector<uint8_t>(n * 2, 0xff)),
            r2(std::vector<float>(size_t(s.rows), -1.f));
        CU(launch(
            kg::kernelName(rowsSpec(kg::GroupKind::GatedNormForward, rpw)),
            dx_.p, dz_.p, dw_.p, y2.p, r2.p, s.rows, d, eps));
        EXPECT_TRUE(sameBits(dyOut.bytesBack(), y2.bytesBack(), 2,
                             "gated y, rows a warp"))
            << where << " " << rpw;
        EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(r2.floatsBack()), 4,
                             "gated rstd, rows a warp"))
            << where << " " << rpw;
      }
      EXPECT_TRUE(closeTo(t, yW, dyOut.bytesBack(), orderTol(t), "y")) << where;
      // The backward from the model's rstd.
      DevBuf dr2(rW);
      for (const std::string &name : kg::gpuKernelNames(b))
        CU(launch(name, dx_.p, dz_.p, dw_.p, dr2.p, ddy.p, ddx.p, ddz.p, ddw.p,
                  dyB.p, ws.p, s.rows, d, parts,
                  kg::rmsNormDwPartItems(s.rows, d)));
      EXPECT_TRUE(closeTo(t, dxW, ddx.bytesBack(), orderTol(t), "dx")) << where;
      EXPECT_TRUE(closeTo(t, dzW, ddz.bytesBack(), orderTol(t), "dz")) << where;
      EXPECT_TRUE(closeTo(t, ybW, dyB.bytesBack(), orderTol(t), "rebuilt y"))
          << where;
      EXPECT_TRUE(sameBits(dyOut.bytesBack(), dyB.bytesBack(), 2,
                           "rebuilt y against the forward"))
          << where;
      EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dwW),
                          rawBytes(ddw.floatsBack()), 1e-5, "dw"))
          << where;
      std::vector<uint8_t> all = ddx.bytesBack();
      for (auto part : {ddz.bytesBack(), rawBytes(ddw.floatsBack())})
        all.insert(all.end(), part.begin(), part.end());
      // The rows in registers with their dw partials (_k): the bits of the
      // shared-memory path.
      {
        kg::GroupSpec k = b;
        k.rowInRegisters = true;
        DevBuf kdx(std::vector<uint8_t>(n * 2, 0xff)),
            kdz(std::vector<uint8_t>(n * 2, 0xff)),
            ky(std::vector<uint8_t>(n * 2, 0xff)), kdw(dw0),
            kws(std::vector<float>(size_t(parts * d), -3.f));
        for (const std::string &name : kg::gpuKernelNames(k))
          CU(launch(name, dx_.p, dz_.p, dw_.p, dr2.p, ddy.p, kdx.p, kdz.p,
                    kdw.p, ky.p, kws.p, s.rows, d, parts,
                    kg::rmsNormDwPartItems(s.rows, d)));
        std::vector<uint8_t> kall = kdx.bytesBack();
        for (auto part : {kdz.bytesBack(), rawBytes(kdw.floatsBack())})
          kall.insert(kall.end(), part.begin(), part.end());
        EXPECT_EQ(all, kall) << "gated norm backward, _k against the "
                                "shared-memory path "
                             << where;
        EXPECT_TRUE(
            sameBits(dyB.bytesBack(), ky.bytesBack(), 2, "rebuilt y, _k"))
            << where;
      }
      if (run == 0)
        first = all;
      else
        EXPECT_EQ(first, all)
            << "gated norm differs between two runs " << where;
    }
  }
}

// GDN's gates at Qwen3.5-0.8B's shape (4 x 4096 tokens, 16 heads) and odd
// ones: the GPU's exp and log1p are libdevice's, not the host's libm, so
// every output is held to a bound of the host kernel's (the model of
// kernelgen's order for the two column sums), and to itself run to run.
TEST_F(KernelGenCuda, GdnGatesWithinBoundsAndDeterministic) {
  const kg::ElemType t = kg::ElemType::BF16;
  for (Shape s : {Shape{16384, 16}, Shape{3, 7}, Shape{1000, 5}}) {
    size_t n = size_t(s.rows * s.cols);
    I h = s.cols;
    GatesInputs in = gatesInputs(t, s.rows, h, 160);
    const auto &a = in.a, &b = in.b, &dbeta = in.dbeta;
    const auto &aLog = in.aLog, &dtBias = in.dtBias, &dg = in.dg;
    const auto &dA0 = in.dALog0, &dT0 = in.dDtBias0;
    // The host: the reference's per-element outputs (which the host kernel
    // matches bit for bit) and the model's column sums.
    std::vector<float> gW(n);
    std::vector<uint8_t> betaW(n * 2), daW(n * 2), dbW(n * 2);
    std::vector<float> dAW = dA0, dTW = dT0, dAR = dA0, dTR = dT0;
    GdnGatesArgs r = gatesArgs(t, in, s.rows, h);
    r.g = gW.data();
    r.beta = betaW.data();
    ASSERT_EQ(gdnGatesForward(kHost, r), Status::Ok);
    r.da = daW.data();
    r.db = dbW.data();
    r.dALog = dAR.data();
    r.dDtBias = dTR.data();
    ASSERT_EQ(gdnGatesBackward(kHost, r), Status::Ok);
    modelGdnGatesSums(t, a.data(), aLog.data(), dtBias.data(), dg.data(),
                      dAW.data(), dTW.data(), s.rows, h);
    kg::GroupSpec f, bw;
    f.kind = kg::GroupKind::GdnGatesForward;
    bw.kind = kg::GroupKind::GdnGatesBackward;
    I parts = kg::rmsNormDwParts(s.rows);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(h);
    std::vector<uint8_t> first;
    for (int run = 0; run < 2; ++run) {
      DevBuf da_(a), db_(b), dal(aLog), ddt(dtBias), ddg(dg), ddbeta(dbeta),
          dgOut(std::vector<float>(n, -1.f)),
          dbetaOut(std::vector<uint8_t>(n * 2, 0xff)),
          dda(std::vector<uint8_t>(n * 2, 0xff)),
          ddb(std::vector<uint8_t>(n * 2, 0xff)), ddA(dA0), ddT(dT0),
          ws(std::vector<float>(size_t(2 * parts * h), -3.f));
      CU(launch(kg::kernelName(f), da_.p, db_.p, dal.p, ddt.p, dgOut.p,
                dbetaOut.p, s.rows, h));
      EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(gW),
                          rawBytes(dgOut.floatsBack()), 1e-5, "g"))
          << where;
      EXPECT_TRUE(closeTo(t, betaW, dbetaOut.bytesBack(), orderTol(t), "beta"))
          << where;
      // The backward from the host's beta (the reference's bits).
      DevBuf dbetaIn(betaW);
      for (const std::string &name : kg::gpuKernelNames(bw))
        CU(launch(name, da_.p, dal.p, ddt.p, dbetaIn.p, ddg.p, ddbeta.p, dda.p,
                  ddb.p, ddA.p, ddT.p, ws.p, s.rows, h, parts));
      EXPECT_TRUE(closeTo(t, daW, dda.bytesBack(), orderTol(t), "da")) << where;
      EXPECT_TRUE(sameBits(dbW, ddb.bytesBack(), 2, "db")) << where;
      EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dAW),
                          rawBytes(ddA.floatsBack()), 1e-5, "dA_log"))
          << where;
      EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dTW),
                          rawBytes(ddT.floatsBack()), 1e-5, "ddt_bias"))
          << where;
      std::vector<uint8_t> all = rawBytes(dgOut.floatsBack());
      for (auto part : {dbetaOut.bytesBack(), dda.bytesBack(), ddb.bytesBack(),
                        rawBytes(ddA.floatsBack()), rawBytes(ddT.floatsBack())})
        all.insert(all.end(), part.begin(), part.end());
      if (run == 0)
        first = all;
      else
        EXPECT_EQ(first, all) << "GDN gates differ between two runs " << where;
    }
  }
}

// RoPE at Qwen3.5-0.8B's q (4096 tokens, 8 heads of 256, rotary 64, theta
// 1e7), an odd shape with an offset, and packed documents: libdevice's
// double pow, cos and sin against the host's libm, so within one bf16 ulp
// of the reference (the host kernel's bits), and the same bits run to run.
TEST_F(KernelGenCuda, RopeWithinOneUlpAndDeterministic) {
  const kg::ElemType t = kg::ElemType::BF16;
  // {3, 5, ...}: 15 tokens, a last block of 3 on the vector path, copied
  // columns on both sides of the pairs.
  const RopeCase cases[] = {{1, 4096, 8, 256, 0, 64, 1e7, false},
                            {2, 37, 3, 10, 2, 6, 1e4, false},
                            {2, 200, 2, 64, 0, 64, 1e6, true},
                            {3, 5, 4, 64, 8, 32, 1e4, false}};
  for (const RopeCase &c : cases) {
    I tokens = c.batch * c.seq, cols = c.headDim - c.rotaryDim / 2;
    size_t n = size_t(tokens * c.heads * c.headDim);
    auto x = randomStorage(t, n, 181, 2.0);
    std::vector<int32_t> docStart = packedDocStarts(c.batch, c.seq);
    int64_t thetaBits;
    std::memcpy(&thetaBits, &c.theta, 8);
    std::string where = std::to_string(c.seq) + "x" +
                        std::to_string(c.headDim) + (c.packed ? " packed" : "");
    for (bool backward : {false, true}) {
      std::vector<uint8_t> yW(n * 2);
      ASSERT_EQ(
          referenceRope(t, c, x.data(), yW.data(), docStart.data(), backward),
          Status::Ok);
      kg::GroupSpec g;
      g.kind =
          backward ? kg::GroupKind::RopeBackward : kg::GroupKind::RopeForward;
      g.packed = c.packed;
      std::vector<uint8_t> first;
      for (int run = 0; run < 2; ++run) {
        DevBuf dx(x), dy(std::vector<uint8_t>(n * 2, 0xff)), dd(docStart);
        if (c.packed)
          CU(launch(kg::kernelName(g), dx.p, dy.p, dd.p, tokens, c.seq, c.heads,
                    c.headDim, c.offset, c.rotaryDim, cols, thetaBits));
        else
          CU(launch(kg::kernelName(g), dx.p, dy.p, tokens, c.seq, c.heads,
                    c.headDim, c.offset, c.rotaryDim, cols, thetaBits));
        std::vector<uint8_t> got = dy.bytesBack();
        if (run == 0) {
          first = got;
          EXPECT_TRUE(withinOneUlp(yW, got, backward ? "rope dx" : "rope y"))
              << where;
        } else {
          EXPECT_EQ(first, got) << "RoPE differs between two runs " << where;
        }
      }
    }
  }
}

TEST_F(KernelGenCuda, AdamWBitwise) {
  for (I n : {I(1024 * 3584), I(1), I(4099)}) {
    std::vector<float> p, m, v, g;
    for (double d : ap::test::randn(size_t(n), 101))
      p.push_back(float(d));
    for (double d : ap::test::randn(size_t(n), 102, 1e-2))
      m.push_back(float(d));
    for (double d : ap::test::randn(size_t(n), 103))
      v.push_back(float(1e-4 * std::fabs(d)));
    for (double d : ap::test::randn(size_t(n), 104, 1e-2))
      g.push_back(float(d));
    float cc = 0.375f;
    DevBuf dp(p), dm(m), dv(v), dg(g), dcc(&cc, sizeof(cc)),
        dcopy(std::vector<uint8_t>(size_t(n) * 2, 0xff));
    std::vector<uint8_t> copyW(size_t(n) * 2);
    AdamWArgs a;
    a.master = p.data();
    a.expAvg = m.data();
    a.expAvgSq = v.data();
    a.grad = g.data();
    a.gradDType = DType::F32;
    a.clipCoef = &cc;
    a.computeCopy = copyW.data();
    a.computeDType = DType::BF16;
    a.n = n;
    a.lr = 3e-4;
    a.weightDecay = 0.1;
    a.step = 7;
    ASSERT_EQ(adamWStep(kHost, a), Status::Ok);
    kg::AdamWScalars k =
        kg::adamWScalars(a.lr, a.beta1, a.beta2, a.eps, a.weightDecay, a.step);
    CU(launch(kg::kernelName(specOf(kg::GroupKind::AdamW)), dp.p, dm.p, dv.p,
              dg.p, dcc.p, dcopy.p, n, k.stepSize, k.bc2Sqrt, k.decay, k.beta1,
              k.beta2, k.eps));
    std::string where = "n=" + std::to_string(n);
    EXPECT_TRUE(sameBits(rawBytes(p), rawBytes(dp.floatsBack()), 4, "master"))
        << where;
    EXPECT_TRUE(sameBits(rawBytes(m), rawBytes(dm.floatsBack()), 4, "expAvg"))
        << where;
    EXPECT_TRUE(sameBits(rawBytes(v), rawBytes(dv.floatsBack()), 4, "expAvgSq"))
        << where;
    EXPECT_TRUE(sameBits(copyW, dcopy.bytesBack(), 2, "compute copy")) << where;
  }
}

} // namespace
