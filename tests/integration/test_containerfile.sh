#!/usr/bin/env bash
# test_containerfile.sh — the Containerfile without building it (tests/container/
# test_container.sh builds and runs the image: make test-container): its builder installs
# only scripts/deps.sh's packages and its runtime stage only those of the libraries the
# binaries load, what it copies exists, its base is an ARG defaulting to debian:12, and the
# build context leaves the build trees out.
source "$(dirname "$0")/lib.sh" # defines: check, finish
CF=$ROOT/Containerfile

test_builder_installs_deps_sh_packages_only() {
    # the one install of the builder is scripts/deps.sh build; the runtime stage's, the list
    # the builder wrote from the binaries' libraries
    grep -q '^RUN scripts/deps.sh build' "$CF" || return 1
    local installs
    installs=$(grep -c 'apt-get install' "$CF")
    [ "$installs" = 1 ] && grep -q 'xargs -a /usr/local/share/plait/runtime-packages.txt' "$CF" ||
        { grep -n 'apt-get' "$CF"; return 1; }
    scripts/deps.sh list build | grep -qw libjansson-dev || return 1
}

test_what_it_copies_exists() {
    local src
    while read -r src; do
        [ -e "$ROOT/$src" ] || { echo "COPY $src: no such file"; return 1; }
    done < <(awk '$1 == "COPY" && $2 !~ /^--from/ { print $2 }' "$CF")
    # the paths the runtime stage copies from the builder are make install's
    grep -q 'make -j"$(nproc)" install .*DESTDIR=/out PREFIX=/usr/local' "$CF" &&
        grep -q '^COPY --from=build /out/usr/local/ /usr/local/' "$CF" || return 1
    grep -q 'share/plait/examples' Makefile || return 1
}

test_base_is_an_arg_defaulting_to_debian_12() {
    grep -q '^ARG BASE=debian:12$' "$CF" && grep -q '^FROM \${BASE}$' "$CF" &&
        grep -q '^ARG BUILD_BASE=debian:12$' "$CF" && grep -q '^FROM \${BUILD_BASE} AS build$' "$CF" ||
        return 1
}

test_context_leaves_build_trees_out() {
    local d
    for d in .git build build-asan runs; do
        grep -qx "$d" "$ROOT/.dockerignore" || { echo ".dockerignore lacks $d"; return 1; }
    done
}

check builder_installs_deps_sh_packages_only test_builder_installs_deps_sh_packages_only
check what_it_copies_exists test_what_it_copies_exists
check base_is_an_arg_defaulting_to_debian_12 test_base_is_an_arg_defaulting_to_debian_12
check context_leaves_build_trees_out test_context_leaves_build_trees_out
finish
