# shellcheck shell=bash disable=SC2154
# Shared by the bench/*.sh scripts (sourced; bash): one-line errors naming the flag or file, exit 2.
# The sourcing script sets `me` (its name, for messages) first.
die() { echo "$me: $*" >&2; exit 2; }
# need "$@" in an option's case branch: the option has a value
need() { [ $# -ge 2 ] || die "$1 needs a value"; }
# posint FLAG VALUE
posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 '$2' is not a positive integer"; }
# need_bin PATH: an executable suanli
need_bin() {
  { [ -x "$1" ] && [ -f "$1" ]; } || die "$1: no such executable (build first: cmake -S . -B build -G Ninja && cmake --build build)"
}
# fail_log LOG CMD...: the failing command and the tail of its output, on stderr (then exit 1)
fail_log() {
  local log=$1; shift
  echo "$me: failed: $*" >&2
  tail -n 20 "$log" >&2
  exit 1
}
