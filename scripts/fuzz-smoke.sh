#!/usr/bin/env bash
# Time-boxed smoke run of every cargo-fuzz target in fuzz/Cargo.toml (STYLE.md §6).
#
# Usage: scripts/fuzz-smoke.sh [TARGET...]
#   FUZZ_SECONDS  seconds per target (default 10)
#   FUZZ_JOBS     cargo build jobs (default: cargo's choice)
#
# Builds all targets once, then runs each for FUZZ_SECONDS on its corpus (fuzz/corpus/<target>,
# created empty if missing). Exits non-zero if any target crashes, hangs (one input over
# 10 s) or runs out of memory; the reproducer is in fuzz/artifacts/<target>/ and the full log
# in fuzz/target/fuzz-smoke/<target>.log. Long runs and turning a crash into a unit test: docs/fuzzing.md.
#
# There is no nightly toolchain on CI: RUSTC_BOOTSTRAP=1 lets stable rustc accept the -Z
# flags cargo-fuzz passes (sanitizer, coverage instrumentation).
set -euo pipefail

seconds="${FUZZ_SECONDS:-10}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: cargo-fuzz is missing (cargo install cargo-fuzz)" >&2
    exit 2
fi

# Extra libFuzzer flags per target. vhdx_log needs a GUID plus at least one 4 KiB log sector,
# more than libFuzzer's default 4096-byte input cap.
extra_args() {
    case "$1" in
        vhdx_log) echo "-max_len=65552" ;;
        *) ;;
    esac
}

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "fuzz-smoke: no targets found in fuzz/Cargo.toml" >&2
    exit 2
fi

build_args=()
if [[ -n "${FUZZ_JOBS:-}" ]]; then
    build_args+=(--jobs "$FUZZ_JOBS")
fi
cargo fuzz build "${build_args[@]}"

# Logs go under target/: cargo-fuzz takes any new file in artifacts/<target>/ for a crash input.
logs="target/fuzz-smoke"
mkdir -p "$logs"
# One target a core at a time (FUZZ_PARALLEL, default the CPU count): each still runs its
# full ${seconds}s, on a core of its own.
parallel="${FUZZ_PARALLEL:-$(nproc)}"
run_one() {
    local t="$1" log="$logs/$1.log" extra
    mkdir -p "corpus/$t"
    read -r -a extra <<<"$(extra_args "$t")"
    if cargo fuzz run "$t" -- -max_total_time="$seconds" -timeout=10 "${extra[@]}" \
        >"$log" 2>&1; then
        echo "== $t (${seconds}s${extra[*]:+ ${extra[*]}}): $(grep -E '^Done [0-9]+ runs' "$log" || true)"
    else
        echo "!! $t FAILED (full log: fuzz/$log)"
        # The panic message, libFuzzer's verdict and the reproducer; not the input dump.
        grep -E -A1 'panicked at|ERROR: libFuzzer|^SUMMARY|Test unit written|^\s+cargo fuzz' "$log" \
            | cut -c1-300 || tail -n 20 "$log" | cut -c1-300
        touch "$logs/$t.failed"
    fi
}
rm -f "$logs"/*.failed
running=0
for t in "${targets[@]}"; do
    run_one "$t" &
    running=$((running + 1))
    if [[ $running -ge $parallel ]]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait
failed=()
for t in "${targets[@]}"; do
    [[ -e "$logs/$t.failed" ]] && failed+=("$t")
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz-smoke: ${#failed[@]} target(s) failed: ${failed[*]} (reproducers in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: ${#targets[@]} target(s) ran ${seconds}s each without a crash"
