// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff -o %t.mlir
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=gdn_norm_out --verify-roundtrip | FileCheck %s --check-prefix=NORM
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=gdn_norm_out -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=NORM-SAVED
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=gdn_prep -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=PREP
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mlp,layernorm -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=MLP
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mla_up_proj -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=MLA
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=core_attn -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=CORE
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=gdn_norm_out '--remarks-filter=actplace.*' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: actplace-opt %t.mlir -train-recompute -o %t.none.mlir && diff %t.mlir %t.none.mlir

// gdn_norm_out: keep o and z, drop the out_proj input; the gated norm (and
// the reshape after it) are cloned right before the first backward use,
// the out_proj weight gradient.
// The original records which of its results are now recomputed (rstd; the
// reshape after it holds the out_proj input).
// NORM: train.gated_rms_norm %[[O:[a-z_0-9]+]], %[[Z:[0-9]+]], {{.*}} scope<0, gdn_norm_out> {eps = {{.*}}, train.placement = ["", "recompute"]} :
// NORM: train.reshape {{.*}} scope<0, gdn_norm_out> {train.placement = ["recompute"]}
// NORM: %[[RN:.*]], %[[RSTD:.*]] = train.gated_rms_norm %[[O]], %[[Z]], {{.*}} scope<0, gdn_norm_out> {eps = {{.*}}, train.recomputed}
// NORM-NEXT: %[[FLAT:.*]] = train.reshape %[[RN]] scope<0, gdn_norm_out> {train.recomputed}
// NORM-NEXT: train.linear_grad %[[FLAT]], {{.*}} scope<0, gdn_out_proj>
// NORM: train.gated_rms_norm_grad %[[O]], %[[Z]], {{.*}}, %[[RSTD]],

// NORM-SAVED-NOT: L0.gdn_norm_out tensor
// NORM-SAVED: #23 train.gated_delta_rule result 0 L0.gdn_core_attn tensor<1x64x4x16xbf16> 8192 bytes {{.*}} needed-by L0.gdn_norm_out
// NORM-SAVED-NOT: L0.gdn_norm_out tensor

// gdn_prep: conv -> SiLU (split into q, k, v) -> L2 norm rebuilt from the saved conv
// input: neither q, k (normalised) nor v of the recurrence stay saved.
// PREP: #5 train.linear result 0 L0.gdn_in_proj tensor<1x64x128xbf16> 16384 bytes
// PREP-NOT: L0.gdn_prep tensor
// PREP-NOT: train.l2_norm
// PREP: #22 train.gdn_gates

// MLP and norms: only the residual stream stays (and the loss' inputs).
// MLP-NOT: mlp_fc1 tensor
// MLP-NOT: mlp_act tensor
// MLP-NOT: L{{[0-9]}}.attn_norm tensor
// MLP: saved activations:
// MLP-NOT: mlp_fc1 tensor
// MLP-NOT: mlp_act tensor

// MLA up projections: keep the latents c_q, c_kv (their norms' outputs) and k_pe.
// MLA-NOT: L4.mla_up_proj tensor
// c_q and c_kv are [1,64,32] bf16 = 4096 bytes, k_pe [1,64,1,8] = 1024.
// MLA: #80 train.rms_norm result 0 L4.qkv_linear tensor<1x64x32xbf16> 4096 bytes {{.*}} needed-by L4.mla_up_proj
// MLA: #92 train.reshape result 0 L4.qkv_linear tensor<1x64x1x8xbf16> 1024 bytes {{.*}} needed-by L4.mla_up_proj
// MLA: #94 train.rms_norm result 0 L4.qkv_linear tensor<1x64x32xbf16> 4096 bytes {{.*}} needed-by L4.mla_up_proj
// MLA-NOT: L4.mla_up_proj tensor

// core_attn: the attention output and LSE are recomputed from Q, K, V.
// CORE-NOT: train.attention result
// CORE: saved activations

// REMARK: remark: [Passed] recompute | Category:actplace-placement:L0.gdn_norm_out | Remark="recomputed train.gated_rms_norm of L0.gdn_norm_out before its first backward use"
