# shellcheck shell=bash
# The timed step both device checks run, sourced by scripts/device-check.sh and scripts/device-check-torch.sh
# so the two write their results and print their times one way.
#
# step NAME ARGS...: run `accelstack ARGS --json` with $PY; keep its final line as $RESULTS/NAME.json (a copy
# in $OUT too, when OUT is set); print its exit status and wall time; return its exit status.
# The sourcing script sets PY (the interpreter accelstack runs under) and RESULTS (an existing folder).
step() {
    local name=$1; shift
    local start end rc=0
    start=$(date +%s.%N)
    "${PY:?}" -m accelstack "$@" --json > "${RESULTS:?}/$name.jsonl" || rc=$?
    end=$(date +%s.%N)
    tail -n 1 "$RESULTS/$name.jsonl" > "$RESULTS/$name.json"
    "$PY" -c 'import sys; print(f"{sys.argv[1]}: exit {sys.argv[2]}, {float(sys.argv[4]) - float(sys.argv[3]):.1f} s wall")' \
        "$name" "$rc" "$start" "$end"
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; cp "$RESULTS/$name.json" "$OUT/$name.json"; fi
    return "$rc"
}
