//===- Binary.cpp - generated kernels for a training binary --------------===//
//
// What code generation takes from kernelgen: the host kernels of a step's
// groups in the LLVM dialect with one packed entry each, and the PTX of their
// GPU entries. Each is built in an MLIRContext of its own (the kernelgen
// dialects stay out of the compiler's context) and handed over as text: the
// host form as LLVM-dialect MLIR, which the step module parses and absorbs,
// the GPU form as PTX, which the binary embeds.
//
// The packed entry `<name>_packed(void **params)` loads parameter i from
// params[i] and calls the kernel: the argument array of cuLaunchKernel, so
// the runtime launches a generated kernel on either backend from one array.
//
//===----------------------------------------------------------------------===//
#include "kernelgen/KernelGen.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

namespace ap::kernelgen {
namespace {

/// Collects the diagnostics of a context into one message.
struct Diagnostics {
  std::string text;
  ScopedDiagnosticHandler handler;
  explicit Diagnostics(MLIRContext &ctx)
      : handler(&ctx, [this](Diagnostic &d) {
          if (!text.empty())
            text += "; ";
          text += d.str();
          return success();
        }) {}
};

std::vector<GroupSpec> unique(ArrayRef<GroupSpec> specs) {
  llvm::StringSet<> seen;
  std::vector<GroupSpec> out;
  for (const GroupSpec &s : specs)
    if (seen.insert(kernelName(s)).second)
      out.push_back(s);
  return out;
}

/// Adds `<name>_packed(ptr)` beside each lowered kernel of `module`.
LogicalResult addPackedEntries(ModuleOp module, ArrayRef<GroupSpec> specs) {
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Location loc = module.getLoc();
  auto ptr = LLVM::LLVMPointerType::get(ctx);
  for (const GroupSpec &spec : specs) {
    auto fn = module.lookupSymbol<LLVM::LLVMFuncOp>(kernelName(spec));
    if (!fn)
      return module.emitError("kernelgen: no lowered host function ")
             << kernelName(spec);
    std::vector<KernelParam> params = kernelParams(spec);
    LLVM::LLVMFunctionType type = fn.getFunctionType();
    if (type.getNumParams() != params.size())
      return module.emitError("kernelgen: ")
             << kernelName(spec) << " takes " << type.getNumParams()
             << " parameters where its ABI lists " << params.size();
    b.setInsertionPointToEnd(module.getBody());
    auto packed = LLVM::LLVMFuncOp::create(
        b, loc, packedName(spec),
        LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(ctx), {ptr}));
    Block *entry = packed.addEntryBlock(b);
    b.setInsertionPointToStart(entry);
    SmallVector<Value> args;
    for (auto [i, p] : llvm::enumerate(params)) {
      Type t = type.getParamType(i);
      bool expected = p.kind == 'p' || p.kind == 'w'
                          ? isa<LLVM::LLVMPointerType>(t)
                      : p.kind == 'l' ? t.isInteger(64)
                                      : t.isF32();
      if (!expected)
        return module.emitError("kernelgen: parameter ")
               << i << " (" << p.name << ") of " << kernelName(spec)
               << " has type " << t << ", not the ABI's '" << p.kind << "'";
      Value slot = LLVM::GEPOp::create(b, loc, ptr, ptr, entry->getArgument(0),
                                       ArrayRef<LLVM::GEPArg>{int32_t(i)});
      Value at = LLVM::LoadOp::create(b, loc, ptr, slot);
      args.push_back(LLVM::LoadOp::create(b, loc, t, at));
    }
    LLVM::CallOp::create(b, loc, fn, args);
    LLVM::ReturnOp::create(b, loc, ValueRange{});
  }
  return success();
}

} // namespace

bool packedHostKernels(ArrayRef<GroupSpec> specs, std::string &mlirText,
                       std::string &error) {
  DialectRegistry registry;
  registerKernelGenDialects(registry);
  MLIRContext ctx(registry);
  Diagnostics diags(ctx);
  std::vector<GroupSpec> groups = unique(specs);
  OwningOpRef<ModuleOp> module = buildHostModule(ctx, groups);
  if (failed(lowerHostToLLVM(*module)) ||
      failed(addPackedEntries(*module, groups))) {
    error = diags.text.empty() ? "kernelgen: host lowering failed" : diags.text;
    return false;
  }
  mlirText.clear();
  llvm::raw_string_ostream os(mlirText);
  module->print(os);
  return true;
}

bool kernelsPtx(ArrayRef<GroupSpec> specs, const GpuTarget &target,
                std::string &ptx, std::string &error) {
  DialectRegistry registry;
  registerKernelGenDialects(registry);
  MLIRContext ctx(registry);
  Diagnostics diags(ctx);
  OwningOpRef<ModuleOp> module = buildGpuModule(ctx, unique(specs));
  FailureOr<std::string> text = failure();
  if (succeeded(lowerGpuToBinary(*module, target)))
    text = ptxOf(*module);
  if (failed(text)) {
    error = diags.text.empty() ? "kernelgen: GPU lowering failed" : diags.text;
    return false;
  }
  ptx = std::move(*text);
  return true;
}

} // namespace ap::kernelgen
