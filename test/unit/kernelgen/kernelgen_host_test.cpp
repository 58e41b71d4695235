//===- kernelgen_host_test.cpp - generated host kernels vs reference ------===//
//
// JIT-compiles the host form of every generated kernel (kernelgen/) and runs
// it against the CPU reference kernel of the same op on seeded random data,
// bf16 and f32 storage, several sizes including odd ones and row strides
// wider than the row. The generated kernels perform the reference's
// operations in the same order, with the same libm exp (both call the
// process's expf), so every comparison is bitwise: SwiGLU forward and
// backward, residual add, RMSNorm forward (y and rstd: the sum of squares
// runs in increasing column order in both), RMSNorm backward (dx, the
// recomputed y, and dw accumulated over rows in increasing order) and the
// AdamW update.
//
//===----------------------------------------------------------------------===//
#include "kernelgen/KernelGen.h"
#include "kernels/kernels.h"
#include "test/unit/kernelgen/kernelgen_test_util.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <tuple>
#include <vector>

using namespace ap::kernelgen::test;

namespace {

/// Every kernel the tests run, JIT-compiled once for the whole binary. The
/// context runs single-threaded: the tests need no pass parallelism, and no
/// worker threads outlive the tests.
struct Jit {
  mlir::MLIRContext context{mlir::MLIRContext::Threading::DISABLED};
  std::unique_ptr<mlir::ExecutionEngine> engine;
  std::string error;

  static std::vector<kg::GroupSpec> specs() {
    std::vector<kg::GroupSpec> all;
    for (kg::ElemType t : {kg::ElemType::BF16, kg::ElemType::F32}) {
      kg::GroupSpec s;
      s.dtype = t;
      s.kind = kg::GroupKind::SwiGluForward;
      all.push_back(s);
      s.kind = kg::GroupKind::SwiGluBackward;
      s.recomputeY = false;
      all.push_back(s);
      s.recomputeY = true;
      all.push_back(s);
      s.kind = kg::GroupKind::ResidualAdd;
      all.push_back(s);
      s.kind = kg::GroupKind::RmsNormForward;
      for (bool zc : {true, false}) {
        s.zeroCentered = zc;
        s.writeRstd = true;
        all.push_back(s);
      }
      s.zeroCentered = true;
      s.writeRstd = false;
      all.push_back(s);
      s.kind = kg::GroupKind::AddRmsNormForward;
      for (bool zc : {true, false}) {
        s.zeroCentered = zc;
        s.writeRstd = zc;
        all.push_back(s);
      }
      s.writeRstd = true;
      s.kind = kg::GroupKind::RmsNormBackward;
      for (auto [zc, dw, y] :
           {std::tuple{true, true, true}, std::tuple{false, true, false},
            std::tuple{true, false, false}, std::tuple{true, true, false}}) {
        s.zeroCentered = zc;
        s.accumulateDw = dw;
        s.recomputeY = y;
        all.push_back(s);
      }
      s.recomputeY = false;
      s.zeroCentered = false;
      s.accumulateDw = true;
      s.addResidual = true;
      all.push_back(s);
      // dy formed from a chain of adds: alone, and with the residual add.
      s.zeroCentered = true;
      s.dyAddends = kg::kMaxDyAddends;
      all.push_back(s);
      s.addResidual = false;
      s.dyAddends = 3;
      all.push_back(s);
      s.dyAddends = 1;
      s.kind = kg::GroupKind::AdamW;
      for (std::optional<kg::ElemType> copy :
           {std::optional<kg::ElemType>(kg::ElemType::BF16),
            std::optional<kg::ElemType>(kg::ElemType::F32),
            std::optional<kg::ElemType>()}) {
        s.computeCopy = copy;
        all.push_back(s);
      }
      s.kind = kg::GroupKind::SigmoidGateForward;
      all.push_back(s);
      s.kind = kg::GroupKind::SigmoidGateBackward;
      all.push_back(s);
      s.kind = kg::GroupKind::L2NormForward;
      all.push_back(s);
      s.kind = kg::GroupKind::L2NormBackward;
      all.push_back(s);
      s.kind = kg::GroupKind::GatedNormForward;
      all.push_back(s);
      s.kind = kg::GroupKind::GatedNormBackward;
      for (auto [dw, y] : {std::pair{true, true}, std::pair{false, false}}) {
        s.accumulateDw = dw;
        s.recomputeY = y;
        all.push_back(s);
      }
      s.accumulateDw = true;
      s.recomputeY = false;
      s.kind = kg::GroupKind::GdnGatesForward;
      all.push_back(s);
      s.kind = kg::GroupKind::GdnGatesBackward;
      all.push_back(s);
      for (bool packed : {false, true}) {
        s.packed = packed;
        s.kind = kg::GroupKind::RopeForward;
        all.push_back(s);
        s.kind = kg::GroupKind::RopeBackward;
        all.push_back(s);
      }
      s.packed = false;
      s.kind = kg::GroupKind::GradNormSquares;
      all.push_back(s);
    }
    kg::GroupSpec finish;
    finish.kind = kg::GroupKind::GradNormFinish;
    all.push_back(finish);
    return all;
  }

  Jit() {
    mlir::DialectRegistry registry;
    kg::registerKernelGenDialects(registry);
    context.appendDialectRegistry(registry);
    auto module = kg::buildHostModule(context, specs());
    if (mlir::failed(kg::lowerHostToLLVM(*module))) {
      error = "lowerHostToLLVM failed";
      return;
    }
    auto jit = kg::jitHostModule(*module);
    if (mlir::failed(jit)) {
      error = "jitHostModule failed";
      return;
    }
    engine = std::move(*jit);
  }

  template <class Fn> Fn *lookup(const kg::GroupSpec &spec) {
    auto sym = engine->lookup(kg::kernelName(spec));
    if (!sym) {
      llvm::consumeError(sym.takeError());
      return nullptr;
    }
    return reinterpret_cast<Fn *>(*sym);
  }
};

/// The JIT, built on first use and destroyed when the tests end (a global
/// test environment's TearDown, before main returns): destroying it among
/// the static destructors at exit races with LLVM's own.
std::unique_ptr<Jit> &jitSlot() {
  static std::unique_ptr<Jit> slot;
  return slot;
}
Jit &jit() {
  if (!jitSlot())
    jitSlot() = std::make_unique<Jit>();
  return *jitSlot();
}
struct DestroyJit : ::testing::Environment {
  void TearDown() override { jitSlot().reset(); }
};
const auto *const kDestroyJit =
    ::testing::AddGlobalTestEnvironment(new DestroyJit);

class KernelGenHost : public ::testing::TestWithParam<kg::ElemType> {
protected:
  void SetUp() override { ASSERT_TRUE(jit().engine) << jit().error; }
  kg::ElemType type() const { return GetParam(); }
};

struct Shape {
  I rows, cols;
};
const Shape kShapes[] = {{1, 1}, {3, 7}, {17, 33}, {4, 256}, {5, 1023}};

TEST_P(KernelGenHost, SwiGluForwardMatchesReference) {
  kg::GroupSpec spec;
  spec.kind = kg::GroupKind::SwiGluForward;
  spec.dtype = type();
  using Fn = void(const void *, const void *, void *, I, I, I, I, I);
  Fn *fn = jit().lookup<Fn>(spec);
  ASSERT_NE(fn, nullptr) << kg::kernelName(spec);
  size_t eb = bytesOf(type());
  for (Shape s : kShapes) {
    // gate and up as the two halves of one fused projection row [gate | up]
    // (row stride 2*cols), y contiguous.
    I stride = 2 * s.cols;
    auto gu = randomStorage(type(), size_t(s.rows * stride), 11 + s.cols, 3.0);
    std::vector<uint8_t> want(size_t(s.rows * s.cols) * eb, 0xa5),
        got(want.size(), 0x5a);
    SwiGluForwardArgs a;
    a.dtype = dtypeOf(type());
    a.gate = gu.data();
    a.up = gu.data() + s.cols * eb;
    a.y = want.data();
    a.rows = s.rows;
    a.cols = s.cols;
    a.gateStride = a.upStride = stride;
    ASSERT_EQ(swiGluForward(kHost, a), Status::Ok);
    fn(a.gate, a.up, got.data(), s.rows, s.cols, stride, stride, s.cols);
    EXPECT_TRUE(sameBits(want, got, eb, "swiglu y")) << s.rows << "x" << s.cols;
  }
}

TEST_P(KernelGenHost, SwiGluBackwardMatchesReference) {
  size_t eb = bytesOf(type());
  for (bool recompute : {false, true}) {
    kg::GroupSpec spec;
    spec.kind = kg::GroupKind::SwiGluBackward;
    spec.dtype = type();
    spec.recomputeY = recompute;
    void *sym = jit().lookup<void>(spec);
    ASSERT_NE(sym, nullptr) << kg::kernelName(spec);
    for (Shape s : kShapes) {
      size_t n = size_t(s.rows * s.cols);
      auto g = randomStorage(type(), n, 21 + s.rows, 3.0);
      auto u = randomStorage(type(), n, 22 + s.rows);
      auto dy = randomStorage(type(), n, 23 + s.rows);
      std::vector<uint8_t> dgW(n * eb, 1), duW(n * eb, 2), yW(n * eb, 3);
      std::vector<uint8_t> dgG(n * eb, 4), duG(n * eb, 5), yG(n * eb, 6);
      SwiGluBackwardArgs a;
      a.dtype = dtypeOf(type());
      a.gate = g.data();
      a.up = u.data();
      a.dy = dy.data();
      a.dgate = dgW.data();
      a.dup = duW.data();
      a.y = recompute ? yW.data() : nullptr;
      a.rows = s.rows;
      a.cols = s.cols;
      ASSERT_EQ(swiGluBackward(kHost, a), Status::Ok);
      I c = s.cols;
      if (recompute)
        reinterpret_cast<void (*)(const void *, const void *, const void *,
                                  void *, void *, void *, I, I, I, I, I, I, I,
                                  I)>(sym)(g.data(), u.data(), dy.data(),
                                           dgG.data(), duG.data(), yG.data(),
                                           s.rows, c, c, c, c, c, c, c);
      else
        reinterpret_cast<void (*)(const void *, const void *, const void *,
                                  void *, void *, I, I, I, I, I, I, I)>(sym)(
            g.data(), u.data(), dy.data(), dgG.data(), duG.data(), s.rows, c, c,
            c, c, c, c);
      EXPECT_TRUE(sameBits(dgW, dgG, eb, "dgate")) << s.rows << "x" << c;
      EXPECT_TRUE(sameBits(duW, duG, eb, "dup")) << s.rows << "x" << c;
      if (recompute)
        EXPECT_TRUE(sameBits(yW, yG, eb, "recomputed y")) << s.rows << "x" << c;
      else
        EXPECT_EQ(yG, std::vector<uint8_t>(n * eb, 6)) << "y written";
    }
  }
}

// The sigmoid output gate, forward and backward: o read with a row stride
// wider than the row and the gate as the second half of one [o | gate] row
// (the gated projection's layout), outputs contiguous.
TEST_P(KernelGenHost, SigmoidGateMatchesReference) {
  size_t eb = bytesOf(type());
  kg::GroupSpec fwd, bwd;
  fwd.kind = kg::GroupKind::SigmoidGateForward;
  bwd.kind = kg::GroupKind::SigmoidGateBackward;
  fwd.dtype = bwd.dtype = type();
  using FwdFn = void(const void *, const void *, void *, I, I, I, I, I);
  using BwdFn = void(const void *, const void *, const void *, void *, void *,
                     I, I, I, I, I, I, I);
  FwdFn *f = jit().lookup<FwdFn>(fwd);
  BwdFn *bk = jit().lookup<BwdFn>(bwd);
  ASSERT_NE(f, nullptr) << kg::kernelName(fwd);
  ASSERT_NE(bk, nullptr) << kg::kernelName(bwd);
  for (Shape s : kShapes) {
    I stride = 2 * s.cols;
    size_t n = size_t(s.rows * s.cols);
    auto og = randomStorage(type(), size_t(s.rows * stride), 31 + s.cols, 3.0);
    auto dy = randomStorage(type(), n, 32 + s.rows);
    const uint8_t *o = og.data(), *g = og.data() + s.cols * eb;
    std::vector<uint8_t> yW(n * eb, 1), yG(n * eb, 2);
    SigmoidGateForwardArgs a;
    a.dtype = dtypeOf(type());
    a.o = o;
    a.gate = g;
    a.y = yW.data();
    a.rows = s.rows;
    a.cols = s.cols;
    a.oStride = a.gateStride = stride;
    ASSERT_EQ(sigmoidGateForward(kHost, a), Status::Ok);
    f(o, g, yG.data(), s.rows, s.cols, stride, stride, s.cols);
    EXPECT_TRUE(sameBits(yW, yG, eb, "gate y")) << s.rows << "x" << s.cols;

    std::vector<uint8_t> doW(n * eb, 3), dgW(n * eb, 4), doG(n * eb, 5),
        dgG(n * eb, 6);
    SigmoidGateBackwardArgs b;
    b.dtype = dtypeOf(type());
    b.o = o;
    b.gate = g;
    b.dy = dy.data();
    b.dout = doW.data();
    b.dgate = dgW.data();
    b.rows = s.rows;
    b.cols = s.cols;
    b.oStride = b.gateStride = stride;
    ASSERT_EQ(sigmoidGateBackward(kHost, b), Status::Ok);
    I c = s.cols;
    bk(o, g, dy.data(), doG.data(), dgG.data(), s.rows, c, stride, stride, c, c,
       c);
    EXPECT_TRUE(sameBits(doW, doG, eb, "gate do")) << s.rows << "x" << c;
    EXPECT_TRUE(sameBits(dgW, dgG, eb, "gate dgate")) << s.rows << "x" << c;
  }
}

TEST_P(KernelGenHost, ResidualAddMatchesReference) {
  kg::GroupSpec spec;
  spec.kind = kg::GroupKind::ResidualAdd;
  spec.dtype = type();
  using Fn = void(const void *, const void *, void *, I);
  Fn *fn = jit().lookup<Fn>(spec);
  ASSERT_NE(fn, nullptr) << kg::kernelName(spec);
  size_t eb = bytesOf(type());
  for (I n : {I(1), I(7), I(1000), I(4097)}) {
    auto x = randomStorage(type(), size_t(n), 31 + n, 4.0);
    auto z = randomStorage(type(), size_t(n), 32 + n);
    std::vector<uint8_t> want(size_t(n) * eb, 7), got(want.size(), 8);
    ResidualAddArgs a;
    a.dtype = dtypeOf(type());
    a.a = x.data();
    a.b = z.data();
    a.y = want.data();
    a.n = n;
    ASSERT_EQ(residualAddForward(kHost, a), Status::Ok);
    fn(x.data(), z.data(), got.data(), n);
    EXPECT_TRUE(sameBits(want, got, eb, "residual y")) << n;
  }
}

TEST_P(KernelGenHost, RmsNormForwardMatchesModelAndReference) {
  size_t eb = bytesOf(type());
  for (bool zc : {true, false})
    for (bool withRstd : {true, false}) {
      kg::GroupSpec spec;
      spec.kind = kg::GroupKind::RmsNormForward;
      spec.dtype = type();
      spec.zeroCentered = zc;
      spec.writeRstd = withRstd;
      if (!zc && !withRstd)
        continue; // not generated
      void *sym = jit().lookup<void>(spec);
      ASSERT_NE(sym, nullptr) << kg::kernelName(spec);
      for (Shape s : kShapes) {
        // x rows strided (a q half of a gated projection), y contiguous.
        I xs = s.cols + 5;
        auto x = randomStorage(type(), size_t(s.rows * xs), 41 + s.cols, 2.0,
                               /*specials=*/false);
        auto w = randomStorage(type(), size_t(s.cols), 42 + s.cols, 0.5,
                               /*specials=*/false);
        std::vector<uint8_t> yW(size_t(s.rows * s.cols) * eb, 9),
            yG(yW.size(), 10);
        std::vector<float> rW(size_t(s.rows), 1.f), rG(size_t(s.rows), 2.f);
        // Bits: kernelgen's order (the model); a bound: the reference.
        std::vector<uint8_t> yR(yW.size());
        std::vector<float> rR(rW.size());
        ASSERT_EQ(referenceRmsNorm(type(), x.data(), w.data(), yR.data(),
                                   rR.data(), s.rows, s.cols, xs, zc),
                  Status::Ok);
        float eps = float(1e-6); // the reference's float(eps)
        modelRmsNorm(type(), x.data(), w.data(), yW.data(), rW.data(), s.rows,
                     s.cols, xs, zc, eps);
        if (withRstd)
          reinterpret_cast<void (*)(const void *, const void *, void *, float *,
                                    I, I, I, I, float)>(sym)(
              x.data(), w.data(), yG.data(), rG.data(), s.rows, s.cols, xs,
              s.cols, eps);
        else
          reinterpret_cast<void (*)(const void *, const void *, void *, I, I, I,
                                    I, float)>(sym)(
              x.data(), w.data(), yG.data(), s.rows, s.cols, xs, s.cols, eps);
        EXPECT_TRUE(sameBits(yW, yG, eb, "rmsnorm y"))
            << kg::kernelName(spec) << " " << s.rows << "x" << s.cols;
        EXPECT_TRUE(closeTo(type(), yR, yG, orderTol(type()), "y vs reference"))
            << kg::kernelName(spec) << " " << s.rows << "x" << s.cols;
        if (withRstd) {
          EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(rG), 4, "rstd"))
              << s.rows << "x" << s.cols;
          EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(rR), rawBytes(rG),
                              1e-5, "rstd vs reference"))
              << s.rows << "x" << s.cols;
        }
      }
    }
}

/// The fused residual add + RMSNorm gives the bits of the reference residual
/// add then kernelgen's RMSNorm on the stored h (fusion changes no bit).
TEST_P(KernelGenHost, AddRmsNormMatchesUnfusedKernels) {
  size_t eb = bytesOf(type());
  for (bool zc : {true, false}) {
    kg::GroupSpec spec;
    spec.kind = kg::GroupKind::AddRmsNormForward;
    spec.dtype = type();
    spec.zeroCentered = zc;
    spec.writeRstd = zc;
    void *sym = jit().lookup<void>(spec);
    ASSERT_NE(sym, nullptr) << kg::kernelName(spec);
    for (Shape s : kShapes) {
      size_t n = size_t(s.rows * s.cols);
      auto a = randomStorage(type(), n, 111 + s.cols, 3.0, false),
           b = randomStorage(type(), n, 112 + s.cols, 1.0, false),
           w = randomStorage(type(), size_t(s.cols), 113 + s.cols, 0.5, false);
      std::vector<uint8_t> hW(n * eb, 17), yW(n * eb, 18), hG(n * eb, 19),
          yG(n * eb, 20);
      std::vector<float> rW(size_t(s.rows), 1.f), rG(size_t(s.rows), 2.f);
      ResidualAddArgs r;
      r.dtype = dtypeOf(type());
      r.a = a.data();
      r.b = b.data();
      r.y = hW.data();
      r.n = I(n);
      ASSERT_EQ(residualAddForward(kHost, r), Status::Ok);
      using P = const void *;
      float eps = float(1e-6);
      modelRmsNorm(type(), hW.data(), w.data(), yW.data(), rW.data(), s.rows,
                   s.cols, s.cols, zc, eps);
      if (zc)
        reinterpret_cast<void (*)(P, P, void *, P, void *, float *, I, I,
                                  float)>(sym)(a.data(), b.data(), hG.data(),
                                               w.data(), yG.data(), rG.data(),
                                               s.rows, s.cols, eps);
      else
        reinterpret_cast<void (*)(P, P, void *, P, void *, I, I, float)>(sym)(
            a.data(), b.data(), hG.data(), w.data(), yG.data(), s.rows, s.cols,
            eps);
      std::string where = kg::kernelName(spec) + " " + std::to_string(s.rows) +
                          "x" + std::to_string(s.cols);
      EXPECT_TRUE(sameBits(hW, hG, eb, "h = a + b")) << where;
      EXPECT_TRUE(sameBits(yW, yG, eb, "rmsnorm(h)")) << where;
      if (zc)
        EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(rG), 4, "rstd")) << where;
    }
  }
}

TEST_P(KernelGenHost, RmsNormBackwardMatchesModelAndReference) {
  size_t eb = bytesOf(type());
  for (auto [zc, withDw, withY] :
       {std::tuple{true, true, true}, std::tuple{false, true, false},
        std::tuple{true, false, false}}) {
    kg::GroupSpec spec;
    spec.kind = kg::GroupKind::RmsNormBackward;
    spec.dtype = type();
    spec.zeroCentered = zc;
    spec.accumulateDw = withDw;
    spec.recomputeY = withY;
    void *sym = jit().lookup<void>(spec);
    ASSERT_NE(sym, nullptr) << kg::kernelName(spec);
    // Also rows over several dw parts (a short last one), and over more
    // than kLanes parts.
    std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
    shapes.push_back({300, 40});
    shapes.push_back({4500, 3});
    for (Shape s : shapes) {
      size_t n = size_t(s.rows * s.cols);
      I xs = s.cols + 3; // x strided, dy and dx contiguous
      auto x = randomStorage(type(), size_t(s.rows * xs), 61 + s.cols, 2.0,
                             /*specials=*/false);
      auto w = randomStorage(type(), size_t(s.cols), 62 + s.cols, 0.5,
                             /*specials=*/false);
      auto dy = randomStorage(type(), n, 63 + s.cols, 1.0,
                              /*specials=*/false);
      // rstd from the forward reference, as a backward gets it.
      std::vector<float> rstd(size_t(s.rows));
      std::vector<uint8_t> yFwd(n * eb);
      ASSERT_EQ(referenceRmsNorm(type(), x.data(), w.data(), yFwd.data(),
                                 rstd.data(), s.rows, s.cols, xs, zc),
                Status::Ok);
      // dw accumulates into an existing main grad.
      std::vector<float> dwW;
      for (double d : ap::test::randn(size_t(s.cols), 64 + s.cols))
        dwW.push_back(float(d));
      std::vector<float> dwG = dwW;
      std::vector<uint8_t> dxW(n * eb, 13), dxG(n * eb, 14), yW(n * eb, 15),
          yG(n * eb, 16);
      RmsNormBackwardArgs a;
      a.dtype = dtypeOf(type());
      a.x = x.data();
      a.w = w.data();
      a.rstd = rstd.data();
      a.dy = dy.data();
      a.dx = dxW.data();
      a.dw = withDw ? dwW.data() : nullptr;
      a.y = withY ? yW.data() : nullptr;
      a.rows = s.rows;
      a.dim = s.cols;
      a.xStride = xs;
      a.zeroCentered = zc;
      ASSERT_EQ(rmsNormBackward(kHost, a), Status::Ok);
      // The reference's outputs bound the generated ones; the model of
      // kernelgen's order gives their bits.
      std::vector<uint8_t> dxR = dxW, yR = yW;
      std::vector<float> dwR = dwW;
      dwW = dwG;
      modelRmsNormBackward(type(), x.data(), w.data(), rstd.data(), dy.data(),
                           dxW.data(), withDw ? dwW.data() : nullptr,
                           withY ? yW.data() : nullptr, s.rows, s.cols, xs, zc);
      I c = s.cols;
      // (x, w, rstd, dy, dx, [dw,] [y,] [dwPartial,] rows, dim, xStride,
      //  dyStride, dxStride, [yStride,] [dwParts, dwPartItems])
      using P = const void *;
      I parts = kg::rmsNormDwParts(s.rows);
      ASSERT_EQ(kg::rmsNormDwWorkspaceBytes(s.rows, c),
                uint64_t(parts * c) * sizeof(float));
      std::vector<float> partial(size_t(parts * c), -7.f);
      if (withDw && withY)
        reinterpret_cast<void (*)(P, P, P, P, void *, float *, void *, float *,
                                  I, I, I, I, I, I, I, I)>(sym)(
            x.data(), w.data(), rstd.data(), dy.data(), dxG.data(), dwG.data(),
            yG.data(), partial.data(), s.rows, c, xs, c, c, c, parts,
            kg::rmsNormDwPartItems(s.rows, c));
      else if (withDw)
        reinterpret_cast<void (*)(P, P, P, P, void *, float *, float *, I, I, I,
                                  I, I, I, I)>(sym)(
            x.data(), w.data(), rstd.data(), dy.data(), dxG.data(), dwG.data(),
            partial.data(), s.rows, c, xs, c, c, parts,
            kg::rmsNormDwPartItems(s.rows, c));
      else
        reinterpret_cast<void (*)(P, P, P, P, void *, I, I, I, I, I)>(sym)(
            x.data(), w.data(), rstd.data(), dy.data(), dxG.data(), s.rows, c,
            xs, c, c);
      std::string where = kg::kernelName(spec) + " " + std::to_string(s.rows) +
                          "x" + std::to_string(c);
      EXPECT_TRUE(sameBits(dxW, dxG, eb, "rmsnorm dx")) << where;
      EXPECT_TRUE(
          closeTo(type(), dxR, dxG, orderTol(type()), "dx vs reference"))
          << where;
      if (withY) {
        EXPECT_TRUE(sameBits(yW, yG, eb, "recomputed y")) << where;
        EXPECT_TRUE(sameBits(yR, yG, eb, "recomputed y vs reference")) << where;
        EXPECT_TRUE(sameBits(yFwd, yG, eb, "y against the forward")) << where;
      }
      EXPECT_TRUE(sameBits(rawBytes(dwW), rawBytes(dwG), 4, "rmsnorm dw"))
          << where;
      EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dwR), rawBytes(dwG), 1e-5,
                          "dw vs reference"))
          << where;
    }
  }
}

/// RMSNorm backward fused with the residual add that reads its dx: the same
/// bits as the generated backward, then the generated residual add of its
/// stored dx and the other addend (fusion does not change arithmetic), and
/// the same dw.
TEST_P(KernelGenHost, RmsNormBackwardAddMatchesTheUnfusedKernels) {
  size_t eb = bytesOf(type());
  kg::GroupSpec fusedSpec, gradSpec, addSpec;
  fusedSpec.kind = gradSpec.kind = kg::GroupKind::RmsNormBackward;
  fusedSpec.zeroCentered = gradSpec.zeroCentered = false;
  fusedSpec.dtype = gradSpec.dtype = addSpec.dtype = type();
  fusedSpec.addResidual = true;
  addSpec.kind = kg::GroupKind::ResidualAdd;
  using P = const void *;
  auto *fused = jit()
                    .lookup<void(P, P, P, P, void *, P, float *, float *, I, I,
                                 I, I, I, I, I)>(fusedSpec);
  auto *grad = jit()
                   .lookup<void(P, P, P, P, void *, float *, float *, I, I, I,
                                I, I, I, I)>(gradSpec);
  auto *add = jit().lookup<void(P, P, void *, I)>(addSpec);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(grad, nullptr);
  ASSERT_NE(add, nullptr);
  for (Shape s : {Shape{4, 256}, Shape{17, 33}, Shape{300, 40}}) {
    size_t n = size_t(s.rows * s.cols);
    I c = s.cols;
    auto x = randomStorage(type(), n, 71 + c, 2.0, false);
    auto w = randomStorage(type(), size_t(c), 72 + c, 0.5, false);
    auto dy = randomStorage(type(), n, 73 + c, 1.0, false);
    auto res = randomStorage(type(), n, 74 + c, 1.0, false);
    std::vector<float> rstd(size_t(s.rows));
    std::vector<uint8_t> yFwd(n * eb);
    ASSERT_EQ(referenceRmsNorm(type(), x.data(), w.data(), yFwd.data(),
                               rstd.data(), s.rows, c, c, false),
              Status::Ok);
    std::vector<float> dwU;
    for (double d : ap::test::randn(size_t(c), 75 + c))
      dwU.push_back(float(d));
    std::vector<float> dwF = dwU;
    I parts = kg::rmsNormDwParts(s.rows);
    std::vector<float> partial(size_t(parts * c));
    std::vector<uint8_t> dx(n * eb, 1), sumU(n * eb, 2), sumF(n * eb, 3);
    I items = kg::rmsNormDwPartItems(s.rows, c);
    grad(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dwU.data(),
         partial.data(), s.rows, c, c, c, c, parts, items);
    add(res.data(), dx.data(), sumU.data(), I(n));
    fused(x.data(), w.data(), rstd.data(), dy.data(), sumF.data(), res.data(),
          dwF.data(), partial.data(), s.rows, c, c, c, c, parts, items);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(c);
    EXPECT_TRUE(sameBits(sumU, sumF, eb, "dx + res")) << where;
    EXPECT_TRUE(sameBits(rawBytes(dwU), rawBytes(dwF), 4, "dw")) << where;
  }
}

/// RMSNorm backward whose dy is a chain of residual adds' sum, formed where
/// dy is read: the same bits as the generated adds, each storing its sum,
/// then the generated backward of the stored dy (and, with addResidual, the
/// add of its dx), and the same dw.
TEST_P(KernelGenHost, RmsNormBackwardOfAnAddChainMatchesTheUnfusedKernels) {
  size_t eb = bytesOf(type());
  using P = const void *;
  kg::GroupSpec gradSpec, addSpec, sum3Spec, sum4AddSpec;
  gradSpec.kind = kg::GroupKind::RmsNormBackward;
  gradSpec.dtype = addSpec.dtype = type();
  addSpec.kind = kg::GroupKind::ResidualAdd;
  sum3Spec = sum4AddSpec = gradSpec;
  sum3Spec.dyAddends = 3;
  sum4AddSpec.dyAddends = kg::kMaxDyAddends;
  sum4AddSpec.addResidual = true;
  auto *grad = jit()
                   .lookup<void(P, P, P, P, void *, float *, float *, I, I, I,
                                I, I, I, I)>(gradSpec);
  auto *add = jit().lookup<void(P, P, void *, I)>(addSpec);
  auto *sum3 = jit()
                   .lookup<void(P, P, P, P, void *, P, P, float *, float *, I,
                                I, I, I, I, I, I)>(sum3Spec);
  auto *sum4Add = jit()
                      .lookup<void(P, P, P, P, void *, P, P, P, P, float *,
                                   float *, I, I, I, I, I, I, I)>(sum4AddSpec);
  ASSERT_NE(grad, nullptr);
  ASSERT_NE(add, nullptr);
  ASSERT_NE(sum3, nullptr);
  ASSERT_NE(sum4Add, nullptr);
  EXPECT_NE(kg::kernelName(sum4AddSpec).find("_dw_add_sum4_"),
            std::string::npos)
      << kg::kernelName(sum4AddSpec);
  for (Shape s :
       {Shape{4, 256}, Shape{17, 33}, Shape{300, 40}, Shape{3, 1100}}) {
    size_t n = size_t(s.rows * s.cols);
    I c = s.cols;
    auto x = randomStorage(type(), n, 81 + c, 2.0, false);
    auto w = randomStorage(type(), size_t(c), 82 + c, 0.5, false);
    std::vector<std::vector<uint8_t>> d;
    for (int k = 0; k < kg::kMaxDyAddends; ++k)
      d.push_back(randomStorage(type(), n, 83 + 7 * k + c, 1.0, false));
    auto res = randomStorage(type(), n, 84 + c, 1.0, false);
    std::vector<float> rstd(size_t(s.rows));
    std::vector<uint8_t> yFwd(n * eb);
    ASSERT_EQ(referenceRmsNorm(type(), x.data(), w.data(), yFwd.data(),
                               rstd.data(), s.rows, c, c, true),
              Status::Ok);
    std::vector<float> dw0;
    for (double v : ap::test::randn(size_t(c), 85 + c))
      dw0.push_back(float(v));
    I parts = kg::rmsNormDwParts(s.rows);
    I items = kg::rmsNormDwPartItems(s.rows, c);
    std::vector<float> partial(size_t(parts * c));
    std::string where = std::to_string(s.rows) + "x" + std::to_string(c);
    // The unfused chain: s1 = d0 + d1, s2 = s1 + d2 (dy of sum3), s3 = s2 +
    // d3 (dy of sum4), each stored; then the backward of the stored dy.
    std::vector<uint8_t> s1(n * eb), s2(n * eb), s3(n * eb);
    add(d[0].data(), d[1].data(), s1.data(), I(n));
    add(s1.data(), d[2].data(), s2.data(), I(n));
    add(d[3].data(), s2.data(), s3.data(), I(n)); // either operand order
    {
      std::vector<float> dwU = dw0, dwF = dw0;
      std::vector<uint8_t> dxU(n * eb, 1), dxF(n * eb, 2);
      grad(x.data(), w.data(), rstd.data(), s2.data(), dxU.data(), dwU.data(),
           partial.data(), s.rows, c, c, c, c, parts, items);
      sum3(x.data(), w.data(), rstd.data(), d[0].data(), dxF.data(),
           d[1].data(), d[2].data(), dwF.data(), partial.data(), s.rows, c, c,
           c, c, parts, items);
      EXPECT_TRUE(sameBits(dxU, dxF, eb, "dx of a 3-addend dy")) << where;
      EXPECT_TRUE(sameBits(rawBytes(dwU), rawBytes(dwF), 4, "dw")) << where;
    }
    {
      std::vector<float> dwU = dw0, dwF = dw0;
      std::vector<uint8_t> dxU(n * eb, 1), sumU(n * eb, 2), sumF(n * eb, 3);
      grad(x.data(), w.data(), rstd.data(), s3.data(), dxU.data(), dwU.data(),
           partial.data(), s.rows, c, c, c, c, parts, items);
      add(res.data(), dxU.data(), sumU.data(), I(n));
      sum4Add(x.data(), w.data(), rstd.data(), d[0].data(), sumF.data(),
              d[1].data(), d[2].data(), d[3].data(), res.data(), dwF.data(),
              partial.data(), s.rows, c, c, c, c, parts, items);
      EXPECT_TRUE(sameBits(sumU, sumF, eb, "dx + res of a 4-addend dy"))
          << where;
      EXPECT_TRUE(sameBits(rawBytes(dwU), rawBytes(dwF), 4, "dw")) << where;
    }
  }
}

/// GDN's L2 norm over each head (rows of [tokens x heads, dim]): bitwise to
/// the model of kernelgen's row order, within bounds of the reference.
TEST_P(KernelGenHost, L2NormMatchesModelAndReference) {
  size_t eb = bytesOf(type());
  kg::GroupSpec fs, bs;
  fs.dtype = bs.dtype = type();
  fs.kind = kg::GroupKind::L2NormForward;
  bs.kind = kg::GroupKind::L2NormBackward;
  using P = const void *;
  auto *fwd = jit().lookup<void(P, void *, float *, I, I, float)>(fs);
  auto *bwd = jit().lookup<void(P, P, P, void *, I, I)>(bs);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  for (Shape s : kShapes) {
    size_t n = size_t(s.rows * s.cols);
    auto x = randomStorage(type(), n, 131 + s.cols, 2.0, false),
         dy = randomStorage(type(), n, 132 + s.cols, 1.0, false);
    float eps = 1e-6f;
    std::vector<uint8_t> yW(n * eb), yG(n * eb, 7), yR(n * eb);
    std::vector<float> rW(size_t(s.rows)), rG(size_t(s.rows), 3.f),
        rR(size_t(s.rows));
    modelL2Norm(type(), x.data(), yW.data(), rW.data(), s.rows, s.cols, eps);
    fwd(x.data(), yG.data(), rG.data(), s.rows, s.cols, eps);
    GdnL2NormArgs a;
    a.dtype = dtypeOf(type());
    a.tokens = s.rows;
    a.heads = 1;
    a.dim = int32_t(s.cols);
    a.eps = eps;
    a.x = x.data();
    a.y = yR.data();
    a.rstd = rR.data();
    ASSERT_EQ(gdnL2NormForward(kHost, a), Status::Ok);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(s.cols);
    EXPECT_TRUE(sameBits(yW, yG, eb, "l2norm y")) << where;
    EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(rG), 4, "l2norm rstd"))
        << where;
    EXPECT_TRUE(closeTo(type(), yR, yG, orderTol(type()), "y vs reference"))
        << where;
    EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(rR), rawBytes(rG), 1e-5,
                        "rstd vs reference"))
        << where;
    // The backward from the same y and rstd on both sides.
    std::vector<uint8_t> dxW(n * eb), dxG(n * eb, 9), dxR(n * eb);
    modelL2NormBackward(type(), yW.data(), rW.data(), dy.data(), dxW.data(),
                        s.rows, s.cols);
    bwd(yW.data(), rW.data(), dy.data(), dxG.data(), s.rows, s.cols);
    a.y = yW.data();
    a.rstd = rW.data();
    a.dy = dy.data();
    a.dx = dxR.data();
    ASSERT_EQ(gdnL2NormBackward(kHost, a), Status::Ok);
    EXPECT_TRUE(sameBits(dxW, dxG, eb, "l2norm dx")) << where;
    EXPECT_TRUE(closeTo(type(), dxR, dxG, orderTol(type()), "dx vs reference"))
        << where;
  }
}

// GDN's gated RMSNorm: bitwise to the model of kernelgen's order, within
// bounds of the reference; the backward with dw (several parts) and the
// rebuilt y, and without either.
TEST_P(KernelGenHost, GatedNormMatchesModelAndReference) {
  size_t eb = bytesOf(type());
  kg::GroupSpec fs, bs, bs0;
  fs.dtype = bs.dtype = bs0.dtype = type();
  fs.kind = kg::GroupKind::GatedNormForward;
  bs.kind = bs0.kind = kg::GroupKind::GatedNormBackward;
  bs.recomputeY = true;
  bs0.accumulateDw = false;
  using P = const void *;
  // (x, z, w, y, rstd, rows, dim, eps)
  auto *fwd = jit().lookup<void(P, P, P, void *, float *, I, I, float)>(fs);
  // (x, z, w, rstd, dy, dx, dz, dw, y, dwPartial, rows, dim, dwParts,
  //  dwPartItems)
  auto *bwd = jit()
                  .lookup<void(P, P, P, P, P, void *, void *, float *, void *,
                               float *, I, I, I, I)>(bs);
  // (x, z, w, rstd, dy, dx, dz, rows, dim)
  auto *bwd0 = jit().lookup<void(P, P, P, P, P, void *, void *, I, I)>(bs0);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  ASSERT_NE(bwd0, nullptr);
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({300, 16});
  for (Shape s : shapes) {
    size_t n = size_t(s.rows * s.cols);
    I d = s.cols;
    auto x = randomStorage(type(), n, 141 + s.cols, 2.0, false),
         z = randomStorage(type(), n, 142 + s.cols, 2.0, false),
         w = randomStorage(type(), size_t(d), 143 + s.cols, 0.5, false),
         dy = randomStorage(type(), n, 144 + s.cols, 1.0, false);
    float eps = 1e-6f;
    std::vector<uint8_t> yW(n * eb), yG(n * eb, 7), yR(n * eb);
    std::vector<float> rW(size_t(s.rows)), rG(size_t(s.rows), 3.f),
        rR(size_t(s.rows));
    modelGatedNorm(type(), x.data(), z.data(), w.data(), yW.data(), rW.data(),
                   s.rows, d, eps);
    fwd(x.data(), z.data(), w.data(), yG.data(), rG.data(), s.rows, d, eps);
    GdnGatedNormArgs a;
    a.dtype = dtypeOf(type());
    a.tokens = s.rows;
    a.heads = 1;
    a.dim = int32_t(d);
    a.eps = eps;
    a.x = x.data();
    a.z = z.data();
    a.w = w.data();
    a.y = yR.data();
    a.rstd = rR.data();
    ASSERT_EQ(gdnGatedNormForward(kHost, a), Status::Ok);
    std::string where = std::to_string(s.rows) + "x" + std::to_string(d);
    EXPECT_TRUE(sameBits(yW, yG, eb, "gated norm y")) << where;
    EXPECT_TRUE(sameBits(rawBytes(rW), rawBytes(rG), 4, "gated norm rstd"))
        << where;
    EXPECT_TRUE(closeTo(type(), yR, yG, orderTol(type()), "y vs reference"))
        << where;
    // The backward from the model's rstd on every side.
    std::vector<float> dw0;
    for (double v : ap::test::randn(size_t(d), 145 + s.cols))
      dw0.push_back(float(v));
    std::vector<float> dwW = dw0, dwG = dw0, dwR = dw0;
    std::vector<uint8_t> dxW(n * eb), dzW(n * eb), ybW(n * eb);
    std::vector<uint8_t> dxG(n * eb, 9), dzG(n * eb, 9), ybG(n * eb, 9);
    std::vector<uint8_t> dxR(n * eb), dzR(n * eb);
    modelGatedNormBackward(type(), x.data(), z.data(), w.data(), rW.data(),
                           dy.data(), dxW.data(), dzW.data(), dwW.data(),
                           ybW.data(), s.rows, d);
    I parts = kg::rmsNormDwParts(s.rows);
    std::vector<float> partial(size_t(parts * d), -5.f);
    bwd(x.data(), z.data(), w.data(), rW.data(), dy.data(), dxG.data(),
        dzG.data(), dwG.data(), ybG.data(), partial.data(), s.rows, d, parts,
        kg::rmsNormDwPartItems(s.rows, d));
    EXPECT_TRUE(sameBits(dxW, dxG, eb, "gated norm dx")) << where;
    EXPECT_TRUE(sameBits(dzW, dzG, eb, "gated norm dz")) << where;
    EXPECT_TRUE(sameBits(ybW, ybG, eb, "rebuilt y")) << where;
    EXPECT_TRUE(sameBits(yW, ybG, eb, "rebuilt y against the forward"))
        << where;
    EXPECT_TRUE(sameBits(rawBytes(dwW), rawBytes(dwG), 4, "gated norm dw"))
        << where;
    a.y = nullptr;
    a.rstd = rW.data();
    a.dy = dy.data();
    a.dx = dxR.data();
    a.dz = dzR.data();
    a.dw = dwR.data();
    ASSERT_EQ(gdnGatedNormBackward(kHost, a), Status::Ok);
    EXPECT_TRUE(closeTo(type(), dxR, dxG, orderTol(type()), "dx vs reference"))
        << where;
    EXPECT_TRUE(sameBits(dzR, dzG, eb, "dz vs reference")) << where;
    EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dwR), rawBytes(dwG), 1e-5,
                        "dw vs reference"))
        << where;
    // Without dw and y: the same dx and dz.
    std::vector<uint8_t> dx0(n * eb, 11), dz0(n * eb, 11);
    bwd0(x.data(), z.data(), w.data(), rW.data(), dy.data(), dx0.data(),
         dz0.data(), s.rows, d);
    EXPECT_TRUE(sameBits(dxG, dx0, eb, "dx without dw")) << where;
    EXPECT_TRUE(sameBits(dzG, dz0, eb, "dz without dw")) << where;
  }
}

// GDN's gates: g, beta, da and db bitwise to the reference (the same
// per-element code and libm calls); dA_log and dt_bias's gradient bitwise to
// the model of kernelgen's column sums and within bounds of the reference's
// token-order sums. Inputs put some of a + dt_bias above softplus's
// threshold of 20.
TEST_P(KernelGenHost, GdnGatesMatchModelAndReference) {
  size_t eb = bytesOf(type());
  kg::GroupSpec fs, bs;
  fs.dtype = bs.dtype = type();
  fs.kind = kg::GroupKind::GdnGatesForward;
  bs.kind = kg::GroupKind::GdnGatesBackward;
  using P = const void *;
  // (a, b, aLog, dtBias, g, beta, rows, heads)
  auto *fwd = jit().lookup<void(P, P, P, P, void *, void *, I, I)>(fs);
  // (a, aLog, dtBias, beta, dg, dbeta, da, db, dALog, dDtBias, partial,
  //  rows, heads, parts)
  auto *bwd = jit()
                  .lookup<void(P, P, P, P, P, P, void *, void *, float *,
                               float *, float *, I, I, I)>(bs);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  const Shape shapes[] = {{1, 16}, {3, 7}, {300, 16}, {1000, 5}, {4096, 16}};
  for (Shape s : shapes) {
    size_t n = size_t(s.rows * s.cols);
    I h = s.cols;
    std::string where = std::to_string(s.rows) + "x" + std::to_string(h);
    GatesInputs in = gatesInputs(type(), s.rows, h, 150 + uint64_t(s.cols));
    const auto &a = in.a, &b = in.b, &dbeta = in.dbeta;
    const auto &aLog = in.aLog, &dtBias = in.dtBias, &dg = in.dg;
    std::vector<float> gG(n, 3.f), gR(n);
    std::vector<uint8_t> betaG(n * eb, 7), betaR(n * eb);
    fwd(a.data(), b.data(), aLog.data(), dtBias.data(), gG.data(), betaG.data(),
        s.rows, h);
    GdnGatesArgs r = gatesArgs(type(), in, s.rows, h);
    r.g = gR.data();
    r.beta = betaR.data();
    ASSERT_EQ(gdnGatesForward(kHost, r), Status::Ok);
    EXPECT_TRUE(sameBits(rawBytes(gR), rawBytes(gG), 4, "gates g")) << where;
    EXPECT_TRUE(sameBits(betaR, betaG, eb, "gates beta")) << where;

    const std::vector<float> &dA0 = in.dALog0, &dT0 = in.dDtBias0;
    std::vector<float> dAG = dA0, dTG = dT0, dAR = dA0, dTR = dT0, dAW = dA0,
                       dTW = dT0;
    std::vector<uint8_t> daG(n * eb, 9), dbG(n * eb, 9), daR(n * eb),
        dbR(n * eb);
    I parts = kg::rmsNormDwParts(s.rows);
    ASSERT_EQ(kg::gdnGatesWorkspaceBytes(s.rows, h),
              uint64_t(2 * parts * h) * sizeof(float));
    std::vector<float> partial(size_t(2 * parts * h), -5.f);
    bwd(a.data(), aLog.data(), dtBias.data(), betaG.data(), dg.data(),
        dbeta.data(), daG.data(), dbG.data(), dAG.data(), dTG.data(),
        partial.data(), s.rows, h, parts);
    r.g = gG.data();
    r.beta = betaG.data();
    r.da = daR.data();
    r.db = dbR.data();
    r.dALog = dAR.data();
    r.dDtBias = dTR.data();
    ASSERT_EQ(gdnGatesBackward(kHost, r), Status::Ok);
    EXPECT_TRUE(sameBits(daR, daG, eb, "gates da")) << where;
    EXPECT_TRUE(sameBits(dbR, dbG, eb, "gates db")) << where;
    modelGdnGatesSums(type(), a.data(), aLog.data(), dtBias.data(), dg.data(),
                      dAW.data(), dTW.data(), s.rows, h);
    EXPECT_TRUE(sameBits(rawBytes(dAW), rawBytes(dAG), 4, "dA_log")) << where;
    EXPECT_TRUE(sameBits(rawBytes(dTW), rawBytes(dTG), 4, "ddt_bias")) << where;
    EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dAR), rawBytes(dAG), 1e-5,
                        "dA_log vs reference"))
        << where;
    EXPECT_TRUE(closeTo(kg::ElemType::F32, rawBytes(dTR), rawBytes(dTG), 1e-5,
                        "ddt_bias vs reference"))
        << where;
  }
}

// RoPE forward and backward: bitwise to the reference (the same double
// angle through the same libm pow, cos and sin, then the same f32
// arithmetic), at Qwen3.5-0.8B's partial rotary (64 of 256 dims), a rotary
// part after an offset, the whole head, and packed documents.
TEST_P(KernelGenHost, RopeMatchesReference) {
  size_t eb = bytesOf(type());
  const RopeCase cases[] = {{1, 300, 2, 256, 0, 64, 1e7, false},
                            {2, 37, 3, 10, 2, 6, 1e4, false},
                            {1, 5, 1, 8, 0, 8, 1e4, false},
                            {2, 200, 2, 64, 0, 64, 1e6, true}};
  using P = const void *;
  for (const RopeCase &c : cases) {
    kg::GroupSpec fs, bs;
    fs.dtype = bs.dtype = type();
    fs.kind = kg::GroupKind::RopeForward;
    bs.kind = kg::GroupKind::RopeBackward;
    fs.packed = bs.packed = c.packed;
    I tokens = c.batch * c.seq, cols = c.headDim - c.rotaryDim / 2;
    size_t n = size_t(tokens * c.heads * c.headDim);
    std::string where =
        std::to_string(c.seq) + "x" + std::to_string(c.headDim) + " rd " +
        std::to_string(c.rotaryDim) + (c.packed ? " packed" : "");
    auto x = randomStorage(type(), n, 171 + c.headDim, 2.0);
    std::vector<int32_t> docStart = packedDocStarts(c.batch, c.seq);
    int64_t thetaBits;
    std::memcpy(&thetaBits, &c.theta, 8);
    for (bool backward : {false, true}) {
      std::vector<uint8_t> yG(n * eb, 7), yR(n * eb, 5);
      if (c.packed) {
        auto *fn =
            jit().lookup<void(P, void *, P, I, I, I, I, I, I, I, int64_t)>(
                backward ? bs : fs);
        ASSERT_NE(fn, nullptr);
        fn(x.data(), yG.data(), docStart.data(), tokens, c.seq, c.heads,
           c.headDim, c.offset, c.rotaryDim, cols, thetaBits);
      } else {
        auto *fn = jit().lookup<void(P, void *, I, I, I, I, I, I, I, int64_t)>(
            backward ? bs : fs);
        ASSERT_NE(fn, nullptr);
        fn(x.data(), yG.data(), tokens, c.seq, c.heads, c.headDim, c.offset,
           c.rotaryDim, cols, thetaBits);
      }
      ASSERT_EQ(referenceRope(type(), c, x.data(), yR.data(), docStart.data(),
                              backward),
                Status::Ok);
      EXPECT_TRUE(sameBits(yR, yG, eb, backward ? "rope dx" : "rope y"))
          << where;
    }
  }
}

TEST_P(KernelGenHost, AdamWMatchesReference) {
  // Here the parameter is the main grad's storage type.
  kg::ElemType gradType = type();
  for (std::optional<kg::ElemType> copy :
       {std::optional<kg::ElemType>(kg::ElemType::BF16),
        std::optional<kg::ElemType>(kg::ElemType::F32),
        std::optional<kg::ElemType>()}) {
    kg::GroupSpec spec;
    spec.kind = kg::GroupKind::AdamW;
    spec.dtype = gradType;
    spec.computeCopy = copy;
    void *sym = jit().lookup<void>(spec);
    ASSERT_NE(sym, nullptr) << kg::kernelName(spec);
    for (I n : {I(1), I(9), I(1000), I(4099)})
      for (int64_t step : {1, 7}) {
        for (bool clip : {false, true}) {
          auto grad = randomStorage(gradType, size_t(n), 51 + n, 1e-2,
                                    /*specials=*/false);
          auto toF = [](const std::vector<double> &v) {
            return std::vector<float>(v.begin(), v.end());
          };
          std::vector<float> p = toF(ap::test::randn(size_t(n), 52 + n));
          std::vector<float> m = toF(ap::test::randn(size_t(n), 53 + n, 1e-2));
          std::vector<float> v;
          for (double d : ap::test::randn(size_t(n), 54 + n))
            v.push_back(float(1e-4 * std::fabs(d)));
          std::vector<float> pW = p, mW = m, vW = v, pG = p, mG = m, vG = v;
          size_t cb = copy ? bytesOf(*copy) : 1;
          std::vector<uint8_t> cW(size_t(n) * cb, 11), cG(cW.size(), 12);
          float cc = 0.375f;
          AdamWArgs a;
          a.master = pW.data();
          a.expAvg = mW.data();
          a.expAvgSq = vW.data();
          a.grad = grad.data();
          a.gradDType = dtypeOf(gradType);
          a.clipCoef = clip ? &cc : nullptr;
          a.computeCopy = copy ? cW.data() : nullptr;
          a.computeDType = copy ? dtypeOf(*copy) : DType::BF16;
          a.n = n;
          a.lr = 3e-4;
          a.weightDecay = 0.1;
          a.step = step;
          ASSERT_EQ(adamWStep(kHost, a), Status::Ok);
          kg::AdamWScalars k = kg::adamWScalars(a.lr, a.beta1, a.beta2, a.eps,
                                                a.weightDecay, a.step);
          const float *ccp = clip ? &cc : nullptr;
          if (copy)
            reinterpret_cast<void (*)(float *, float *, float *, const void *,
                                      const float *, void *, I, float, float,
                                      float, float, float, float)>(sym)(
                pG.data(), mG.data(), vG.data(), grad.data(), ccp, cG.data(), n,
                k.stepSize, k.bc2Sqrt, k.decay, k.beta1, k.beta2, k.eps);
          else
            reinterpret_cast<void (*)(float *, float *, float *, const void *,
                                      const float *, I, float, float, float,
                                      float, float, float)>(sym)(
                pG.data(), mG.data(), vG.data(), grad.data(), ccp, n,
                k.stepSize, k.bc2Sqrt, k.decay, k.beta1, k.beta2, k.eps);
          std::string where = kg::kernelName(spec) + " n=" + std::to_string(n) +
                              " step=" + std::to_string(step) +
                              (clip ? " clip" : "");
          EXPECT_TRUE(sameBits(rawBytes(pW), rawBytes(pG), 4, "master"))
              << where;
          EXPECT_TRUE(sameBits(rawBytes(mW), rawBytes(mG), 4, "expAvg"))
              << where;
          EXPECT_TRUE(sameBits(rawBytes(vW), rawBytes(vG), 4, "expAvgSq"))
              << where;
          if (copy)
            EXPECT_TRUE(sameBits(cW, cG, cb, "compute copy")) << where;
          else
            EXPECT_EQ(cG, std::vector<uint8_t>(cG.size(), 12)) << where;
        }
      }
  }
}

/// The grad norm: each tensor's partials bitwise to the model of the
/// library's CUDA order (kernelgen_test_util.h), the finish's sum, norm and
/// clip bitwise to the model's over them, with and without a starting sum
/// (a pipeline stage's); against the reference kernel (sequential within a
/// block) the sum of squares within 1e-12 relative and the f32 norm within
/// one ulp.
TEST_P(KernelGenHost, GradNormMatchesModelAndReference) {
  static_assert(kg::kGradNormBlock == ap::kernels::kGradNormBlockElements,
                "kernelgen's grad-norm blocking is the library's");
  kg::GroupSpec sq;
  sq.kind = kg::GroupKind::GradNormSquares;
  sq.dtype = type();
  kg::GroupSpec fin;
  fin.kind = kg::GroupKind::GradNormFinish;
  auto *squares = jit().lookup<void(const void *, double *, I)>(sq);
  auto *finish = jit()
                     .lookup<void(const double *, const double *, float *,
                                  float *, double *, I, I)>(fin);
  ASSERT_NE(squares, nullptr);
  ASSERT_NE(finish, nullptr);
  std::vector<std::vector<uint8_t>> data;
  std::vector<GradTensor> tensors;
  std::vector<double> model;
  for (I n : kGradNormSizes) {
    data.push_back(randomStorage(type(), size_t(n), 61 + n, 1e-2, false));
    tensors.push_back({data.back().data(), n, dtypeOf(type())});
  }
  std::vector<double> partial;
  for (const GradTensor &g : tensors) {
    std::vector<double> want = modelGradNormPartials(type(), g.data, g.n);
    std::vector<double> got(want.size(), -1.0);
    ASSERT_EQ(I(want.size()), ap::kernels::gradNormParts(g.n));
    squares(g.data, got.data(), g.n);
    std::vector<uint8_t> wb(want.size() * 8), gb(got.size() * 8);
    std::memcpy(wb.data(), want.data(), wb.size());
    std::memcpy(gb.data(), got.data(), gb.size());
    EXPECT_TRUE(sameBits(wb, gb, 8, "partials")) << "n=" << g.n;
    partial.insert(partial.end(), got.begin(), got.end());
  }
  for (double initial : {0.0, 12.375})
    for (double maxNorm : {0.0, 1.0, 1e9}) {
      GradNormResult want = modelGradNormFinish(partial, initial, maxNorm);
      double gotSquares = -1;
      float gotNorm = -1, gotClip = -1;
      finish(partial.data(), initial != 0 ? &initial : nullptr, &gotNorm,
             &gotClip, &gotSquares, I(partial.size()), doubleBits(maxNorm));
      std::string where = "initial " + std::to_string(initial) + " maxNorm " +
                          std::to_string(maxNorm);
      EXPECT_EQ(doubleBits(gotSquares), doubleBits(want.squares)) << where;
      EXPECT_EQ(std::memcmp(&gotNorm, &want.norm, 4), 0)
          << where << ": " << gotNorm << " against " << want.norm;
      EXPECT_EQ(std::memcmp(&gotClip, &want.clip, 4), 0)
          << where << ": " << gotClip << " against " << want.clip;
      // The null outputs are skipped, the norm still written.
      float normOnly = -1;
      finish(partial.data(), nullptr, &normOnly, nullptr, nullptr,
             I(partial.size()), doubleBits(maxNorm));
      EXPECT_EQ(normOnly, modelGradNormFinish(partial, 0, maxNorm).norm);
      // The reference kernel: the same sums in its own order.
      GradNormArgs r;
      r.tensors = tensors.data();
      r.numTensors = I(tensors.size());
      r.maxNorm = maxNorm;
      double refSquares = 0;
      float refNorm = 0, refClip = 0;
      r.norm = &refNorm;
      r.clipCoef = &refClip;
      r.squares = &refSquares;
      r.initialSquares = initial != 0 ? &initial : nullptr;
      ASSERT_EQ(gradNorm(kHost, r), Status::Ok);
      EXPECT_LE(std::fabs(gotSquares - refSquares), 1e-12 * refSquares)
          << where;
      EXPECT_LE(std::fabs(gotNorm - refNorm),
                std::nextafter(refNorm, 1e30f) - refNorm)
          << where;
    }
}

INSTANTIATE_TEST_SUITE_P(Storage, KernelGenHost,
                         ::testing::Values(kg::ElemType::BF16,
                                           kg::ElemType::F32),
                         [](const auto &info) {
                           return info.param == kg::ElemType::BF16
                                      ? std::string("bf16")
                                      : std::string("f32");
                         });

/// bf16 rounding of the generated store against bf16::fromFloat on chosen
/// sums of two bf16 values: ties to even both ways, overflow to infinity,
/// denormals, infinity and NaN (kept quiet and non-zero).
TEST(KernelGenHostBf16, RoundingMatchesReferenceOnSpecials) {
  ASSERT_TRUE(jit().engine) << jit().error;
  kg::GroupSpec spec;
  spec.kind = kg::GroupKind::ResidualAdd;
  spec.dtype = kg::ElemType::BF16;
  auto *fn = jit().lookup<void(const void *, const void *, void *, I)>(spec);
  ASSERT_NE(fn, nullptr);
  std::vector<uint16_t> a, b;
  const float fa[] = {1.0f,
                      1.0f,
                      -1.0f,
                      65280.0f,
                      3.0e38f,
                      1e-39f,
                      std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()};
  const float fb[] = {0.00390625f, 0.01171875f, -0.00390625f, 3.0e38f,
                      3.0e38f,     1e-39f,      -1.0f,        1.0f};
  for (size_t i = 0; i < sizeof(fa) / sizeof(fa[0]); ++i) {
    a.push_back(bf16(fa[i]).bits);
    b.push_back(bf16(fb[i]).bits);
  }
  I n = I(a.size());
  std::vector<uint16_t> want(a.size()), got(a.size());
  ResidualAddArgs r;
  r.dtype = DType::BF16;
  r.a = a.data();
  r.b = b.data();
  r.y = want.data();
  r.n = n;
  ASSERT_EQ(residualAddForward(kHost, r), Status::Ok);
  fn(a.data(), b.data(), got.data(), n);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(want[i], got[i]) << "element " << i;
}

/// The in-memory object: an ELF relocatable that defines every kernel.
TEST(KernelGenHostObject, DefinesEveryKernel) {
  mlir::DialectRegistry registry;
  kg::registerKernelGenDialects(registry);
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  auto specs = Jit::specs();
  auto module = kg::buildHostModule(context, specs);
  ASSERT_TRUE(mlir::succeeded(kg::lowerHostToLLVM(*module)));
  auto object = kg::hostObject(*module);
  ASSERT_TRUE(mlir::succeeded(object));
  ASSERT_GT(object->size(), 4u);
  EXPECT_EQ(object->substr(0, 4), std::string("\x7f"
                                              "ELF"));
  for (const kg::GroupSpec &s : specs)
    EXPECT_NE(object->find(kg::kernelName(s)), std::string::npos)
        << kg::kernelName(s);
}

/// What a training binary takes: every kernel's packed entry (its
/// parameter kinds checked against the lowered function by the generator),
/// parsed back where only the LLVM dialect is loaded; each GPU entry counts
/// its threads by int64 parameters; duplicated specs are generated once.
TEST(KernelGenBinary, PackedEntriesMatchTheKernelAbi) {
  auto specs = Jit::specs();
  std::vector<kg::GroupSpec> twice = specs;
  twice.insert(twice.end(), specs.begin(), specs.end());
  std::string text, error;
  ASSERT_TRUE(kg::packedHostKernels(twice, text, error)) << error;
  mlir::MLIRContext context(mlir::MLIRContext::Threading::DISABLED);
  context.loadDialect<mlir::LLVM::LLVMDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(text, &context);
  ASSERT_TRUE(module) << "the packed kernels do not parse back";
  for (const kg::GroupSpec &s : specs) {
    auto packed =
        module->lookupSymbol<mlir::LLVM::LLVMFuncOp>(kg::packedName(s));
    ASSERT_TRUE(packed) << kg::packedName(s);
    EXPECT_EQ(packed.getFunctionType().getNumParams(), 1u);
    auto fn = module->lookupSymbol<mlir::LLVM::LLVMFuncOp>(kg::kernelName(s));
    ASSERT_TRUE(fn) << kg::kernelName(s);
    std::vector<kg::KernelParam> params = kg::kernelParams(s);
    EXPECT_EQ(fn.getFunctionType().getNumParams(), params.size());
    for (const kg::GpuEntry &e : kg::gpuEntries(s)) {
      // The grad norm's finish is one block whatever its arguments.
      if (s.kind == kg::GroupKind::GradNormFinish)
        EXPECT_EQ(kg::gpuBlocks(e, std::vector<int64_t>(params.size(), 5)), 1u);
      else
        EXPECT_FALSE(e.workParams.empty()) << e.name;
      for (int w : e.workParams) {
        ASSERT_LT(size_t(w), params.size()) << e.name;
        EXPECT_EQ(params[w].kind, 'l') << e.name << " parameter " << w;
      }
    }
    EXPECT_EQ(kg::gpuEntries(s).size(), kg::gpuKernelNames(s).size());
  }
  size_t defs = 0;
  for (auto fn : module->getOps<mlir::LLVM::LLVMFuncOp>())
    defs += !fn.isExternal() && fn.getName().ends_with("_packed");
  EXPECT_EQ(defs, specs.size());
}

} // namespace

// Rows a warp of the row-wise groups: 4 where a row is one chunk a lane, 2
// where it is two, 1 wider (and for the other kinds); the choice names the
// kernel and sets the launch's rows per item.
TEST(KernelGenAbi, RowsPerWarpFollowsTheRowLength) {
  kg::GroupSpec s;
  s.kind = kg::GroupKind::RmsNormForward;
  EXPECT_EQ(kg::rowsPerWarpFor(s, 256), 4);  // 32 chunks of 8
  EXPECT_EQ(kg::rowsPerWarpFor(s, 257), 2);  // 33 chunks
  EXPECT_EQ(kg::rowsPerWarpFor(s, 512), 2);  // 64 chunks
  EXPECT_EQ(kg::rowsPerWarpFor(s, 1024), 1); // 128 chunks
  s.dtype = kg::ElemType::F32;
  EXPECT_EQ(kg::rowsPerWarpFor(s, 256), 2); // 64 chunks of 4
  s.dtype = kg::ElemType::BF16;
  s.kind = kg::GroupKind::L2NormForward;
  EXPECT_EQ(kg::rowsPerWarpFor(s, 128), 4); // 32 chunks of 4
  s.kind = kg::GroupKind::RmsNormBackward;
  EXPECT_EQ(kg::rowsPerWarpFor(s, 128), 1);
  EXPECT_FALSE(kg::hasRowsPerWarp(s.kind));
  s.kind = kg::GroupKind::GatedNormForward;
  s.rowsPerWarp = 4;
  EXPECT_EQ(kg::kernelName(s), "ap_kg_gated_norm_fwd_r4_bf16");
  std::vector<kg::GpuEntry> e = kg::gpuEntries(s);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].vector, 4);
  // 10 rows at 4 a warp: 3 warps, one block of 256 threads.
  std::vector<int64_t> ints(kg::kernelParams(s).size(), 0);
  for (size_t i = 0; i < ints.size(); ++i)
    if (kg::kernelParams(s)[i].name == "rows")
      ints[i] = 10;
  EXPECT_EQ(kg::gpuBlocks(e[0], ints), 1u);
  s.rowsPerWarp = 1;
  EXPECT_EQ(kg::kernelName(s), "ap_kg_gated_norm_fwd_bf16");
}

// The norm backwards with dw take rows of at most one chunk a lane in
// registers (the _k kernels): the q/k norms' 256 and the GDN heads' 128 do,
// the hidden size's 1024 does not, nor a backward without dw; the launch
// is the shared-memory path's.
TEST(KernelGenAbi, NormBackwardRowInRegistersFollowsTheRowLength) {
  kg::GroupSpec s;
  s.kind = kg::GroupKind::RmsNormBackward;
  EXPECT_TRUE(kg::hasDwRowInRegisters(s.kind));
  EXPECT_TRUE(kg::rowInRegistersFor(s, 256));   // 32 chunks of 8
  EXPECT_FALSE(kg::rowInRegistersFor(s, 257));  // 33 chunks
  EXPECT_FALSE(kg::rowInRegistersFor(s, 1024)); // 128 chunks
  s.dtype = kg::ElemType::F32;
  EXPECT_FALSE(kg::rowInRegistersFor(s, 256)); // 64 chunks of 4
  EXPECT_TRUE(kg::rowInRegistersFor(s, 128));
  s.dtype = kg::ElemType::BF16;
  s.kind = kg::GroupKind::GatedNormBackward;
  EXPECT_TRUE(kg::rowInRegistersFor(s, 128)); // 32 chunks of 4
  EXPECT_FALSE(kg::rowInRegistersFor(s, 256));
  s.accumulateDw = false;
  EXPECT_FALSE(kg::rowInRegistersFor(s, 128));
  s.accumulateDw = true;
  s.rowInRegisters = true;
  EXPECT_EQ(kg::kernelName(s), "ap_kg_gated_norm_bwd_dw_k_bf16");
  kg::GroupSpec shared = s;
  shared.rowInRegisters = false;
  std::vector<kg::GpuEntry> k = kg::gpuEntries(s), sh = kg::gpuEntries(shared);
  ASSERT_EQ(k.size(), sh.size());
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(k[i].blockSize, sh[i].blockSize) << i;
    EXPECT_EQ(k[i].workParams, sh[i].workParams) << i;
  }
  s.kind = kg::GroupKind::L2NormBackward; // not a norm backward with dw
  EXPECT_FALSE(kg::hasDwRowInRegisters(s.kind));
  EXPECT_FALSE(kg::rowInRegistersFor(s, 128));
}
