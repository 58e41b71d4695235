// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff -train-offload-scopes="offload-modules=gdn_core_attn,core_attn hide-rule=off" -o %t.mlir
// RUN: actplace-opt %t.mlir -train-prefetch-anchors -train-placement-report -o /dev/null | FileCheck %s --check-prefix=COST
// RUN: actplace-opt %t.mlir -train-prefetch-anchors=prefetch-depth=1 -train-placement-report -o /dev/null | FileCheck %s --check-prefix=DEPTH1
// RUN: actplace-opt %t.mlir -train-prefetch-anchors=prefetch-depth=1 --verify-roundtrip -o /dev/null
// RUN: not actplace-opt %t.mlir -train-prefetch-anchors=prefetch-depth=-1 -o /dev/null 2>&1 | FileCheck %s --check-prefix=BAD

// Without the pass every reload sits right before its wait; the cost model
// moves each to the latest backward op that still hides its copy, so the
// prefetch anchor is an earlier compute op and nothing is exposed.
// COST: #{{[0-9]+}} train.l2_norm#0 | L0.gdn_core_attn | 4096 bytes | offload | needed by L0.gdn_core_attn | prefetch after #{{[0-9]+}} train.{{[a-z_]+}} ({{.*}}) | wait before #{{[0-9]+}} train.gated_delta_rule_grad (L0.gdn_core_attn) | copy {{[0-9.]+}} us, exposed 0.0 us
// COST: predicted transfer time per microbatch: hidden {{[0-9.]+}} us, exposed 0.0 us

// The reference rule with depth 1: offloaded scopes in forward order are
// L0.gdn_core_attn, L2.core_attn, L4.core_attn. L0's reloads are issued when
// L2.core_attn's backward (its attention_grad) is done, L2's after L4's, and
// L4's, the last, as soon as backward starts (after the loss and its
// gradient, one op).
// DEPTH1: L0.gdn_core_attn | 32768 bytes | offload | {{.*}} | prefetch after #{{[0-9]+}} train.attention_grad (L2.core_attn) | wait before #{{[0-9]+}} train.gated_delta_rule_grad (L0.gdn_core_attn)
// DEPTH1: L2.qkv_linear | 8192 bytes | offload | needed by L2.core_attn | prefetch after #{{[0-9]+}} train.attention_grad (L4.core_attn) | wait before #{{[0-9]+}} train.attention_grad (L2.core_attn)
// DEPTH1: L4.core_attn | 1024 bytes | offload | needed by L4.core_attn | prefetch after #{{[0-9]+}} train.lm_head_cross_entropy_with_grad (model.lm_head) | wait before #{{[0-9]+}} train.attention_grad (L4.core_attn)

// BAD: error: prefetch-depth must be >= 0 (0 = cost model), got -1

// The LM head's saved input is read by the very first backward op: no
// backward op precedes its wait, so in both modes the reload keeps its place
// between the forward op and the wait (it used to be moved after its own
// consumer, which the verifier rejects: "does not dominate this use").
// (The unfused loss, fuse-loss-grad=false, keeps this case: with the fused
// op the input is read by the first backward op itself, checked below.)
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff=fuse-loss-grad=false -train-placement-pipeline="offload-modules=lm_head hide-rule=off" | FileCheck %s --check-prefix=LMHEAD
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff=fuse-loss-grad=false -train-placement-pipeline="offload-modules=lm_head hide-rule=off prefetch-depth=1" | FileCheck %s --check-prefix=LMHEAD
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff -train-placement-pipeline="offload-modules=lm_head hide-rule=off" | FileCheck %s --check-prefix=FUSED
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff -train-placement-pipeline="offload-modules=lm_head hide-rule=off prefetch-depth=1" | FileCheck %s --check-prefix=FUSED
// FUSED: %[[H:.*]] = train.offload %[[X:.*]] scope<-1, lm_head>
// FUSED-NEXT: %[[R:.*]] = train.reload %[[H]] scope<-1, lm_head>
// FUSED-NEXT: %[[W:.*]] = train.wait %[[R]]
// FUSED-NEXT: train.lm_head_cross_entropy_with_grad %[[W]],
// LMHEAD: %[[H:.*]] = train.offload %[[X:.*]] scope<-1, lm_head>
// LMHEAD: train.lm_head_cross_entropy %[[X]],
// LMHEAD: %[[R:.*]] = train.reload %[[H]] scope<-1, lm_head>
// LMHEAD-NEXT: %[[W:.*]] = train.wait %[[R]]
// LMHEAD: train.lm_head_cross_entropy_grad %[[W]],
