#!/usr/bin/env bash
# scripts/check_layers.sh [ROOT] — includes point down the layer graph only (DESIGN.md section 1).
#
# Every src/<folder> and every include/suanli/*.h belongs to one layer (tables below). For each .c/.h/.inc
# under ROOT/src and ROOT/include it reads the `#include "suanli/X.h"`, `#include "<folder>/..."` and
# relative `#include "x.h"` lines and fails (exit 1, one line per violation: file, included header, both
# layers) when the included layer is not the file's own layer nor one it may depend on (directly or through
# the layers below it), unless the pair is in ALLOW (permanent, with a reason) or KNOWN (temporary). An
# unmapped folder or public header is an error too, so the tables stay complete. KNOWN entries still present
# are printed as warnings; entries that no longer match anything are reported so they get removed.
# Exit status: 0 clean (warnings allowed), 1 violations, 2 usage error.
set -euo pipefail

# ---- layers: "layer: the layers it may include" (transitively: "X and below"; `*` = any) -------------------
LAYERS='
base:
comm:      base
device:    base
ops:       device base
graph:     ops device base
data:      base
formats:   base
nn:        formats data graph
plan:      nn
optim:     nn
parallel:  optim comm
ckpt:      parallel formats
launch:    ckpt comm base
train:     parallel ckpt nn data
cli:       *
'

# ---- src/<folder> -> layer ("folder: layer"; a folder named like a layer needs no line) ---------------------
FOLDERS='
'

# ---- include/suanli/<header> -> layer ----------------------------------------------------------------------
HEADERS='
base.h:          base
version.h:       base
suanli.h:        cli
comm.h:          comm
device.h:        device
tensor.h:        device
ops.h:           ops
graph.h:         graph
data.h:          data
safetensors.h:   formats
hf.h:            formats
nn.h:            nn
optim.h:         optim
model_io.h:      nn
hf_gpt2.h:       nn
parallel.h:      parallel
ckpt.h:          ckpt
train.h:         train
plan.h:          plan
ckpt_trainer.h:  train
metrics.h:       train
'

# ---- ALLOW: permanent exceptions, "layer -> included header   # reason" --------------------------------------
ALLOW='
formats -> suanli/tensor.h   # the tensor types (sl_dtype) live in the device layer after the graph.h split
'

# ---- KNOWN: violations to fix, "file-glob -> included header   # who removes the entry" -----------------------
# Each entry must be removed by whoever fixes it; the script warns while one is still present.
KNOWN='
'

root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
[ -d "$root/src" ] || {
    echo "check_layers: $root/src: no such directory" >&2
    exit 2
}
export CL_ROOT="$root" CL_LAYERS="$LAYERS" CL_FOLDERS="$FOLDERS" CL_HEADERS="$HEADERS" CL_ALLOW="$ALLOW" CL_KNOWN="$KNOWN"
exec python3 - <<'PY'
import fnmatch, os, re, sys

root = os.environ["CL_ROOT"]


def rows(name):
    out = []
    for line in os.environ[name].splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


deps = {}
for r in rows("CL_LAYERS"):
    k, _, v = r.partition(":")
    deps[k.strip()] = v.split()
folders = {k.strip(): v.strip() for k, _, v in (r.partition(":") for r in rows("CL_FOLDERS"))}
headers = {k.strip(): v.strip() for k, _, v in (r.partition(":") for r in rows("CL_HEADERS"))}
allow = [tuple(s.strip() for s in r.split("->")) for r in rows("CL_ALLOW")]
known = [tuple(s.strip() for s in r.split("->")) for r in rows("CL_KNOWN")]
bad_table = [l for l in set(folders.values()) | set(headers.values()) if l not in deps]
bad_table += [d for ds in deps.values() for d in ds if d != "*" and d not in deps]
if bad_table:
    sys.exit("check_layers: tables name unknown layers: " + ", ".join(sorted(set(bad_table))))


def below(layer, seen=None):
    """layers `layer` may include (transitive), not counting itself"""
    seen = set() if seen is None else seen
    for d in deps[layer]:
        if d == "*":
            return set(deps)
        if d not in seen:
            seen.add(d)
            below(d, seen)
    return seen


reach = {l: below(l) for l in deps}
errors, warnings, used_known = [], [], set()


def folder_layer(folder):
    l = folders.get(folder, folder if folder in deps else None)
    if l is None:
        errors.append(f"src/{folder}: folder has no layer: add it to FOLDERS in scripts/check_layers.sh")
    return l


def header_layer(name, where):
    l = headers.get(name)
    if l is None:
        errors.append(f"{where}: public header suanli/{name} has no layer: add it to HEADERS in scripts/check_layers.sh")
    return l


def layer_of_path(rel):
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return folder_layer(parts[1])
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "suanli":
        return header_layer(parts[2], rel)
    return None  # outside the layered tree (e.g. src/README.md)


def layer_of_include(rel, inc):
    """(normalized include name, layer) of `#include "inc"` written in file rel"""
    here = os.path.dirname(rel)
    local = os.path.normpath(os.path.join(here, inc))
    if not inc.startswith("suanli/") and os.path.isfile(os.path.join(root, local)):
        if local.startswith("src/") or local.startswith("include/"):
            return local, layer_of_path(local)
        return local, None
    if inc.startswith("suanli/"):
        return inc, header_layer(inc[len("suanli/"):], rel)
    top = inc.split("/", 1)[0]
    if "/" in inc and os.path.isdir(os.path.join(root, "src", top)):
        return inc, folder_layer(top)
    return inc, None  # a system or include-path header outside the tree


inc_re = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')
files = []
for base in ("src", "include"):
    for dp, dn, fn in os.walk(os.path.join(root, base)):
        dn.sort()
        for f in sorted(fn):
            if f.endswith((".c", ".h", ".inc")):
                files.append(os.path.relpath(os.path.join(dp, f), root))
if os.path.isdir(os.path.join(root, "include", "suanli")):
    for f in sorted(os.listdir(os.path.join(root, "include", "suanli"))):
        if f.endswith(".h"):
            header_layer(f, "include/suanli/" + f)

for rel in files:
    me = layer_of_path(rel)
    if me is None:
        continue
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    for no, line in enumerate(lines, 1):
        m = inc_re.match(line)
        if not m:
            continue
        inc, them = layer_of_include(rel, m.group(1))
        if them is None or them == me or them in reach[me]:
            continue
        if any(l == me and fnmatch.fnmatchcase(inc, h) for l, h in allow):
            continue
        kind = "upward" if me in reach[them] else "sideways (unrelated layers)"
        msg = (f"{rel}:{no}: includes {inc} (layer {them}) from layer {me}: {kind}; "
               f"{me} may include only {', '.join(sorted(reach[me])) or 'nothing'}")
        k = [i for i, (g, h) in enumerate(known) if fnmatch.fnmatchcase(rel, g) and fnmatch.fnmatchcase(inc, h)]
        if k:
            used_known.update(k)
            warnings.append("KNOWN (remove the entry when fixed): " + msg)
        else:
            errors.append(msg)

for w in warnings:
    print("warning: " + w)
for i, (g, h) in enumerate(known):
    if i not in used_known:
        print(f"warning: KNOWN entry '{g} -> {h}' matches nothing any more: remove it from scripts/check_layers.sh")
errors = list(dict.fromkeys(errors))  # an unmapped folder is reported once
for e in errors:
    print("LAYER VIOLATION " + e)
print(f"check_layers: {len(files)} files, {len(errors)} violation(s), {len(used_known)} KNOWN entr{'y' if len(used_known) == 1 else 'ies'} still present")
sys.exit(1 if errors else 0)
PY
