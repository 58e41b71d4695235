//===- TrainPlacementOps.td - activation placement ops -----*- tablegen -*-===//
//
// What the placement passes insert (docs/architecture.md section 4). Their position in
// the block is the schedule: `train.offload` right after the producer (the
// D2H is issued there), `train.reload` right after its prefetch anchor (the
// H2D is issued there) and `train.wait` right before the first backward
// consumer (the compute stream waits there). Recomputed ops are clones of
// forward ops placed in backward and marked with the unit attribute
// `train.recomputed`.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TRAIN_PLACEMENT_OPS_TD
#define ACTPLACE_TRAIN_PLACEMENT_OPS_TD

def Train_HostTensorType : TypeDef<Train_Dialect, "HostTensor"> {
  let mnemonic = "host";
  let summary = "a tensor's bytes in a pinned host slot";
  let parameters = (ins "::mlir::RankedTensorType":$tensor);
  let assemblyFormat = "`<` $tensor `>`";
}

def Train_OffloadOp : Train_Op<"offload"> {
  let summary = "copy a saved activation to pinned host memory (D2H on the d2h stream)";
  let description = [{
    The device buffer of `input` may be reused once the copy has completed;
    the slot holds the bytes until the matching reload has read them.

    ```mlir
    %h = train.offload %q scope<0, gdn_core_attn>
        : (tensor<1x64x2x16xbf16>) -> !train.host<tensor<1x64x2x16xbf16>>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_HostTensorType:$host);
  let assemblyFormat = [{
    operands `scope` `` $scope attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Train_ReloadOp : Train_Op<"reload"> {
  let summary = "start the copy back to the device (H2D on the h2d stream)";
  let description = [{
    Issued where it stands (right after its prefetch anchor); always ordered
    after its own offload's D2H. The result may be used only through
    `train.wait`.
  }];
  let arguments = (ins Train_HostTensorType:$host, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let assemblyFormat = [{
    operands `scope` `` $scope attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Train_WaitOp : Train_Op<"wait"> {
  let summary = "the compute stream waits for a reload (the wait anchor)";
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let assemblyFormat = [{
    operands `scope` `` $scope attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // ACTPLACE_TRAIN_PLACEMENT_OPS_TD
