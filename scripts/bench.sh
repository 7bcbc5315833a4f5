#!/usr/bin/env bash
# Runs Ferry's benchmarks and rewrites docs/BENCHMARKS.md from their output.
#
#   ./scripts/bench.sh            # full run: 4 GiB disk, 3 runs per tool, NBD and boot sections (35-50 min)
#   ./scripts/bench.sh --only nbd-seq,nbd-iops,bootstorm   # NBD sections only, merged into the file
#   ./scripts/bench.sh --only boot   # QEMU boots: local disk, nbdkit, ferry (root; 15-25 min)
#   ./scripts/bench.sh --quick    # smoke test: 256 MiB disk, short I/O runs
#   ./scripts/bench.sh --help     # every option (--size, --dir, --runs, --only, ...)
#
# Needs qemu-img, fio, coreutils, nbdkit, qemu-nbd and nbdcopy; run as root so the page cache
# can be dropped between runs. Options after the script name go to ferry-bench; a later --out
# overrides the default.
set -euo pipefail
cd "$(dirname "$0")/.."
# The s3 section's S3 server: moto as scripts/test.sh installs it (same pinned version).
export FERRY_MOTO="${FERRY_MOTO:-$HOME/.cache/ferry/moto-5.1.18/bin/moto_server}"
cargo build --release -p ferry-bench -p ferry
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
exec "${target_dir:-target}/release/ferry-bench" --out docs/BENCHMARKS.md "$@"
