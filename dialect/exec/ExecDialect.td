//===- ExecDialect.td - exec dialect definition ------------*- tablegen -*-===//
//
// The exec dialect: the training step as an explicit schedule (docs/architecture.md
// section 3). Every tensor of the train step is a buffer: a typed view into
// one device arena whose offsets exec-plan-memory fixes. Copies, collectives
// and kernels run on named streams and are ordered by events, which
// exec-schedule-streams inserts. Codegen reads only this dialect.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_EXEC_DIALECT_TD
#define ACTPLACE_EXEC_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Exec_Dialect : Dialect {
  let name = "exec";
  let cppNamespace = "::ap::exec";
  let summary = "Explicit training-step schedule: buffers, streams, events, copies, kernels";
  let description = [{
    A step (`exec.step`) holds persistent buffers (weights, FP32 master
    weights, main grads, Adam moments, step state), one `exec.microbatch_loop`
    whose body is one microbatch's forward and backward, then the gradient
    collectives, finalisation and optimizer calls. Transient buffers of the
    loop body are views into the activation part of the arena; pinned host
    slots come from one pinned pool laid out by the compiler.
  }];
  let useDefaultTypePrinterParser = 1;
}

class Exec_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<Exec_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def Exec_BufferType : Exec_Type<"Buffer", "buffer"> {
  let summary = "a tensor's bytes at some offset of the device arena";
  let parameters = (ins "::mlir::RankedTensorType":$tensor);
  let assemblyFormat = "`<` $tensor `>`";
}

def Exec_HostSlotType : Exec_Type<"HostSlot", "host"> {
  let summary = "a tensor's bytes in a slot of the pinned host pool";
  let parameters = (ins "::mlir::RankedTensorType":$tensor);
  let assemblyFormat = "`<` $tensor `>`";
}

def Exec_EventType : Exec_Type<"Event", "event"> {
  let summary = "a stream event: recorded on one stream, waited on by others";
}

def Exec_Stream : I32EnumAttr<"Stream", "execution stream", [
  I32EnumAttrCase<"Compute", 0, "compute">,
  I32EnumAttrCase<"D2H", 1, "d2h">,
  I32EnumAttrCase<"H2D", 2, "h2d">,
  I32EnumAttrCase<"Comm", 3, "comm">,
  I32EnumAttrCase<"Side", 4, "side">
]> {
  let cppNamespace = "::ap::exec";
}

def Exec_BufferRole : I32EnumAttr<"BufferRole", "role of a persistent buffer", [
  I32EnumAttrCase<"Weight", 0, "weight">,
  I32EnumAttrCase<"Master", 1, "master">,
  I32EnumAttrCase<"MainGrad", 2, "main_grad">,
  I32EnumAttrCase<"AdamM", 3, "adam_m">,
  I32EnumAttrCase<"AdamV", 4, "adam_v">,
  I32EnumAttrCase<"State", 5, "state">,
  // The driver scratch (runtime/abi.h AP_SCRATCH_*): the runtime's scalars,
  // then the GDN gates' dtype staging; one per step.
  I32EnumAttrCase<"Scratch", 6, "scratch">,
  // The LM-head part of a tied weight's gradient, accumulated apart from the
  // embedding part and added to the main grad once per step (so a one-stage
  // step sums it as a pipelined one, whose parts are on different stages).
  I32EnumAttrCase<"TiedGrad", 7, "tied_grad">
]> {
  let cppNamespace = "::ap::exec";
}

#endif // ACTPLACE_EXEC_DIALECT_TD
