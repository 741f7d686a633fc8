#!/usr/bin/env bash
# Installs the Debian packages plait needs that are missing, and nothing else.
#   scripts/deps.sh build   compiler and libraries (make, make demo)
#   scripts/deps.sh test    build + the test referees (PyTorch, numpy)
#   scripts/deps.sh list build|test   prints the packages, installs nothing
set -euo pipefail
source "$(dirname "$0")/build_libs.sh" # defines: build_libs_packages

# the build's (scripts/build_libs.sh: the libraries it links, libslurm-dev for the
# Slurm plugin, libcairo2-dev for plait plot; libyaml-dev: plait k8s writes YAML with it)
read -r -a build_pkgs <<<"$(build_libs_packages)"
# clang, libclang-rt-14-dev (libFuzzer, sanitizers) and libomp-dev (clang's omp.h): make fuzz;
# strace: the crash tests inject SIGKILL at chosen system calls;
# openmpi-bin, libopenmpi-dev: make bench-comm compares all-reduce with Open MPI's;
# nodejs, npm: the Kubernetes schema validator (tests/k8s/validate) the k8s tests run;
# python3-yaml: they read the rendered pods back
test_pkgs=("${build_pkgs[@]}" hwloc-nox python3 python3-torch python3-numpy python3-yaml
    slurmctld slurmd slurm-client munge clang libclang-rt-14-dev libomp-dev strace
    openmpi-bin libopenmpi-dev)
# node and npm (the Kubernetes schema validator): Debian's packages, unless the machine has
# them already from elsewhere (NodeSource's nodejs ships npm, and conflicts with Debian's npm)
command -v node >/dev/null && command -v npm >/dev/null || test_pkgs+=(nodejs npm)

list=0
[ "${1:-}" = list ] && list=1 && shift
case "${1:-build}" in
  build) want=("${build_pkgs[@]}") ;;
  test)  want=("${test_pkgs[@]}") ;;
  *) echo "usage: scripts/deps.sh [list] build|test" >&2; exit 2 ;;
esac
[ "$list" = 1 ] && echo "${want[@]}" && exit 0

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "plait: missing packages: ${missing[*]} (run as root, or: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "plait: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
# without systemd, package scripts must not try to start daemons (munge, slurm):
# the tests start and stop their own. The policy file lives only as long as the
# install, and is removed (also on failure) only if this script made it.
if [ ! -e /usr/sbin/policy-rc.d ] && [ ! -d /run/systemd/system ]; then
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
fi
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
