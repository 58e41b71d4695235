//===- FuzzCommon.h - what every actplace fuzz target shares ------*- C++
//-*-===//
//
// Fuzz inputs are mostly invalid, so the errors the code under test reports
// are expected and are not findings: the targets swallow diagnostics and
// llvm::Error values. Findings are what libFuzzer and the sanitizers see
// (crashes, sanitizer reports, hangs, memory blow-ups) plus the invariants a
// target checks with `fuzzFailure` (a pass that succeeds but leaves IR that
// does not verify, an importer graph that does not verify).
//
// Set ACTPLACE_FUZZ_VERBOSE=1 when replaying an input to see the diagnostics
// and the printing passes' output (docs/fuzzing.md).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_FUZZ_FUZZCOMMON_H
#define ACTPLACE_FUZZ_FUZZCOMMON_H

#include "dialect/exec/ExecDialect.h"
#include "dialect/train/TrainDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <memory>
#include <string>
#include <unistd.h>

namespace ap::fuzz {

inline bool verbose() {
  static const bool on = std::getenv("ACTPLACE_FUZZ_VERBOSE") != nullptr;
  return on;
}

/// The fuzz input as text: a NUL-terminated copy. libFuzzer hands the target
/// a buffer of exactly `size` bytes with nothing after them, while MLIR's
/// lexer (parseSourceString wraps the text in a MemoryBuffer without
/// checking for a terminator) stops only at a NUL: an input that ends inside
/// an identifier, a string or a comment made it read on into whatever the
/// heap held past the buffer. A finding of that kind depended on the heap
/// rather than on the input, so replaying it did not reproduce it
/// (fuzz/GuardReplay.cpp now replays inputs against an unreadable page).
inline std::string inputText(const uint8_t *data, size_t size) {
  return std::string(reinterpret_cast<const char *>(data), size);
}

/// The dialects actplace-opt registers, so the targets accept what the tools
/// accept.
inline const mlir::DialectRegistry &registry() {
  static mlir::DialectRegistry *r = [] {
    auto *reg = new mlir::DialectRegistry;
    reg->insert<ap::exec::ExecDialect, ap::train::TrainDialect,
                mlir::func::FuncDialect, mlir::arith::ArithDialect,
                mlir::scf::SCFDialect, mlir::tensor::TensorDialect>();
    return reg;
  }();
  return *r;
}

/// A fresh context per input (no state carries between inputs, so a finding
/// reproduces from its input alone), single-threaded so a crash has one
/// stack, with every diagnostic swallowed (printed under
/// ACTPLACE_FUZZ_VERBOSE).
class FuzzContext {
public:
  FuzzContext()
      : ctx(registry(), mlir::MLIRContext::Threading::DISABLED),
        handler(&ctx, [](mlir::Diagnostic &d) {
          if (verbose())
            llvm::errs() << d.getLocation() << ": " << d << "\n";
          return mlir::success();
        }) {}
  mlir::MLIRContext &get() { return ctx; }

private:
  mlir::MLIRContext ctx;
  mlir::ScopedDiagnosticHandler handler;
};

/// An invariant of the code under test does not hold: print why and abort,
/// so libFuzzer saves the input as a crash.
[[noreturn]] inline void fuzzFailure(const llvm::Twine &why) {
  llvm::errs() << "actplace fuzz: invariant violated: " << why << "\n";
  llvm::errs().flush();
  std::abort();
}

/// Aborts when a pass reports success but leaves IR that does not verify
/// (the pass manager's own verifier would turn that into an ordinary error).
/// The verifier's first diagnostic goes into the message, so a finding in a
/// CI log says what broke without its input.
struct VerifyAfterEachPass : mlir::PassInstrumentation {
  void runAfterPass(mlir::Pass *pass, mlir::Operation *op) override {
    std::string first;
    mlir::LogicalResult verified = mlir::success();
    {
      mlir::ScopedDiagnosticHandler capture(
          op->getContext(), [&](mlir::Diagnostic &d) {
            if (first.empty() &&
                d.getSeverity() == mlir::DiagnosticSeverity::Error)
              first = d.str();
            return mlir::success();
          });
      verified = mlir::verify(op);
    }
    if (mlir::failed(verified))
      fuzzFailure(llvm::Twine(pass->getArgument()) +
                  " succeeded but left IR that does not verify: " + first);
  }
};

/// Runs `pipeline` (textual, as on the actplace-opt command line; the
/// actplace passes must be registered) on `module`; false when a pass fails,
/// which is an error the input earned.
inline bool runPipeline(mlir::ModuleOp module, const std::string &pipeline) {
  mlir::PassManager pm(module.getContext());
  pm.enableVerifier(false);
  pm.addInstrumentation(std::make_unique<VerifyAfterEachPass>());
  std::string error;
  llvm::raw_string_ostream os(error);
  if (mlir::failed(mlir::parsePassPipeline(pipeline, pm, os)))
    fuzzFailure("the fuzz target's pipeline '" + pipeline +
                "' does not parse: " + error);
  return mlir::succeeded(pm.run(module));
}

/// The printing passes write to stdout; at fuzzing speed that is noise and
/// time, so stdout goes to /dev/null unless ACTPLACE_FUZZ_VERBOSE is set.
/// libFuzzer reports on stderr.
inline void silenceStdout() {
  if (verbose())
    return;
  int devnull = ::open("/dev/null", O_WRONLY);
  if (devnull >= 0) {
    std::fflush(stdout);
    ::dup2(devnull, STDOUT_FILENO);
    ::close(devnull);
  }
}

} // namespace ap::fuzz

#endif // ACTPLACE_FUZZ_FUZZCOMMON_H
