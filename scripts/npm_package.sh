# shellcheck shell=bash
# npm_package.sh — sourced by the tests (tests/integration/lib.sh) and benchmarks that compare
# with a JavaScript reference from npm. Not a program of its own.

# npm_package_dir SRC DEST WHAT: the npm package whose package.json and scripts are in SRC,
# installed into DEST once (again when SRC's files change), for a reference written in
# JavaScript (tests and benchmarks); on failure says why (no node, no registry) on stdout
# and returns 1, for the caller's "# SKIP" line. npm's log goes to DEST.npm.log.
npm_package_dir() {
    local src=$1 dest=$2 what=$3 stamp
    stamp=$(cat "$src"/* | sha256sum)
    [ -f "$dest/.ready" ] && [ "$(cat "$dest/.ready")" = "$stamp" ] && return 0
    rm -rf "$dest" && mkdir -p "$dest" && cp "$src"/* "$dest/"
    command -v node >/dev/null && command -v npm >/dev/null || {
        echo "node/npm are not installed (scripts/deps.sh test installs them)"
        return 1
    }
    (cd "$dest" && npm_config_fetch_retries=1 npm_config_fetch_retry_mintimeout=2000 \
        npm_config_fetch_retry_maxtimeout=5000 timeout 180 npm install --no-audit --no-fund \
        --silent) >"$dest.npm.log" 2>&1 || {
        echo "npm install could not set up the $what (no registry?) $(tail -n 3 "$dest.npm.log" | tr '\n' ' ')"
        return 1
    }
    echo "$stamp" >"$dest/.ready"
}
