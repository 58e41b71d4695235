// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff -o %t.mlir
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_act -train-fuse-recompute --verify-roundtrip | FileCheck %s --check-prefix=FUSED
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_act -train-fuse-recompute -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=SAVED
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_act -train-fuse-recompute=fuse-recompute=false | FileCheck %s --check-prefix=CLONE
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_act -train-fuse-recompute '--remarks-filter=actplace.*' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// Nothing recomputed: a kept SwiGLU stays as it is.
// RUN: actplace-opt %t.mlir -train-fuse-recompute -o %t.kept.mlir && diff %t.mlir %t.kept.mlir
// A frozen down projection has no weight gradient: nothing reads the
// activation, so the backward does not write it.
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 --freeze=model.layers.1.mlp.down_proj | actplace-opt -train-autodiff -train-recompute=recompute-modules=mlp_act -train-fuse-recompute | FileCheck %s --check-prefix=FROZEN
// RMSNorm: the norm backward writes the projections' input from the
// forward's saved rstd (kept again), and their dW follow it. When the
// projections are recomputed too, their clones read the norm's clone: no
// fusion.
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_norm -train-fuse-recompute --verify-roundtrip | FileCheck %s --check-prefix=NORM
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_norm -train-fuse-recompute -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=NORM-SAVED
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp_norm,mlp_fc1 -train-fuse-recompute | FileCheck %s --check-prefix=NORM-FC1

// Gated RMSNorm (gdn_norm_out): the backward writes the out projection's
// input (through the reshape to [.., H d]) from the saved rstd.
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=gdn_norm_out -train-fuse-recompute --verify-roundtrip | FileCheck %s --check-prefix=GATED
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=gdn_norm_out -train-fuse-recompute -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=GATED-SAVED

// The report undoes the fusion for its "before" step: the unplaced peaks
// are the same as with the clone, and the fused op is charged to the scope.
// RUN: actplace-opt %t.mlir '-train-placement-pipeline=recompute-modules=mlp_act,layernorm,gdn_norm_out report=true report-file=%t.fused.txt' -o /dev/null
// RUN: actplace-opt %t.mlir '-train-placement-pipeline=recompute-modules=mlp_act,layernorm,gdn_norm_out fuse-recompute=false report=true report-file=%t.clone.txt' -o /dev/null
// RUN: grep -o "peak: [0-9]* ->" %t.fused.txt > %t.fused.before
// RUN: grep -o "peak: [0-9]* ->" %t.clone.txt | diff - %t.fused.before
// RUN: FileCheck %s --check-prefix=REPORT < %t.fused.txt

// REPORT: recompute L0.gdn_norm_out: 1 ops, {{[0-9.]+}} us per microbatch, {{[0-9]+}} bytes spared
// REPORT: recompute L1.mlp_norm: 1 ops, {{[0-9.]+}} us per microbatch, {{[0-9]+}} bytes spared
// REPORT: recompute L1.mlp_act: 1 ops, {{[0-9.]+}} us per microbatch, 16384 bytes spared

// The forward SwiGLU is recorded as recomputed; in backward, dx of the down
// projection first (without reading the activation), then the SwiGLU
// backward that also writes the activation, then dW from it.
// FUSED: %[[ACT:[0-9]+]] = train.swiglu %[[G:[0-9]+]], %[[U:[0-9]+]] scope<1, mlp_act> {train.placement = ["recompute"]}
// FUSED: train.linear %[[ACT]], %[[W:[0-9]+]] scope<1, mlp_fc2>
// FUSED: %[[DA:[0-9]+]] = train.linear_input_grad %[[W]], %[[DY:[0-9]+]] scope<1, mlp_fc2> :
// FUSED-NEXT: %{{.*}}, %{{.*}}, %[[OUT:.*]] = train.swiglu_grad %[[G]], %[[U]], %[[DA]] scope<1, mlp_act> :
// FUSED-SAME: -> (tensor<1x64x128xbf16>, tensor<1x64x128xbf16>, tensor<1x64x128xbf16>)
// FUSED-NEXT: train.linear_grad %[[OUT]], %[[W]], %[[DY]] scope<1, mlp_fc2> {weight_grad = @model.layers.1.mlp.down_proj.weight} : {{.*}} -> ()
// FUSED-NOT: train.recomputed

// SAVED-NOT: mlp_act tensor
// SAVED: saved activations:
// SAVED-NOT: mlp_act tensor

// CLONE: train.swiglu {{.*}} scope<1, mlp_act> {train.recomputed}
// CLONE-NEXT: train.linear_grad
// CLONE-NOT: train.linear_input_grad

// REMARK-COUNT-3: {{^.*}}.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: [Passed] fuse-recompute | Category:actplace-placement:L{{[135]}}.mlp_act | Remark="recomputed train.swiglu of L{{[135]}}.mlp_act inside its train.swiglu_grad; the weight gradients of the linears that read it follow it"{{$}}

// Backward runs layer 3 (trainable) before layer 1 (frozen).
// FROZEN: train.linear_input_grad {{.*}} scope<3, mlp_fc2>
// FROZEN-NEXT: train.swiglu_grad {{.*}} -> (tensor<1x64x128xbf16>, tensor<1x64x128xbf16>, tensor<1x64x128xbf16>)
// FROZEN-NEXT: train.linear_grad {{.*}} scope<3, mlp_fc2>
// FROZEN: %[[DA:[0-9]+]] = train.linear_input_grad {{.*}} scope<1, mlp_fc2>
// FROZEN-NEXT: train.swiglu_grad %{{.*}}, %{{.*}}, %[[DA]] scope<1, mlp_act> : {{.*}} -> (tensor<1x64x128xbf16>, tensor<1x64x128xbf16>){{$}}
// FROZEN-NOT: train.linear_grad {{.*}} scope<1, mlp_fc2>

// NORM: %[[Y:[a-z_0-9]+]], %[[RSTD:[a-z_0-9]+]] = train.rms_norm %[[X:[0-9]+]], %[[W:[0-9]+]] scope<1, mlp_norm> {eps = {{.*}}, train.placement = ["recompute", "keep: read by the fused recompute"], zero_centered}
// NORM: train.linear %[[Y]], %[[WG:[0-9]+]] scope<1, mlp_fc1>
// NORM: train.linear %[[Y]], %[[WU:[0-9]+]] scope<1, mlp_fc1>
// NORM: %[[DU:[0-9]+]] = train.linear_input_grad %[[WU]], %[[GU:[a-z_0-9]+]] scope<1, mlp_fc1>
// NORM-NEXT: %[[DG:[0-9]+]] = train.linear_input_grad %[[WG]], %[[GG:[a-z_0-9]+]] scope<1, mlp_fc1>
// NORM-NEXT: %[[SUM:[0-9]+]] = train.add %[[DU]], %[[DG]] scope<1, mlp_norm>
// NORM-NEXT: %{{.*}}, %[[OUT:[a-z_0-9]+]] = train.rms_norm_grad_rebuild %[[X]], %[[W]], %[[RSTD]], %[[SUM]] scope<1, mlp_norm> {weight_grad = @model.layers.1.input_layernorm.weight, zero_centered}
// NORM-NEXT: train.linear_grad %[[OUT]], %[[WG]], %[[GG]] scope<1, mlp_fc1> {weight_grad = @model.layers.1.mlp.gate_proj.weight} : {{.*}} -> ()
// NORM-NEXT: train.linear_grad %[[OUT]], %[[WU]], %[[GU]] scope<1, mlp_fc1> {weight_grad = @model.layers.1.mlp.up_proj.weight} : {{.*}} -> ()
// NORM-NOT: train.recomputed

// Only the norm's rstd (a float per row) stays saved of mlp_norm.
// NORM-SAVED: train.rms_norm result 1 L1.mlp_norm tensor<1x64xf32> 256 bytes
// NORM-SAVED-NOT: train.rms_norm result 0 L{{[0-9]}}.mlp_norm

// NORM-FC1-NOT: train.rms_norm_grad_rebuild
// NORM-FC1: train.rms_norm {{.*}} scope<1, mlp_norm> {eps = {{.*}}, train.recomputed
// NORM-FC1-NOT: train.rms_norm_grad_rebuild

// GATED: %[[Y:[a-z_0-9]+]], %[[RSTD:[a-z_0-9]+]] = train.gated_rms_norm %[[O:[a-z_0-9]+]], %[[Z:[0-9]+]], %[[W:[0-9]+]] scope<0, gdn_norm_out> {eps = {{.*}}, train.placement = ["", "keep: read by the fused recompute"]}
// GATED: %[[DX:[0-9]+]] = train.linear_input_grad %[[WO:[0-9]+]], %[[DY:[a-z_0-9]+]] scope<0, gdn_out_proj>
// GATED: %{{.*}}, %{{.*}}, %[[OUT:[a-z_0-9]+]] = train.gated_rms_norm_grad %[[O]], %[[Z]], %[[W]], %[[RSTD]], %{{.*}} scope<0, gdn_norm_out>
// GATED-NEXT: %[[FLAT:[0-9]+]] = train.reshape %[[OUT]] scope<0, gdn_norm_out> :
// GATED-NEXT: train.linear_grad %[[FLAT]], %[[WO]], %[[DY]] scope<0, gdn_out_proj> {weight_grad = @model.layers.0.linear_attn.out_proj.weight} : {{.*}} -> ()
// GATED-NOT: train.recomputed

// GATED-SAVED: train.gated_rms_norm result 1 L0.gdn_norm_out tensor<1x64x4xf32>
// GATED-SAVED-NOT: train.gated_rms_norm result 0
// GATED-SAVED-NOT: train.reshape {{.*}} L0.gdn_norm_out
