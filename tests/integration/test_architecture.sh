#!/usr/bin/env bash
# docs/ARCHITECTURE.md stays true: every function its decision table names (one
# or several to a row, separated by commas) is defined in the file the table
# names (a definition: the name and its parameter list at the start of a line,
# after its return type), and every file and folder the page names in
# backquotes exists.
source "$(dirname "$0")/lib.sh"
DOC=$ROOT/docs/ARCHITECTURE.md

test_decision_table_names_functions_that_exist() {
    local rows=0 bad=0 fns fn file
    while IFS='|' read -r _ _ fns file _; do
        fns=$(sed 's/[` ]//g' <<<"$fns")
        file=$(sed 's/ //g' <<<"$file")
        [ -n "$fns" ] && [ "$fns" != function ] && [[ "$fns" != -* ]] || continue
        rows=$((rows + 1))
        for fn in ${fns//,/ }; do
            if [ ! -f "$ROOT/$file" ]; then
                echo "$fn: no file $file"
                bad=1
            elif ! grep -Eq "^[A-Za-z_].*[ *]$fn\(" "$ROOT/$file"; then
                echo "$fn is not defined in $file"
                bad=1
            fi
        done
    done < <(sed -n '/^## Decisions/,/^Known/p' "$DOC" | grep '^| ')
    [ "$rows" -ge 10 ] || { echo "only $rows rows read from the table"; return 1; }
    return $bad
}

test_paths_it_names_exist() {
    local bad=0 p
    for p in $(grep -o '`[a-z][a-z_./-]*/[a-z_./-]*`' "$DOC" | tr -d '`' | sort -u); do
        case "$p" in ../*) continue ;; esac
        [ -e "$ROOT/$p" ] || { echo "docs/ARCHITECTURE.md names $p, which does not exist"; bad=1; }
    done
    return $bad
}

check architecture_decision_table_names_functions_that_exist test_decision_table_names_functions_that_exist
check architecture_paths_it_names_exist test_paths_it_names_exist
finish
