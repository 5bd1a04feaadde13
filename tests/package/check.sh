#!/usr/bin/env bash
# What a user of the installed library meets (ctest's package.* tests, tests/CMakeLists.txt).
#
#   check.sh exports BUILD SRC   libringreduce.so exports the public API and nothing else: every
#                                dynamic symbol it defines is a RINGREDUCE_API function or a member,
#                                typeinfo or vtable of a RINGREDUCE_API class of include/ringreduce
#                                (the list comes from the headers, not from here), and every
#                                RINGREDUCE_API function is exported.
#   check.sh install BUILD SRC   `cmake --install` into a fresh prefix, then, without
#                                LD_LIBRARY_PATH: the installed tools run (--version); a consumer
#                                project built with find_package(ringreduce CONFIG) and one built
#                                with pkg-config (C++ and C) run as 2 ranks under the installed
#                                ringrun; the C++ header refuses C++17 with its own message; the
#                                .pc file follows the prefix when it moves.
# Everything it makes is in one temporary directory, removed on every way out; every command has
# a time limit. Prints "ok: ..." per check and exits non-zero at the first failure.
set -euo pipefail
mode=$1 build=$(realpath "$2") src=$(realpath "$3")
fail() { echo "FAIL: $*" >&2; exit 1; }
unset LD_LIBRARY_PATH

if [ "$mode" = exports ]; then
  hdrs=()
  for h in "$src"/include/ringreduce/*.h; do
    [ "$(basename "$h")" = export.h ] || hdrs+=("$h")  # not the macro's own definition
  done
  classes=$(grep -ohE 'class RINGREDUCE_API [A-Za-z_]+' "${hdrs[@]}" | awk '{print $3}' | sort -u)
  funcs=$(tr '\n' ' ' < <(cat "${hdrs[@]}") | grep -oE 'RINGREDUCE_API [^;{}()]*\(' |
          grep -oE '[A-Za-z_][A-Za-z_0-9]*\($' | tr -d '(' | sort -u)
  [ -n "$classes" ] && [ -n "$funcs" ] || fail "no RINGREDUCE_API names found in $src/include"
  cls=$(paste -sd'|' <<<"$classes") fns=$(paste -sd'|' <<<"$funcs")
  allowed="^(($fns)|ringreduce::($fns)\(.*|ringreduce::($cls)::.*|(typeinfo|typeinfo name|vtable) for ringreduce::($cls))$"
  syms=$(nm -DC --defined-only "$build/libringreduce.so" | cut -d' ' -f3-)
  bad=$(grep -vE "$allowed" <<<"$syms" || true)
  [ -z "$bad" ] || fail "libringreduce.so exports names outside the public API:"$'\n'"$bad"
  for f in $funcs; do
    grep -qE "^(ringreduce::)?$f(\(|$)" <<<"$syms" || fail "public function $f is not exported"
  done
  for c in $classes; do
    grep -qE "^ringreduce::$c::|for ringreduce::$c$" <<<"$syms" || fail "public class $c has no exported symbol"
  done
  echo "ok: $(wc -l <<<"$syms") exported symbols, all public ($(wc -w <<<"$classes") classes, $(wc -w <<<"$funcs") functions)"
  exit 0
fi

[ "$mode" = install ] || fail "usage: check.sh exports|install BUILD SRC"
tmp=$(mktemp -d /tmp/rr-package.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
p=$tmp/prefix
timeout 120 cmake --install "$build" --prefix "$p" >/dev/null || fail "cmake --install"
for tool in ringrun ringreduce-perf ringreduce-store; do
  out=$(timeout 20 "$p/bin/$tool" --version) || fail "$p/bin/$tool --version"
  [[ $out == *0.* ]] || fail "$tool --version printed '$out'"
done
echo "ok: installed tools run without LD_LIBRARY_PATH ($(timeout 20 "$p/bin/ringrun" --version))"

run2() {  # run2 NAME PROGRAM: two ranks under the installed ringrun, both must say "ok"
  local out
  out=$(timeout 60 "$p/bin/ringrun" -n 2 "$2" 2>&1) || fail "$1: ringrun -n 2 $2: $out"
  [ "$(grep -c "consumer ok" <<<"$out")" -eq 2 ] || fail "$1: $out"
  echo "ok: $1 ran on 2 ranks"
}

timeout 120 cmake -S "$src/tests/package/consumer" -B "$tmp/cmake" -G Ninja \
  -DCMAKE_PREFIX_PATH="$p" >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "consumer configure"; }
timeout 300 cmake --build "$tmp/cmake" >>"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "consumer build"; }
run2 "find_package(ringreduce CONFIG), C++" "$tmp/cmake/consumer"
run2 "find_package(ringreduce CONFIG), C" "$tmp/cmake/c_consumer"

pc=$(dirname "$(find "$p" -name ringreduce.pc | head -1)")
export PKG_CONFIG_PATH=$pc
[ "$(pkg-config --modversion ringreduce)" = "$(sed -n 's/.*VERSION_STRING "\(.*\)"/\1/p' "$src/include/ringreduce/version.h")" ] ||
  fail "pkg-config --modversion"
read -ra flags <<<"$(pkg-config --cflags --libs ringreduce)"
rpath=-Wl,-rpath,$(pkg-config --variable=libdir ringreduce)
timeout 300 g++ -std=c++20 "$src/tests/package/consumer/main.cc" "${flags[@]}" "$rpath" -o "$tmp/pc_cxx" ||
  fail "pkg-config C++ build"
timeout 120 gcc "$src/tests/package/consumer/main.c" "${flags[@]}" "$rpath" -o "$tmp/pc_c" || fail "pkg-config C build"
run2 "pkg-config, C++" "$tmp/pc_cxx"
run2 "pkg-config, C" "$tmp/pc_c"

if msg=$(timeout 120 g++ -std=c++17 -fsyntax-only "${flags[@]}" "$src/tests/package/consumer/main.cc" 2>&1); then
  fail "the C++ header compiled as C++17"
fi
grep -q "needs C++20" <<<"$msg" || fail "C++17 gave no clear message: $(head -3 <<<"$msg")"
echo "ok: C++17 is refused with: $(grep -o 'ringreduce.s C++ API needs C++20[^"]*' <<<"$msg" | head -1)"

mv "$p" "$tmp/moved"
export PKG_CONFIG_PATH=${pc/$p/$tmp/moved}
[[ $(pkg-config --variable=libdir ringreduce) == "$tmp/moved/"* ]] || fail "the .pc file does not follow the prefix"
echo "ok: the .pc file follows a moved prefix"
