#!/usr/bin/env bash
# selftest_why.sh — sourced: selftest_why FILE prints why plait-train --selftest (its
# output in FILE) found no usable GPU, from the line it ends with when it exits 77
# ("plait-train --selftest: skipped: WHY (exit 77)"); nothing when there is no such line.
selftest_why() {
    sed -n 's/^plait-train --selftest: skipped: \(.*\) (exit 77)$/\1/p' "$1" | head -1
}
