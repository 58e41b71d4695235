#===- fuzz/Instrument.cmake - instrument the build for libFuzzer ----------===#
#
# Included from the top level before any target when ACTPLACE_ENABLE_FUZZ is
# on, so every library of the compiler (dialects, passes, importer) gets
# libFuzzer's coverage counters and AddressSanitizer + UndefinedBehavior-
# Sanitizer checks; fuzz/CMakeLists.txt adds the fuzzer runtime to the
# targets only. Debian's libMLIR.so is not instrumented (its code is not
# what we fuzz) and is built against libstdc++, so this build uses libstdc++
# too. Assertions are kept on (-UNDEBUG): an assert in our code or in an
# MLIR header (cast<>, type invariants) is a finding, not undefined
# behaviour that might go unseen. Debug info is line tables only, enough
# for symbolized stacks and much faster to build on 2 cores.
#
#===----------------------------------------------------------------------===#
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "ACTPLACE_ENABLE_FUZZ needs clang (libFuzzer): configure "
    "with CC=clang-22 CXX=clang++-22 (Debian: clang-22 libclang-rt-22-dev); "
    "the C++ compiler is ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER}")
endif()
if(ACTPLACE_ENABLE_CUDA)
  message(FATAL_ERROR "ACTPLACE_ENABLE_FUZZ builds only the compiler: "
    "configure with -DACTPLACE_ENABLE_CUDA=OFF")
endif()
set(ACTPLACE_SANITIZERS "address,undefined")
add_compile_options(
  -fsanitize=fuzzer-no-link,${ACTPLACE_SANITIZERS}
  -fno-sanitize-recover=all
  -fno-omit-frame-pointer
  -gline-tables-only
  -UNDEBUG)
add_link_options(-fsanitize=${ACTPLACE_SANITIZERS})
message(STATUS "actplace: fuzz build (libFuzzer, ASan + UBSan, assertions on)")
