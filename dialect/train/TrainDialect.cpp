//===- TrainDialect.cpp - train dialect -----------------------------------===//

#include "dialect/train/TrainDialect.h"
#include "dialect/train/ModuleNames.h"
#include "dialect/train/TrainOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace ap::train;

#include "dialect/train/TrainDialect.cpp.inc"
#include "dialect/train/TrainEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/train/TrainAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/train/TrainTypes.cpp.inc"

void TrainDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialect/train/TrainAttrs.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialect/train/TrainTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialect/train/TrainOps.cpp.inc"
      >();
}

LogicalResult TrainDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  if (attr.getName() == kMicroBatchesAttrName) {
    auto count = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<ModuleOp>(op))
      return op->emitError()
             << "'" << kMicroBatchesAttrName << "' belongs on the module";
    if (!count || count.getValue().getSExtValue() < 1)
      return op->emitError()
             << "'" << kMicroBatchesAttrName
             << "' must be a positive integer, got " << attr.getValue();
    return success();
  }
  if (attr.getName() == kPipelineStagesAttrName ||
      attr.getName() == kPipelineStageAttrName) {
    auto n = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !n || n.getValue().getSExtValue() < 0)
      return op->emitError() << "'" << attr.getName().getValue()
                             << "' is a module attribute, a non-negative "
                                "integer; got "
                             << attr.getValue();
    return success();
  }
  if (attr.getName() == kPipelineTiedAttrName) {
    auto names = dyn_cast<ArrayAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !names ||
        llvm::any_of(names, [](Attribute a) { return !isa<StringAttr>(a); }))
      return op->emitError() << "'" << kPipelineTiedAttrName
                             << "' is a module attribute, an array of "
                                "parameter names; got "
                             << attr.getValue();
    return success();
  }
  if (attr.getName() == kPipelineLayersAttrName) {
    auto range = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !range || range.size() != 2 || range[0] < 0 ||
        range[1] <= range[0])
      return op->emitError() << "'" << kPipelineLayersAttrName
                             << "' is a module attribute [first, end) of "
                                "decoder layers; got "
                             << attr.getValue();
    return success();
  }
  if (attr.getName() == kTensorParallelAttrName) {
    auto n = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !n || n.getValue().getSExtValue() < 1)
      return op->emitError() << "'" << kTensorParallelAttrName
                             << "' is a module attribute, a positive "
                                "integer; got "
                             << attr.getValue();
    return success();
  }
  if (attr.getName() == kSequenceParallelAttrName) {
    if (!isa<ModuleOp>(op) || !isa<UnitAttr>(attr.getValue()) ||
        tensorParallelSize(op) < 2)
      return op->emitError() << "'" << kSequenceParallelAttrName
                             << "' is a unit module attribute of a module "
                                "with 'train.tensor_parallel' of at least 2";
    return success();
  }
  if (attr.getName() == kModelNameAttrName) {
    if (!isa<StringAttr>(attr.getValue()))
      return op->emitError() << "'" << kModelNameAttrName
                             << "' must be a string, got " << attr.getValue();
    return success();
  }
  if (attr.getName() == kModelConfigAttrName) {
    auto dict = dyn_cast<DictionaryAttr>(attr.getValue());
    if (!dict || !isa<ModuleOp>(op) ||
        llvm::any_of(dict, [](NamedAttribute field) {
          return !isa<StringAttr>(field.getValue());
        }))
      return op->emitError() << "'" << kModelConfigAttrName
                             << "' is a module attribute, a dictionary of "
                                "strings; got "
                             << attr.getValue();
    return success();
  }
  if (attr.getName() == kRecomputedAttrName) {
    if (!isa<UnitAttr>(attr.getValue()) || !op->hasAttr("scope"))
      return op->emitError() << "'" << kRecomputedAttrName
                             << "' is a unit attribute of train compute ops";
    return success();
  }
  if (attr.getName() == kSideStreamAttrName) {
    if (!isa<UnitAttr>(attr.getValue()) || !op->hasAttr(kRecomputedAttrName))
      return op->emitError() << "'" << kSideStreamAttrName
                             << "' is a unit attribute of recompute clones ('"
                             << kRecomputedAttrName << "')";
    return success();
  }
  if (attr.getName() == kSideHostAttrName) {
    if (!isa<UnitAttr>(attr.getValue()) || !op->hasAttr("scope") ||
        op->hasAttr(kRecomputedAttrName))
      return op->emitError() << "'" << kSideHostAttrName
                             << "' is a unit attribute of compute ops that "
                                "are not recompute clones";
    return success();
  }
  if (attr.getName() == kPlacementAttrName) {
    auto entries = dyn_cast<ArrayAttr>(attr.getValue());
    // The decisions are read back as text (the placement report writes
    // them to JSON), so each must be UTF-8.
    if (!entries || entries.size() != op->getNumResults() ||
        !llvm::all_of(entries, [](Attribute a) {
          auto s = dyn_cast<StringAttr>(a);
          return s && llvm::json::isUTF8(s.getValue());
        }))
      return op->emitError()
             << "'" << kPlacementAttrName
             << "' must be an array of one UTF-8 string per result";
    return success();
  }
  if (attr.getName() == kMaxInflightAttrName) {
    auto count = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<MicrobatchLoopOp>(op) || !count || count.getInt() < 1)
      return op->emitError() << "'" << kMaxInflightAttrName
                             << "' is a positive integer on "
                                "train.microbatch_loop";
    return success();
  }
  return op->emitError() << "unknown train dialect attribute '"
                         << attr.getName().getValue() << "'";
}

//===----------------------------------------------------------------------===//
// ScopeAttr
//===----------------------------------------------------------------------===//

Attribute ScopeAttr::parse(AsmParser &parser, Type) {
  int64_t layer = 0;
  std::string module;
  if (parser.parseLess() || parser.parseInteger(layer) || parser.parseComma() ||
      parser.parseKeywordOrString(&module) || parser.parseGreater())
    return {};
  return ScopeAttr::getChecked(
      [&] { return parser.emitError(parser.getNameLoc()); },
      parser.getContext(), layer, module);
}

void ScopeAttr::print(AsmPrinter &printer) const {
  printer << "<" << getLayer() << ", ";
  printer.printKeywordOrString(getModule());
  printer << ">";
}

LogicalResult ScopeAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                int64_t layer, StringRef module) {
  if (!isModuleLeaf(module))
    return emitError() << "unknown module '" << module
                       << "' in scope; expected one of "
                       << knownModuleNamesForDiagnostics();
  if (isModelLevelLeaf(module) && layer != -1)
    return emitError() << "model-level module '" << module
                       << "' must have layer -1, got " << layer;
  if (!isModelLevelLeaf(module) && layer < 0)
    return emitError() << "module '" << module
                       << "' belongs to a decoder layer: expected a layer "
                          "index >= 0, got "
                       << layer;
  return success();
}

//===----------------------------------------------------------------------===//
// InitAttr
//===----------------------------------------------------------------------===//

Attribute InitAttr::parse(AsmParser &parser, Type) {
  std::string kindName;
  double a = 0.0, b = 0.0;
  SMLoc kindLoc = parser.getCurrentLocation();
  if (parser.parseLess() || parser.parseKeywordOrString(&kindName))
    return {};
  std::optional<InitKind> kind = symbolizeInitKind(kindName);
  if (!kind) {
    parser.emitError(kindLoc) << "unknown init kind '" << kindName
                              << "'; expected zeros, ones, normal, uniform or "
                                 "log_uniform";
    return {};
  }
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseFloat(a) || parser.parseComma() || parser.parseFloat(b))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return InitAttr::getChecked(
      [&] { return parser.emitError(parser.getNameLoc()); },
      parser.getContext(), *kind, llvm::APFloat(a), llvm::APFloat(b));
}

void InitAttr::print(AsmPrinter &printer) const {
  printer << "<" << stringifyInitKind(getKind());
  if (getKind() != InitKind::Zeros && getKind() != InitKind::Ones) {
    printer << ", ";
    printer.printFloat(getA());
    printer << ", ";
    printer.printFloat(getB());
  }
  printer << ">";
}

LogicalResult InitAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               InitKind kind, llvm::APFloat aValue,
                               llvm::APFloat bValue) {
  double a = aValue.convertToDouble(), b = bValue.convertToDouble();
  switch (kind) {
  case InitKind::Zeros:
  case InitKind::Ones:
    if (a != 0.0 || b != 0.0)
      return emitError() << stringifyInitKind(kind) << " init takes no values";
    return success();
  case InitKind::Normal:
    if (!(b > 0.0))
      return emitError() << "normal init needs a positive standard deviation, "
                            "got "
                         << b;
    return success();
  case InitKind::Uniform:
    if (!(a < b))
      return emitError() << "uniform init needs low < high, got [" << a << ", "
                         << b << ")";
    return success();
  case InitKind::LogUniform:
    if (!(a > 0.0 && a < b))
      return emitError() << "log_uniform init needs 0 < low < high, got [" << a
                         << ", " << b << ")";
    return success();
  }
  return success();
}

int64_t ap::train::tensorParallelSize(Operation *op) {
  auto module =
      isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  if (!module)
    return 1;
  auto n = module->getAttrOfType<IntegerAttr>(kTensorParallelAttrName);
  return n ? n.getInt() : 1;
}
