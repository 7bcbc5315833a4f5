#!/usr/bin/env bash
# Runs every test of Ferry, after installing what the tests need. Idempotent: a second run
# installs nothing and goes straight to the checks.
#
#   ./scripts/test.sh                 # install what is missing, then fmt, clippy, tests, fuzz
#   FERRY_SKIP_FUZZ=1 ./scripts/test.sh   # the same without cargo-fuzz and the fuzz smoke run
#
# Steps (each failure stops the run):
#   1. apt packages the interop tests drive (apt-get update only when one is missing);
#   2. rustfmt and clippy (rustup components) and cargo-fuzz, when missing;
#   3. cargo fmt --check, cargo clippy -D warnings, cargo test for the whole workspace;
#   4. scripts/fuzz-smoke.sh, a time-boxed run of every fuzz target (when present).
#
# Under CI=true (as .ci/run is run) a test whose external tool is missing fails instead of
# skipping; elsewhere it prints why it skipped. See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# qemu-utils: qemu-img, qemu-io (interop both ways). libvhdi-utils: vhdiinfo, vhdimount
# (differencing VHDX, which qemu refuses). fio: benchmarks. nbdkit, libnbd-bin: the NBD
# server's peers and clients. fuse3: fusermount3 for vhdimount. bzip2: compressed vectors.
APT_PACKAGES=(qemu-utils libvhdi-utils fio nbdkit libnbd-bin fuse3 bzip2)

say() { printf '==> %s\n' "$*" >&2; }

as_root() {
    if [[ "$(id -u)" == 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "test.sh: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

install_apt_packages() {
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        return 0
    fi
    say "installing ${missing[*]}"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}"
}

install_rust_tools() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "test.sh: cargo is missing; install Rust with rustup first" >&2
        return 1
    fi
    if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
        say "adding rustfmt and clippy"
        rustup component add rustfmt clippy
    fi
    if [[ "${FERRY_SKIP_FUZZ:-0}" != 1 ]] && ! cargo fuzz --version >/dev/null 2>&1; then
        say "installing cargo-fuzz"
        cargo install cargo-fuzz --locked
    fi
}

install_apt_packages
install_rust_tools

say "cargo fmt --all --check"
cargo fmt --all --check
say "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
say "cargo test --workspace${CI:+ (CI=$CI: missing tools fail)}"
cargo test --workspace

if [[ "${FERRY_SKIP_FUZZ:-0}" == 1 ]]; then
    say "fuzz smoke run skipped (FERRY_SKIP_FUZZ=1)"
elif [[ -f scripts/fuzz-smoke.sh ]]; then
    say "scripts/fuzz-smoke.sh"
    bash scripts/fuzz-smoke.sh
fi
say "all tests passed"
