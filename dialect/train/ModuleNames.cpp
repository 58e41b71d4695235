//===- ModuleNames.cpp - module scope leaves and aliases ------------------===//

#include "dialect/train/ModuleNames.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/ErrorHandling.h"

#include <string>

using namespace ap::train;

// Megatron's names where it has one, so users can carry their option lists
// over unchanged.
static const ModuleLeaf kLeaves[] = {
    {"attn_norm", LeafKind::Shared},     {"gdn_in_proj", LeafKind::Gdn},
    {"gdn_prep", LeafKind::Gdn},         {"gdn_core_attn", LeafKind::Gdn},
    {"gdn_norm_out", LeafKind::Gdn},     {"gdn_out_proj", LeafKind::Gdn},
    {"qkv_linear", LeafKind::Attention}, {"mla_up_proj", LeafKind::Mla},
    {"core_attn", LeafKind::Attention},  {"attn_proj", LeafKind::Attention},
    {"mlp_norm", LeafKind::Mlp},         {"mlp_fc1", LeafKind::Mlp},
    {"mlp_act", LeafKind::Mlp},          {"mlp_fc2", LeafKind::Mlp},
    {"embedding", LeafKind::Model},      {"final_norm", LeafKind::Model},
    {"lm_head", LeafKind::Model},
};

struct ModuleAlias {
  llvm::StringLiteral name;
  llvm::ArrayRef<llvm::StringLiteral> leaves;
};

static const llvm::StringLiteral kMlp[] = {"mlp_fc1", "mlp_act", "mlp_fc2"};
static const llvm::StringLiteral kLayernorm[] = {"attn_norm", "mlp_norm",
                                                 "final_norm"};
static const llvm::StringLiteral kGdn[] = {"attn_norm",    "gdn_in_proj",
                                           "gdn_prep",     "gdn_core_attn",
                                           "gdn_norm_out", "gdn_out_proj"};
static const llvm::StringLiteral kAttn[] = {"attn_norm", "qkv_linear",
                                            "core_attn", "attn_proj"};
static const llvm::StringLiteral kMla[] = {
    "attn_norm", "qkv_linear", "mla_up_proj", "core_attn", "attn_proj"};

static const ModuleAlias kAliases[] = {
    {"mlp", kMlp}, {"layernorm", kLayernorm}, {"gdn", kGdn}, {"attn", kAttn},
    {"mla", kMla},
};

llvm::ArrayRef<ModuleLeaf> ap::train::moduleLeaves() { return kLeaves; }

bool ap::train::isModuleLeaf(llvm::StringRef name) {
  return llvm::any_of(kLeaves,
                      [&](const ModuleLeaf &l) { return l.name == name; });
}

bool ap::train::isModelLevelLeaf(llvm::StringRef name) {
  return llvm::any_of(kLeaves, [&](const ModuleLeaf &l) {
    return l.name == name && l.kind == LeafKind::Model;
  });
}

bool ap::train::expandModuleName(
    llvm::StringRef name, llvm::SmallVectorImpl<llvm::StringRef> &leaves) {
  if (isModuleLeaf(name)) {
    leaves.push_back(name);
    return true;
  }
  for (const ModuleAlias &alias : kAliases) {
    if (alias.name != name)
      continue;
    for (llvm::StringLiteral leaf : alias.leaves)
      leaves.push_back(leaf);
    return true;
  }
  return false;
}

llvm::SmallVector<llvm::StringRef> ap::train::moduleAliasNames() {
  llvm::SmallVector<llvm::StringRef> names;
  for (const ModuleAlias &a : kAliases)
    names.push_back(a.name);
  return names;
}

llvm::StringRef ap::train::leafKindName(LeafKind kind) {
  switch (kind) {
  case LeafKind::Shared:
    return "shared";
  case LeafKind::Gdn:
    return "gdn";
  case LeafKind::Attention:
    return "attention";
  case LeafKind::Mla:
    return "mla";
  case LeafKind::Mlp:
    return "mlp";
  case LeafKind::Model:
    return "model";
  }
  llvm_unreachable("unknown LeafKind");
}

std::string ap::train::knownModuleNamesForDiagnostics() {
  std::string out;
  for (const ModuleLeaf &l : kLeaves) {
    if (!out.empty())
      out += ", ";
    out += l.name.str();
  }
  out += " (aliases:";
  for (const ModuleAlias &a : kAliases)
    out += " " + a.name.str();
  out += ")";
  return out;
}
