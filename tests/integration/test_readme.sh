#!/usr/bin/env bash
# The docs work as written: every ```sh block of README.md, examples/README.md,
# examples/slurm/ADMIN.md and k8s/ADMIN.md runs, in order, with bash -e in a fresh
# directory holding a copy of examples/ (as a fresh clone has them, no runs/),
# with the built plait first on the PATH. A block that cannot run here is
# marked by the line before its fence: <!-- doc-test: skip (the reason) -->,
# and reported as skipped with that reason.
source "$(dirname "$0")/lib.sh"

# blocks FILE: "LINE<TAB>skip reason" or "LINE<TAB>run", and each runnable block
# into $WORK/blocks/<file>_<line>.sh
blocks() {
    local doc=$1 name
    name=$(echo "$doc" | tr '/.' '__')
    mkdir -p "$WORK/blocks"
    awk -v out="$WORK/blocks/$name" '
        /^<!-- doc-test: skip/ { skip = $0; sub(/^<!-- doc-test: skip */, "", skip); sub(/ *-->.*/, "", skip); sub(/^\(/, "", skip); sub(/\)$/, "", skip); next }
        /^```sh *$/ && !inblock { inblock = 1; start = NR; file = out "_" NR ".sh"
                                  if (skip != "") print NR "\tskip " skip; else { print NR "\trun"; printf "" >file }
                                  next }
        inblock && /^```/ { inblock = 0; skip = ""; if (file) close(file); next }
        inblock { if (skip == "") print >>file; next }
        /[^ \t]/ { skip = "" }
    ' "$doc"
}

mkdir -p "$WORK/clone"
cp -r "$ROOT/examples" "$WORK/clone/"
export PATH="$BUILD/bin:$PATH"

for doc in README.md examples/README.md examples/slurm/ADMIN.md k8s/ADMIN.md; do
    name=$(echo "$doc" | tr '/.' '__')
    while IFS=$'\t' read -r line what; do
        label="${doc}_line_$line"
        if [[ $what == skip* ]]; then
            echo "ok $label # skip ${what#skip }"
            continue
        fi
        check "$label" bash -c 'cd "$1" && bash -euo pipefail "$2"' _ "$WORK/clone" "$WORK/blocks/${name}_$line.sh"
    done < <(blocks "$doc")
done

# every block was seen: a README with no runnable block would pass silently
test_some_blocks_ran() {
    ls "$WORK/blocks"/README_md_*.sh >/dev/null 2>&1
}
check readme_has_runnable_blocks test_some_blocks_ran
finish
