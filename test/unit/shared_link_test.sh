#!/usr/bin/env bash
#===- shared_link_test.sh - unit tests link the shared runtime and kernels -===#
#
# The gtest binaries link libactplace_runtime_shared.so and
# libactplace_kernels_shared.so instead of the archives (test/unit/
# CMakeLists.txt), so the GPU bundle carries one copy of the runtime and the
# kernels, not one per test binary.
#
#   shared_link_test.sh binary BIN LIB [BIN LIB]...
#       BIN names LIB's file name in its NEEDED entries, the loader resolves
#       it to LIB, and BIN defines none of LIB's functions itself (a static
#       copy linked in beside the shared library).
#   shared_link_test.sh bundle DIR
#       an unpacked gpu-check bundle: lib/ holds the runtime and kernels
#       libraries, every binary in bin/ resolves each libactplace library it
#       needs (directly or through another) to DIR/lib/, not to the build
#       tree it was packed from, and starts (--gtest_list_tests); at least
#       one of them links one.
#
#===------------------------------------------------------------------------===#
set -u -o pipefail
fail() { echo "FAIL: $*"; exit 1; }

# needed FILE: the libactplace libraries FILE names in its NEEDED entries.
needed() {
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(libactplace[^]]*\)\].*/\1/p'
}
# resolved FILE: "name path" for every libactplace library the loader finds
# for FILE (ldd lists direct and indirect ones), path made canonical.
resolved() {
  local name arrow path rest
  ldd "$1" | while read -r name arrow path rest; do
    case $name in libactplace*) ;; *) continue ;; esac
    [ "$path" = "not" ] && { echo "$name NOT-FOUND"; continue; }
    echo "$name $(realpath -- "$path")"
  done
}

mode=${1:-}
case $mode in
  binary)
    shift
    [ $# -ge 2 ] && [ $(($# % 2)) -eq 0 ] || fail "usage: shared_link_test.sh binary BIN LIB [BIN LIB]..."
    while [ $# -ge 2 ]; do
      bin=$1 lib=$2; shift 2
      [ -x "$bin" ] || fail "no test binary $bin"
      [ -f "$lib" ] || fail "no shared library $lib"
      name=$(basename "$lib")
      needed "$bin" | grep -qx "$name" ||
        fail "$bin does not link $name (its libactplace NEEDED entries: '$(needed "$bin" | xargs)'): the test binaries must link the shared runtime and kernels"
      got=$(resolved "$bin" | awk -v n="$name" '$1 == n {print $2}')
      [ "$got" = "$(realpath -- "$lib")" ] ||
        fail "$bin resolves $name to '${got:-nothing}', expected $lib"
      # Functions (T) the library defines that the binary defines again: a
      # static copy of the runtime or kernels linked in beside the library.
      both=$(comm -12 \
        <(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | sort -u) \
        <(nm --defined-only "$bin" | awk '$2 == "T" {print $3}' | sort -u) |
        grep -v '^_init$\|^_fini$')
      [ -z "$both" ] ||
        fail "$bin defines $(echo "$both" | wc -l) functions of $name itself (a static copy), e.g. $(echo "$both" | head -3 | xargs)"
      echo "ok: $(basename "$bin") links $name ($got), no copy of its $(nm -D --defined-only "$lib" | awk '$2 == "T"' | wc -l) functions"
    done
    ;;
  bundle)
    [ $# -eq 2 ] || fail "usage: shared_link_test.sh bundle DIR"
    dir=$(cd "$2" 2>/dev/null && pwd -P) || fail "no bundle folder '$2'"
    for name in libactplace_runtime_shared.so libactplace_kernels_shared.so; do
      [ -f "$dir/lib/$name" ] || fail "the bundle has no lib/$name (ls lib: $(ls "$dir/lib" 2>&1 | xargs))"
    done
    # A binary the linker kept no libactplace NEEDED entry in (a CUDA test
    # compiled without CUDA calls no kernel) has nothing to resolve.
    n=0 linked=0
    for bin in "$dir"/bin/*; do
      [ -z "$(needed "$bin")" ] || linked=$((linked + 1))
      while read -r name path; do
        [ "$path" = "$dir/lib/$name" ] ||
          fail "bundled $(basename "$bin") resolves $name to $path, expected $dir/lib/$name"
      done < <(resolved "$bin")
      "$bin" --gtest_list_tests > /dev/null 2>&1 || fail "bundled $bin --gtest_list_tests exited $?"
      n=$((n + 1))
    done
    [ $linked -gt 0 ] || fail "none of the $n binaries in $dir/bin links a libactplace shared library"
    echo "ok: $n bundled test binaries start, the $linked that link the runtime or kernels find them in $dir/lib"
    ;;
  *) fail "usage: shared_link_test.sh binary BIN LIB [BIN LIB]... | bundle DIR" ;;
esac
echo "PASS: shared_link_test.sh $mode"
