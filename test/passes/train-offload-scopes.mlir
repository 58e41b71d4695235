// RUN: actplace-import %models/tiny-hybrid.json --seq 64 --micro-batches 2 | actplace-opt -train-autodiff -o %t.mlir
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=gdn_core_attn hide-rule=off" --verify-roundtrip | FileCheck %s --check-prefix=GDN
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=gdn_core_attn hide-rule=off" | grep -c "= train.offload" | FileCheck %s --check-prefix=TEN
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=gdn_core_attn hide-rule=off" -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=GDN-SAVED
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=attn_proj hide-rule=off" -o /dev/null '--remarks-filter=actplace.*' 2>&1 | FileCheck %s --check-prefix=SHARED
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=gdn_core_attn,core_attn,attn_proj fraction=0.5 hide-rule=off" -o /dev/null '--remarks-filter=actplace.*' 2>&1 | FileCheck %s --check-prefix=FRACTION
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=gdn_core_attn,core_attn fraction=0" | FileCheck %s --check-prefix=NONE
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=gdn_core_attn,core_attn min-offload-bytes=40000 hide-rule=off" -o /dev/null '--remarks-filter=actplace.*' 2>&1 | FileCheck %s --check-prefix=MINBYTES
// RUN: actplace-opt %t.mlir -train-offload-scopes="offload-modules=mlp_fc1,mlp_norm,attn_norm,qkv_linear hide-rule=off max-inflight=2" | FileCheck %s --check-prefix=MANY
// RUN: actplace-opt %t.mlir -train-offload-scopes -o %t.none.mlir && diff %t.mlir %t.none.mlir

// gdn_core_attn: L2 norm, gates and recurrence read q, k (normalised) + rstd,
// v, the a projection, g, beta, the g cumsum and T: 10 values. Each is
// copied out right after its producer; its backward readers wait on a reload.
// TEN: 10
// GDN: %[[Q:.*]], %[[QR:.*]] = train.l2_norm {{.*}} scope<0, gdn_core_attn>
// GDN-NEXT: %[[HQ:.*]] = train.offload %[[Q]] scope<0, gdn_core_attn> : (tensor<1x64x2x16xbf16>) -> !train.host<tensor<1x64x2x16xbf16>>
// GDN-NEXT: %[[HQR:.*]] = train.offload %[[QR]] scope<0, gdn_core_attn> : (tensor<1x64x2xf32>) -> !train.host<tensor<1x64x2xf32>>
// The recurrence output is read only by the gated norm (gdn_norm_out, not
// selected): no decision; its saved cumulative gates and T leave.
// GDN: train.gated_delta_rule {{.*}} train.placement = ["", "offload", "offload"]
// GDN: %[[RQ:.*]] = train.reload %[[HQ]] scope<0, gdn_core_attn>
// GDN: %[[WQ:.*]] = train.wait %[[RQ]] scope<0, gdn_core_attn>
// GDN: train.gated_delta_rule_grad %[[WQ]],
// GDN: train.l2_norm_grad %[[WQ]],

// 70 saved values without placement (71 with fuse-loss-grad=false, whose
// loss also saves its LSE), 10 left.
// GDN-SAVED: saved activations: 60 values
// GDN-SAVED-NOT: L0.gdn_core_attn tensor<1x64x2x16xbf16>
// GDN-SAVED: #{{[0-9]+}} train.gated_delta_rule result 0 L0.gdn_core_attn tensor<1x64x4x16xbf16> 8192 bytes {{.*}} needed-by L0.gdn_norm_out
// GDN-SAVED-NOT: L0.gdn_core_attn tensor<1x64x4x64xbf16>

// attn_proj alone: the attention output is also read by core_attn, so it
// stays; the projection input and the gate leave.
// SHARED-DAG: remark: [Passed] offload | Category:actplace-placement:L2.attn_proj | Remark="offloaded 8192 bytes of train.reshape (L2.attn_proj)"
// SHARED-DAG: remark: [Passed] offload | Category:actplace-placement:L2.attn_proj | Remark="offloaded 8192 bytes of train.slice (L2.attn_proj)"

// Five eligible scopes in forward order: L0.gdn_core_attn, L2.core_attn,
// L2.attn_proj, L4.core_attn, L4.attn_proj; fraction 0.5 offloads ceil(2.5) = 3.
// FRACTION-DAG: remark: [Missed] offload | Category:actplace-placement:L4.attn_proj | Remark="L4.attn_proj stays on the device: beyond fraction=0.50: only the first 3 of 5 eligible scopes offload"
// FRACTION-DAG: remark: [Missed] offload | Category:actplace-placement:L4.core_attn | Remark="L4.core_attn stays on the device: beyond fraction=0.50: only the first 3 of 5 eligible scopes offload"
// FRACTION-DAG: Category:actplace-placement:L2.attn_proj | Remark="offloaded
// FRACTION-DAG: Category:actplace-placement:L2.core_attn | Remark="offloaded
// FRACTION-DAG: Category:actplace-placement:L0.gdn_core_attn | Remark="offloaded

// NONE-NOT: train.offload

// L2.core_attn (gated GQA) holds Q [1,64,4,16] bf16 = 8192, K and V
// [1,64,2,16] = 4096 each and the LSE [1,4,64] f32 = 1024: 17408 bytes (its
// output O is shared with attn_proj, not selected, so it stays anyway).
// L0.gdn_core_attn (52224 bytes) and L4.core_attn (MLA, wider Q/K) pass.
// MINBYTES-DAG: remark: [Missed] offload | Category:actplace-placement:L2.core_attn | Remark="L2.core_attn stays on the device: 17408 offloadable bytes < min-offload-bytes=40000"
// MINBYTES-DAG: Category:actplace-placement:L4.core_attn | Remark="offloaded
// MINBYTES-DAG: Category:actplace-placement:L0.gdn_core_attn | Remark="offloaded
// MINBYTES-NOT: Category:actplace-placement:L2.core_attn | Remark="offloaded

// MANY: train.microbatch_loop %{{.*}}, %{{.*}} {train.max_inflight = 2 : i64}
// MANY: train.offload {{.*}} scope<0, attn_norm>
// MANY: train.offload {{.*}} scope<1, mlp_norm>
// MANY: train.offload {{.*}} scope<1, mlp_fc1>

// Composition with recompute: c_q, c_kv and k_pe feed only the recomputed
// MLA up projections, so offloading qkv_linear moves them too; each is
// reloaded and waited on before the recomputed op that reads it.
// RUN: actplace-opt %t.mlir -train-recompute=recompute-modules=mla_up_proj -train-offload-scopes="offload-modules=qkv_linear recompute-modules=mla_up_proj hide-rule=off" --verify-roundtrip | FileCheck %s --check-prefix=COMPOSE
// COMPOSE: %[[CQ:.*]], %{{.*}} = train.rms_norm {{.*}} scope<4, qkv_linear> {{.*}}train.placement = ["offload", "offload"]
// COMPOSE-NEXT: %[[HCQ:.*]] = train.offload %[[CQ]] scope<4, qkv_linear>
// COMPOSE: %[[RCQ:.*]] = train.reload %[[HCQ]] scope<4, qkv_linear>
// COMPOSE-NEXT: %[[WCQ:.*]] = train.wait %[[RCQ]] scope<4, qkv_linear>
// COMPOSE-NEXT: train.linear %[[WCQ]], {{.*}} scope<4, mla_up_proj> {train.recomputed}
