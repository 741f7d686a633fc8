# python.sh — sourced by the tests and benches: plait_python prints the Python
# that has PyTorch (the numerical referee): $PLAIT_PYTHON when set, else the first
# python3 on PATH that imports torch, else Debian's /usr/bin/python3 (which
# scripts/deps.sh test gives python3-torch). Not a program of its own.
plait_python() {
    if [ -n "${PLAIT_PYTHON:-}" ]; then
        echo "$PLAIT_PYTHON"
        return
    fi
    local dir
    local IFS=:
    for dir in $PATH; do
        if [ -x "$dir/python3" ] && "$dir/python3" -c "import torch" >/dev/null 2>&1; then
            echo "$dir/python3"
            return
        fi
    done
    echo /usr/bin/python3
}
