#!/usr/bin/env bash
# test_container.sh — the image the Containerfile builds, built and run with the container
# engine here (docker, else podman): `plait --version`, `plait check` on an example plan,
# and a few CPU training steps whose run directory is a volume of the host. Takes minutes
# (the builder installs scripts/deps.sh's packages and compiles plait): `make
# test-container` runs it, `make test` does not. The base image is PLAIT_CONTAINER_BASE
# (default debian:12); where no registry is reachable, make one from Debian's mirror first:
#   debootstrap --variant=minbase bookworm ROOTFS http://deb.debian.org/debian
#   tar -C ROOTFS -c . | docker import - debian:12
source "$(dirname "$0")/../integration/lib.sh" # defines: WORK, check, finish
ENGINE=${PLAIT_CONTAINER_ENGINE:-$(command -v docker || command -v podman || true)}
BASE=${PLAIT_CONTAINER_BASE:-debian:12}
TAG=plait-test:$$

why_not() { # why no image can be built here, or nothing
    [ -n "$ENGINE" ] || { echo "no docker or podman"; return; }
    "$ENGINE" info >/dev/null 2>&1 || { echo "$ENGINE has no daemon it can reach"; return; }
    "$ENGINE" image inspect "$BASE" >/dev/null 2>&1 || "$ENGINE" pull "$BASE" >/dev/null 2>&1 ||
        echo "no $BASE image (docker import one made by debootstrap)"
}

test_image_builds_and_trains() {
    "$ENGINE" build -f Containerfile --build-arg BUILD_BASE="$BASE" --build-arg BASE="$BASE" \
        --build-arg PLAIT_VERSION="$(git describe --always --dirty 2>/dev/null || echo unknown)" \
        -t "$TAG" . >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log"; return 1; }
    local run=("$ENGINE" run --rm -v "$WORK:/work" "$TAG")
    "${run[@]}" --version | grep -q "^plait " || { "${run[@]}" --version; return 1; }
    "${run[@]}" check /usr/local/share/plait/examples/plans/shakespeare.json >"$WORK/check.log" 2>&1 ||
        { cat "$WORK/check.log"; return 1; }
    "${run[@]}" data prepare /usr/local/share/plait/examples/data/tinyshakespeare.txt train.bin \
        --val val.bin >"$WORK/prepare.log" 2>&1 || { cat "$WORK/prepare.log"; return 1; }
    cat >"$WORK/plan.json" <<'JSON'
{"model": {"layers": 2, "heads": 2, "hidden": 32, "vocab": 256, "seq_len": 32},
 "data": {"train": "train.bin", "val": "val.bin"}, "batch": {"micro_batch": 4}, "steps": 5,
 "train": {"log_every": 1}}
JSON
    "${run[@]}" train plan.json --out run >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; return 1; }
    grep -q "^step 5/5" "$WORK/train.log" && [ "$(grep -c '"step"' "$WORK/run/metrics.jsonl")" = 5 ] ||
        { cat "$WORK/train.log"; return 1; }
}

trap '"$ENGINE" rmi -f "$TAG" >/dev/null 2>&1; rm -rf "$WORK"' EXIT
skip=$(why_not)
if [ -n "$skip" ]; then
    echo "ok image_builds_and_trains # SKIP $skip"
else
    check image_builds_and_trains test_image_builds_and_trains
fi
finish
