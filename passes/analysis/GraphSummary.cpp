//===- GraphSummary.cpp - what a train graph holds ------------------------===//

#include "passes/analysis/GraphSummary.h"

#include "dialect/train/TrainOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace ap::train;

int64_t ap::train::tensorBytes(Type type) {
  // Tensors of the common element types without the ShapedType and
  // FloatType interface lookups: the cost model and the memory timeline
  // ask for every operand and result of every op of thousands of placed
  // clones in the placement search.
  if (auto ranked = dyn_cast<RankedTensorType>(type)) {
    Type element = ranked.getElementType();
    int64_t bytes = element.isBF16() || element.isF16() ? 2
                    : element.isF32()                   ? 4
                                                        : 0;
    if (bytes)
      return ranked.getNumElements() * bytes;
  }
  auto shaped = cast<ShapedType>(type);
  int64_t bits = shaped.getElementTypeBitWidth();
  return shaped.getNumElements() * ((bits + 7) / 8);
}

GraphSummary::GraphSummary(ModuleOp module) {
  if (auto name = module->getAttrOfType<StringAttr>(kModelNameAttrName))
    modelName = name.str();
  if (auto mb = module->getAttrOfType<IntegerAttr>(kMicroBatchesAttrName))
    microBatches = mb.getInt();

  for (auto param : module.getOps<ParamOp>()) {
    ++numParams;
    auto type = cast<ShapedType>(param.getType());
    paramElements += type.getNumElements();
    paramBytes += tensorBytes(type);
    if (param.getFrozen())
      ++numFrozenParams;
    else
      trainableElements += type.getNumElements();
  }

  for (auto func : module.getOps<func::FuncOp>()) {
    for (BlockArgument arg : func.getArguments()) {
      std::string s;
      llvm::raw_string_ostream os(s);
      os << func.getSymName() << " arg" << arg.getArgNumber() << ": "
         << arg.getType();
      inputs.push_back(s);
    }
    func.walk([&](Operation *op) {
      if (op->getDialect() && op->getDialect()->getNamespace() != "train")
        return;
      ++opCounts[op->getName().getStringRef()];
      auto scope = op->getAttrOfType<ScopeAttr>("scope");
      if (!scope)
        return;
      auto &leaves = leavesByLayer[scope.getLayer()];
      if (!llvm::is_contained(leaves, scope.getModule().str()))
        leaves.push_back(scope.getModule().str());
    });
  }
}

void GraphSummary::print(llvm::raw_ostream &os) const {
  os << "model: " << (modelName.empty() ? "(unnamed)" : modelName) << "\n";
  os << "micro-batches per step: " << microBatches << "\n";
  for (const std::string &in : inputs)
    os << "input: " << in << "\n";
  os << llvm::formatv("parameters: {0} tensors ({1} frozen), {2} elements "
                      "({3} trainable), {4:F2} MiB\n",
                      numParams, numFrozenParams, paramElements,
                      trainableElements, paramBytes / (1024.0 * 1024.0));
  int64_t layers =
      llvm::count_if(leavesByLayer, [](auto &kv) { return kv.first >= 0; });
  os << "decoder layers: " << layers << "\n";
  for (const auto &[layer, leaves] : leavesByLayer) {
    os << (layer < 0 ? std::string("model") : "layer " + std::to_string(layer))
       << ":";
    for (const std::string &leaf : leaves)
      os << " " << leaf;
    os << "\n";
  }
  os << "ops:\n";
  for (const auto &[name, count] : opCounts)
    os << "  " << name << ": " << count << "\n";
}
