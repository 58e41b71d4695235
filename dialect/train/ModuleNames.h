//===- ModuleNames.h - module scope leaves and aliases ------------*- C++
//-*-===//
//
// The module names users select placement with (docs/architecture.md section
// 3). Every train op carries one leaf; options accept leaves and aliases. The
// table lives here, apart from MLIR, so the dialect verifier, the placement
// passes and the tools share one definition.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_DIALECT_TRAIN_MODULENAMES_H
#define ACTPLACE_DIALECT_TRAIN_MODULENAMES_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

namespace ap::train {

/// Which part of the model a leaf belongs to.
enum class LeafKind { Shared, Gdn, Attention, Mla, Mlp, Model };

struct ModuleLeaf {
  llvm::StringLiteral name;
  LeafKind kind;
};

/// Every leaf in forward order within its layer kind.
llvm::ArrayRef<ModuleLeaf> moduleLeaves();

/// True if `name` is a leaf.
bool isModuleLeaf(llvm::StringRef name);

/// True for leaves that live outside decoder layers (embedding, final_norm,
/// lm_head): their scope has layer index -1.
bool isModelLevelLeaf(llvm::StringRef name);

/// Expands a leaf or alias (mlp, layernorm, gdn, attn, mla) to leaves.
/// Returns false if `name` is neither.
bool expandModuleName(llvm::StringRef name,
                      llvm::SmallVectorImpl<llvm::StringRef> &leaves);

/// The alias names (mlp, layernorm, gdn, attn, mla), in table order;
/// expandModuleName gives each one's leaves.
llvm::SmallVector<llvm::StringRef> moduleAliasNames();

/// Lower-case name of a leaf kind ("shared", "gdn", "attention", "mla",
/// "mlp", "model"), as tools print it.
llvm::StringRef leafKindName(LeafKind kind);

/// Comma-separated list of every leaf and alias, for diagnostics.
std::string knownModuleNamesForDiagnostics();

} // namespace ap::train

#endif // ACTPLACE_DIALECT_TRAIN_MODULENAMES_H
