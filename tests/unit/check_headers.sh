#!/usr/bin/env bash
# Every public header compiles on its own, as C11 and (when g++ is present) as C++, has extern "C" guards,
# and is included by the umbrella suanli/suanli.h.
# usage: check_headers.sh INCLUDE_DIR [MORE_INCLUDE_DIRS...]   (the first dir holds suanli/*.h to check;
#        the others are searched too, e.g. the build dir with the generated suanli/version.h)
set -euo pipefail
inc=$1
shift
flags=(-I"$inc")
for d in "$@"; do flags+=(-I"$d"); done
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
headers=("$inc"/suanli/*.h)
for d in "$@"; do
  for h in "$d"/suanli/*.h; do [ -e "$h" ] && headers+=("$h"); done
done
n=0
for h in "${headers[@]}"; do
  name=suanli/$(basename "$h")
  n=$((n + 1))
  printf '#include "%s"\n#include "%s"\nint sl_check_header_main(void) { return 0; }\n' "$name" "$name" >"$tmp/t.c"
  if ! "$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only "${flags[@]}" "$tmp/t.c"; then
    echo "FAIL: $name does not compile alone as C11 (or is not idempotent)"; fail=1
  fi
  if command -v g++ >/dev/null; then
    cp "$tmp/t.c" "$tmp/t.cc"
    if ! g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only "${flags[@]}" "$tmp/t.cc"; then
      echo "FAIL: $name does not compile as C++"; fail=1
    fi
  fi
  if [ "$(basename "$h")" != suanli.h ]; then
    grep -q 'extern "C"' "$h" || { echo "FAIL: $name has no extern \"C\" guard"; fail=1; }
    grep -q "#include \"$name\"" "$inc/suanli/suanli.h" || { echo "FAIL: suanli/suanli.h does not include $name"; fail=1; }
  fi
done
# C++ linkage really is C: a declaration seen through the C++ compiler must name the C symbol
if command -v g++ >/dev/null; then
  printf '#include "suanli/suanli.h"\nconst char *(*p)(void) = sl_version;\n' >"$tmp/l.cc"
  g++ -std=c++17 -c "${flags[@]}" "$tmp/l.cc" -o "$tmp/l.o"
  nm "$tmp/l.o" | grep -q ' U sl_version$' || { echo "FAIL: sl_version has C++ linkage through the headers"; fail=1; }
fi
[ $fail = 0 ] && echo "check_headers: $n headers OK (C11$(command -v g++ >/dev/null && echo ', C++17'))"
exit $fail
