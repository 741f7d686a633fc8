# shellcheck shell=bash
# build_libs.sh — sourced by scripts/deps.sh and scripts/gpu_check.sh: the
# libraries plait's build links, each with the Debian/Ubuntu package that holds
# it, and build_libs_check, which compiles and links a one-line program against
# each with the build's compiler (a missing one is named by its package, not
# left to a compiler error halfway through make). Not a program of its own.

# "package header link-flag": the Makefile's LDLIBS and YAML_LDLIBS (PCRE2: the tokenizer's
# pre-tokenizer regexes, with Unicode classes)
BUILD_LIBS=(
    "libjansson-dev jansson.h -ljansson"
    "libhwloc-dev hwloc.h -lhwloc"
    "libdnnl-dev dnnl.h -ldnnl"
    "libopenblas-dev cblas.h -lopenblas"
    "libyaml-dev yaml.h -lyaml"
    "libpcre2-dev pcre2.h -lpcre2-8"
)
# what builds and finds them; and what the build uses only where found: cairo
# (plait plot; the Makefile asks pkg-config) and Slurm's headers (the SPANK plugin)
BUILD_TOOLS=(gcc make pkg-config)
BUILD_OPTIONAL=(libslurm-dev libcairo2-dev)

# build_libs_packages: every package of the build, one line (scripts/deps.sh build)
build_libs_packages() {
    local lib pkgs=("${BUILD_TOOLS[@]}")
    for lib in "${BUILD_LIBS[@]}"; do pkgs+=("${lib%% *}"); done
    echo "${pkgs[@]}" "${BUILD_OPTIONAL[@]}"
}

# build_lib_links HEADER FLAG: the compiler make uses ($CC, else cc) finds
# HEADER and links FLAG; its complaint on stderr when not
build_lib_links() {
    local exe rc=0
    exe=$(mktemp "${TMPDIR:-/tmp}/plait-build-libs.XXXXXX") || return 1
    # (pcre2.h wants its code unit width first; the others ignore the macro)
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\nint main(void) { return 0; }\n' "$1" |
        "${CC:-cc}" -x c - -o "$exe" "$2" || rc=$?
    rm -f "$exe"
    return "$rc"
}

# build_libs_check: one line per library on stdout; when one does not build,
# the packages to install and status 2 (the compiler's words on stderr)
build_libs_check() {
    local lib pkg header flag missing=() tool
    for tool in "${CC:-cc}" make; do
        if ! command -v "$tool" >/dev/null; then
            echo "plait: $tool is not installed"
            missing+=("$([ "$tool" = make ] && echo make || echo gcc)")
        fi
    done
    if [ ${#missing[@]} -eq 0 ]; then
        for lib in "${BUILD_LIBS[@]}"; do
            read -r pkg header flag <<<"$lib"
            if build_lib_links "$header" "$flag"; then
                echo "plait: $header and $flag: found"
            else
                echo "plait: $header or $flag: not found (Debian/Ubuntu package $pkg)"
                missing+=("$pkg")
            fi
        done
    fi
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "plait: the build needs ${missing[*]}: install with"
    echo "    apt-get install ${missing[*]}"
    echo "(or scripts/deps.sh build, as root, which installs every package the build uses)"
    return 2
}

# build_libs_cairo: the build will draw plots (pkg-config finds cairo and fontconfig)
build_libs_cairo() {
    pkg-config --exists cairo fontconfig 2>/dev/null
}
