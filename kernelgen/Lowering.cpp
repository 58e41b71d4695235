//===- Lowering.cpp - host and GPU lowerings of generated kernels ---------===//
//
// Host: scf -> cf, then arith, math, memref, cf and func to the LLVM dialect;
// LLVM IR for the generic x86-64 CPU (no FMA in the instruction set, as the
// reference kernels are built), as text, as an object, or JIT-ed.
// GPU: NVVM target attached (sm_90a, PTX 8.0), gpu.module to NVVM, then
// gpu-module-to-binary in "isa" form: the PTX text, produced by LLVM's NVPTX
// back end in process, with no GPU or driver needed.
//
// Neither lowering adds fast-math flags, so LLVM neither contracts a multiply
// and an add into an FMA nor reassociates: the kernels keep the reference's
// operation order (docs/kernelgen.md).
//
//===----------------------------------------------------------------------===//
#include "kernelgen/KernelGen.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/Triple.h"

#include <cstdlib>

using namespace mlir;

namespace ap::kernelgen {

void registerKernelGenDialects(DialectRegistry &registry) {
  registry
      .insert<arith::ArithDialect, cf::ControlFlowDialect, func::FuncDialect,
              gpu::GPUDialect, LLVM::LLVMDialect, math::MathDialect,
              memref::MemRefDialect, NVVM::NVVMDialect, scf::SCFDialect>();
  // Patterns convert-gpu-to-nvvm takes from each dialect in the kernels.
  arith::registerConvertArithToLLVMInterface(registry);
  cf::registerConvertControlFlowToLLVMInterface(registry);
  registerConvertFuncToLLVMInterface(registry);
  registerConvertMemRefToLLVMInterface(registry);
  registerConvertMathToLLVMInterface(registry);
  registerConvertNVVMToLLVMInterface(registry);
  ub::registerConvertUBToLLVMInterface(registry);
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerAllGPUToLLVMIRTranslations(registry);
}

LogicalResult lowerHostToLLVM(ModuleOp module) {
  PassManager pm(module.getContext());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  if (failed(pm.run(module)))
    return module.emitError("kernelgen: the host kernels did not lower to "
                            "the LLVM dialect");
  return success();
}

namespace {

/// The generic x86-64 (or other host architecture) machine: the CPU the
/// reference kernels are compiled for without -march, so no FMA instruction
/// exists to contract into.
FailureOr<std::unique_ptr<llvm::TargetMachine>> hostMachine(ModuleOp module) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::Triple triple(llvm::sys::getDefaultTargetTriple());
  std::string error;
  const llvm::Target *target =
      llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return module.emitError("kernelgen: no LLVM target for ")
           << triple.str() << ": " << error;
  llvm::TargetOptions options;
  options.AllowFPOpFusion = llvm::FPOpFusion::Standard;
  std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
      triple, "generic", "", options, llvm::Reloc::PIC_, std::nullopt,
      llvm::CodeGenOptLevel::Default));
  if (!machine)
    return module.emitError("kernelgen: cannot create a target machine for ")
           << triple.str();
  return machine;
}

/// LLVM's -O2 pipeline. It keeps every floating-point result: without
/// fast-math flags it may not reassociate (so the row reduction is not
/// vectorized out of order), contract, or replace libm calls.
llvm::Error optimize(llvm::Module &module, llvm::TargetMachine &machine) {
  return makeOptimizingTransformer(/*optLevel=*/2, /*sizeLevel=*/0,
                                   &machine)(&module);
}

/// The host machine and the lowered module's LLVM IR for it, verified and
/// optimized.
struct HostIR {
  std::unique_ptr<llvm::TargetMachine> machine;
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
};

FailureOr<HostIR> translate(ModuleOp module) {
  auto machine = hostMachine(module);
  if (failed(machine))
    return failure();
  HostIR ir{std::move(*machine), std::make_unique<llvm::LLVMContext>(),
            nullptr};
  ir.module = translateModuleToLLVMIR(module, *ir.context, "ap_kernelgen");
  if (!ir.module)
    return module.emitError(
        "kernelgen: the lowered host kernels did not translate to LLVM IR");
  ir.module->setTargetTriple(ir.machine->getTargetTriple());
  ir.module->setDataLayout(ir.machine->createDataLayout());
  std::string errors;
  llvm::raw_string_ostream os(errors);
  if (llvm::verifyModule(*ir.module, &os))
    return module.emitError("kernelgen: the host LLVM IR does not verify: ")
           << errors;
  if (llvm::Error e = optimize(*ir.module, *ir.machine))
    return module.emitError("kernelgen: LLVM -O2 failed on the host kernels: ")
           << llvm::toString(std::move(e));
  return ir;
}

} // namespace

FailureOr<std::string> hostLLVMIR(ModuleOp module) {
  auto ir = translate(module);
  if (failed(ir))
    return failure();
  std::string text;
  llvm::raw_string_ostream os(text);
  ir->module->print(os, nullptr);
  return text;
}

FailureOr<std::string> hostObject(ModuleOp module) {
  auto ir = translate(module);
  if (failed(ir))
    return failure();
  llvm::SmallString<0> object;
  llvm::raw_svector_ostream os(object);
  llvm::legacy::PassManager pm;
  if (ir->machine->addPassesToEmitFile(pm, os, nullptr,
                                       llvm::CodeGenFileType::ObjectFile))
    return module.emitError(
        "kernelgen: the host target machine cannot emit an object file");
  pm.run(*ir->module);
  return std::string(object.str());
}

FailureOr<std::unique_ptr<ExecutionEngine>> jitHostModule(ModuleOp module) {
  auto machine = hostMachine(module);
  if (failed(machine))
    return failure();
  ExecutionEngineOptions options;
  options.jitCodeGenOptLevel = llvm::CodeGenOptLevel::Default;
  // The same -O2 as the object file; the transformer runs inside create(),
  // while `optMachine` lives.
  auto optMachine = hostMachine(module);
  if (failed(optMachine))
    return failure();
  llvm::TargetMachine *optTarget = optMachine->get();
  auto transformer = [optTarget](llvm::Module *m) {
    return optimize(*m, *optTarget);
  };
  options.transformer = transformer;
  options.enableGDBNotificationListener = false;
  options.enablePerfNotificationListener = false;
  auto engine = ExecutionEngine::create(module, options, std::move(*machine));
  if (!engine) {
    std::string message = llvm::toString(engine.takeError());
    return module.emitError("kernelgen: cannot JIT the host kernels: ")
           << message;
  }
  return std::move(*engine);
}

std::string libdeviceToolkit(const GpuTarget &target) {
  if (!target.toolkitPath.empty())
    return target.toolkitPath;
  const char *candidates[] = {std::getenv("CUDA_HOME"),
                              std::getenv("CUDA_PATH"), "/usr/local/cuda"};
  for (const char *candidate : candidates) {
    if (!candidate || !*candidate)
      continue;
    llvm::SmallString<256> libdevice(candidate);
    llvm::sys::path::append(libdevice, "nvvm", "libdevice", "libdevice.10.bc");
    if (llvm::sys::fs::exists(libdevice))
      return candidate;
  }
  return "";
}

LogicalResult lowerGpuToBinary(ModuleOp module, const GpuTarget &target) {
  std::string toolkit = libdeviceToolkit(target);
  if (toolkit.empty())
    return module.emitError(
        "kernelgen: no CUDA toolkit with nvvm/libdevice/libdevice.10.bc "
        "(looked at $CUDA_HOME, $CUDA_PATH, /usr/local/cuda): the GPU "
        "kernels' exp comes from libdevice");
  PassManager pm(module.getContext());
  GpuNVVMAttachTargetOptions attach;
  attach.chip = target.chip;
  attach.features = target.features;
  attach.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(attach));
  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  kernels.addPass(createSCFToControlFlowPass());
  kernels.addPass(createConvertGpuOpsToNVVMOps());
  kernels.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  binary.toolkitPath = toolkit;
  binary.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(binary));
  if (failed(pm.run(module)))
    return module.emitError("kernelgen: the GPU kernels did not lower to PTX "
                            "for ")
           << target.chip;
  return success();
}

FailureOr<std::string> ptxOf(ModuleOp module) {
  std::string ptx;
  for (auto binary : module.getOps<gpu::BinaryOp>())
    for (Attribute object : binary.getObjects())
      if (auto obj = dyn_cast<gpu::ObjectAttr>(object))
        ptx += obj.getObject().getValue().str();
  if (ptx.empty())
    return module.emitError("kernelgen: no gpu.binary with PTX in the module");
  return ptx;
}

} // namespace ap::kernelgen
