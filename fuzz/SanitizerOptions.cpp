//===- SanitizerOptions.cpp - sanitizer defaults of the fuzz targets ------===//
//
// Linked into every fuzz target; ASAN_OPTIONS / UBSAN_OPTIONS given at run
// time still override these.
//
//===----------------------------------------------------------------------===//

extern "C" {

/// LLVM's BumpPtrAllocator poisons the unused tail of each slab when its
/// header code is compiled with ASan, and unpoisons what it hands out. Our
/// instrumented code and Debian's uninstrumented libMLIR.so share allocators
/// (the StorageUniquer's, the Operation allocator), so a slab poisoned by our
/// copy of the inline code is then written through libMLIR's copy, which
/// never unpoisons: a false use-after-poison on the first model built.
/// Ignoring manual poisoning keeps every real ASan check (heap, stack,
/// globals) and drops only the allocator's.
const char *__asan_default_options() { return "allow_user_poisoning=0"; }

const char *__ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}
}
