//===- TrainDialect.td - train dialect definition ----------*- tablegen -*-===//
//
// The train dialect: value-semantics forward (and, after train-autodiff,
// backward) graphs of hybrid GDN / MLA / attention / MLP language models.
// Every compute op carries the module scope placement options select.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TRAIN_DIALECT_TD
#define ACTPLACE_TRAIN_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Train_Dialect : Dialect {
  let name = "train";
  let cppNamespace = "::ap::train";
  let summary = "Training graphs of hybrid GDN / MLA / attention language models";
  let description = [{
    Forward graphs of one microbatch as imported from a model config, in value
    semantics over builtin ranked tensors of bf16, f32 (and i32 for tokens).
    Parameters are module-level `train.param` symbols referenced with
    `train.param_ref`. Every compute op carries a `#train.scope<layer, leaf>`
    naming the decoder layer (-1 for model-level ops) and one leaf module from
    docs/architecture.md section 3; offload and recompute options select these leaves.

    Module attributes: `train.micro_batches` (positive integer, microbatches per
    training step) and `train.model` (a name, for reports).
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  let hasOperationAttrVerify = 1;
}

class Train_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Train_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Train_ScopeAttr : Train_Attr<"Scope", "scope"> {
  let summary = "module scope of an op: decoder layer index and leaf module";
  let description = [{
    `#train.scope<3, gdn_core_attn>`: the op belongs to leaf module
    `gdn_core_attn` of decoder layer 3. Model-level leaves (`embedding`,
    `final_norm`, `lm_head`) use layer -1. The leaf must be one of the names in
    docs/architecture.md section 3.
  }];
  let parameters = (ins "int64_t":$layer, StringRefParameter<"leaf module name">:$module);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def Train_InitKind : I32EnumAttr<"InitKind", "parameter initialisation", [
  I32EnumAttrCase<"Zeros", 0, "zeros">,
  I32EnumAttrCase<"Ones", 1, "ones">,
  I32EnumAttrCase<"Normal", 2, "normal">,
  I32EnumAttrCase<"Uniform", 3, "uniform">,
  I32EnumAttrCase<"LogUniform", 4, "log_uniform">
]> {
  let cppNamespace = "::ap::train";
  let genSpecializedAttr = 0;
}

def Train_InitAttr : Train_Attr<"Init", "init"> {
  let summary = "how a parameter is initialised";
  let description = [{
    `#train.init<zeros>`, `#train.init<ones>`, `#train.init<normal, MEAN, STD>`,
    `#train.init<uniform, LOW, HIGH>` and `#train.init<log_uniform, LOW, HIGH>`
    (log of a uniform sample, used for the GDN A_log). Samples come from the
    runtime's counter-based RNG keyed by seed and parameter, so initialisation
    is reproducible and independent of placement.
  }];
  let parameters = (ins "InitKind":$kind, APFloatParameter<"first value">:$a,
                        APFloatParameter<"second value">:$b);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

#endif // ACTPLACE_TRAIN_DIALECT_TD
