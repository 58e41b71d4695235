//===- actplace-kernelgen.cpp - generated kernels, standalone
//--------------===//
//
// Prints the generated element-wise and row-wise kernels (kernelgen/) at one
// stage: the host MLIR, the GPU MLIR, the host LLVM IR or the PTX for sm_90a.
// For lit tests and for reading what the generator emits; the compiler does
// not call it.
//
//===----------------------------------------------------------------------===//
#include "kernelgen/KernelGen.h"
#include "support/ToolVersion.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;
namespace kg = ap::kernelgen;

static cl::OptionCategory category("actplace-kernelgen options");

static cl::list<std::string>
    groups("group", cl::CommaSeparated, cl::OneOrMore,
           cl::desc("Op groups to generate, comma separated: swiglu-fwd, "
                    "swiglu-bwd, residual-add, rmsnorm-fwd, rmsnorm-bwd, "
                    "add-rmsnorm-fwd, adamw, sigmoid-gate-fwd, "
                    "sigmoid-gate-bwd, l2norm-fwd, l2norm-bwd, "
                    "gated-norm-fwd, gated-norm-bwd, gdn-gates-fwd, "
                    "gdn-gates-bwd, rope-fwd, rope-bwd, or all"),
           cl::cat(category));
static cl::opt<std::string>
    dtype("dtype", cl::init("bf16"),
          cl::desc("Storage type of activations and of the AdamW main grad: "
                   "bf16 or f32"),
          cl::cat(category));
static cl::opt<std::string>
    emit("emit", cl::init("ptx"),
         cl::desc("What to print: mlir (host kernels before lowering), "
                  "gpu-mlir (GPU kernels before lowering), llvm (host LLVM "
                  "IR), ptx (PTX text)"),
         cl::cat(category));
static cl::opt<bool> recomputeY(
    "recompute-y", cl::init(false),
    cl::desc("swiglu-bwd and rmsnorm-bwd also write the recomputed forward "
             "output"),
    cl::cat(category));
static cl::opt<bool> noDw("rmsnorm-no-dw", cl::init(false),
                          cl::desc("rmsnorm-bwd without the weight gradient"),
                          cl::cat(category));
static cl::opt<bool> addResidual(
    "rmsnorm-add", cl::init(false),
    cl::desc("rmsnorm-bwd fused with the residual add that reads its dx "
             "(dx = round(dx) + res)"),
    cl::cat(category));
static cl::opt<int> dyAddends(
    "rmsnorm-dy-addends", cl::init(1),
    cl::desc("rmsnorm-bwd whose dy is the sum of this many addends (1 to 4: "
             "a chain of residual adds formed where dy is read, each sum "
             "rounded to storage as the add stores it)"),
    cl::cat(category));
static cl::opt<bool> rowInRegisters(
    "row-in-registers", cl::init(false),
    cl::desc("With --rows-per-warp=1: a row of at most 4 chunks a lane is "
             "read once and kept in registers for both passes (kernel "
             "suffix _k); rmsnorm-bwd and gated-norm-bwd with dw: rows of at "
             "most one chunk a lane read once, two a warp at a time, the dw "
             "partials in registers"),
    cl::cat(category));
static cl::opt<int> rowsPerWarp(
    "rows-per-warp", cl::init(1),
    cl::desc("Rows a GPU warp takes in the row-wise groups with independent "
             "rows (rmsnorm-fwd, add-rmsnorm-fwd, l2norm-fwd/bwd, "
             "gated-norm-fwd): 1, 2 or 4"),
    cl::cat(category));
static cl::opt<bool>
    plainNorm("rmsnorm-plain", cl::init(false),
              cl::desc("rmsnorm-fwd/bwd scale by w instead of (1 + w)"),
              cl::cat(category));
static cl::opt<std::string>
    adamwCopy("adamw-copy", cl::init("bf16"),
              cl::desc("AdamW compute copy: bf16, f32 or none"),
              cl::cat(category));
static cl::opt<std::string> chip("chip", cl::init("sm_90a"),
                                 cl::desc("GPU target of --emit=ptx"),
                                 cl::cat(category));
static cl::opt<std::string> features("features", cl::init("+ptx80"),
                                     cl::desc("PTX features of --emit=ptx"),
                                     cl::cat(category));
static cl::opt<std::string> output("o", cl::init("-"),
                                   cl::desc("Output file (- for stdout)"),
                                   cl::value_desc("file"), cl::cat(category));

static std::optional<kg::ElemType> parseType(StringRef s) {
  if (s == "bf16")
    return kg::ElemType::BF16;
  if (s == "f32")
    return kg::ElemType::F32;
  return std::nullopt;
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  ap::setToolVersionPrinter("actplace-kernelgen");
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "actplace-kernelgen: generated element-wise and row-wise kernels, as "
      "host MLIR/LLVM IR or as PTX\n");

  std::optional<kg::ElemType> type = parseType(dtype);
  if (!type) {
    errs() << "actplace-kernelgen: unknown --dtype '" << dtype
           << "' (expected bf16 or f32)\n";
    return 1;
  }
  std::optional<kg::ElemType> copyType;
  if (adamwCopy != "none") {
    copyType = parseType(adamwCopy);
    if (!copyType) {
      errs() << "actplace-kernelgen: unknown --adamw-copy '" << adamwCopy
             << "' (expected bf16, f32 or none)\n";
      return 1;
    }
  }
  if (dyAddends < 1 || dyAddends > kg::kMaxDyAddends) {
    errs() << "actplace-kernelgen: --rmsnorm-dy-addends " << dyAddends
           << " is not 1 to " << kg::kMaxDyAddends << "\n";
    return 1;
  }
  if (rowsPerWarp != 1 && rowsPerWarp != 2 && rowsPerWarp != 4) {
    errs() << "actplace-kernelgen: --rows-per-warp " << rowsPerWarp
           << " (expected 1, 2 or 4)\n";
    return 1;
  }
  if (emit != "mlir" && emit != "gpu-mlir" && emit != "llvm" && emit != "ptx") {
    errs() << "actplace-kernelgen: unknown --emit '" << emit
           << "' (expected mlir, gpu-mlir, llvm or ptx)\n";
    return 1;
  }

  SmallVector<std::string> names;
  for (const std::string &g : groups) {
    if (g == "all") {
      // Every group, in the order groupKindNames lists them.
      SmallVector<StringRef> all;
      StringRef(kg::groupKindNames()).split(all, ", ");
      for (StringRef name : all)
        names.push_back(name.str());
    } else
      names.push_back(g);
  }
  SmallVector<kg::GroupSpec> specs;
  for (const std::string &name : names) {
    std::optional<kg::GroupKind> kind = kg::parseGroupKind(name);
    if (!kind) {
      errs() << "actplace-kernelgen: unknown --group '" << name
             << "' (expected one of " << kg::groupKindNames() << ", all)\n";
      return 1;
    }
    kg::GroupSpec spec;
    spec.kind = *kind;
    spec.dtype = *type;
    spec.recomputeY = recomputeY;
    spec.zeroCentered = !plainNorm;
    spec.computeCopy = copyType;
    spec.accumulateDw = !noDw;
    spec.addResidual =
        addResidual && spec.kind == kg::GroupKind::RmsNormBackward;
    if (spec.kind == kg::GroupKind::RmsNormBackward)
      spec.dyAddends = dyAddends;
    if (kg::hasRowsPerWarp(spec.kind))
      spec.rowsPerWarp = rowsPerWarp;
    if (kg::hasRowsPerWarp(spec.kind))
      spec.rowInRegisters = rowInRegisters && rowsPerWarp == 1;
    if (kg::hasDwRowInRegisters(spec.kind))
      spec.rowInRegisters = rowInRegisters && spec.accumulateDw;
    specs.push_back(spec);
  }

  mlir::DialectRegistry registry;
  kg::registerKernelGenDialects(registry);
  mlir::MLIRContext context(registry);

  std::string error;
  auto out = mlir::openOutputFile(output, &error);
  if (!out) {
    errs() << "actplace-kernelgen: cannot open " << output << ": " << error
           << "\n";
    return 1;
  }
  raw_ostream &os = out->os();
  if (emit == "mlir" || emit == "llvm") {
    auto module = kg::buildHostModule(context, specs);
    if (emit == "mlir") {
      module->print(os);
    } else {
      if (mlir::failed(kg::lowerHostToLLVM(*module)))
        return 1;
      auto ir = kg::hostLLVMIR(*module);
      if (mlir::failed(ir))
        return 1;
      os << *ir;
    }
  } else {
    auto module = kg::buildGpuModule(context, specs);
    if (emit == "gpu-mlir") {
      module->print(os);
    } else {
      kg::GpuTarget target;
      target.chip = chip;
      target.features = features;
      if (mlir::failed(kg::lowerGpuToBinary(*module, target)))
        return 1;
      auto ptx = kg::ptxOf(*module);
      if (mlir::failed(ptx))
        return 1;
      os << *ptx;
    }
  }
  out->keep();
  return 0;
}
