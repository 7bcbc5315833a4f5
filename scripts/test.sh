#!/usr/bin/env bash
# Runs every test of Ferry, after installing what the tests need. Idempotent: a second run
# installs nothing and goes straight to the checks.
#
#   ./scripts/test.sh                 # install what is missing, then fmt, clippy, tests, fuzz
#   FERRY_SKIP_FUZZ=1 ./scripts/test.sh   # the same without cargo-fuzz and the fuzz smoke run
#
# Steps (each failure stops the run; each step's time is printed at the end):
#   1. apt packages: every TOOL=PACKAGE of TEST_TOOLS below and a few more (apt-get update
#      only when one is missing);
#   2. rustfmt and clippy (rustup components), cargo-nextest and cargo-fuzz, when missing;
#   2b. PostgreSQL on loopback for the farm tests (cluster started, role and database made),
#      schemathesis (pinned) in a venv for the API fuzz run, and moto[server] (pinned) in
#      a venv for the S3 store tests;
#   2c. playwright-core (pinned by web/e2e/package-lock.json) by `npm ci` into
#      web/e2e/node_modules for the console's Chromium test, when the lock file changed;
#   2d. the Debian 12 test OS of the QEMU boot tests (scripts/guest-root.sh), cached
#      outside the repository and rebuilt only when its recipe changes;
#   3. cargo fmt --check, scripts/layout-check.py (no file over 800 lines without a reason, no
#      import cycle between the files of a crate, docs that name the tree as it is), cargo
#      clippy -D warnings, the boot agent's static build, `cargo nextest run` for the whole
#      workspace (.config/nextest.toml), `cargo test --doc`;
#   4. scripts/fuzz-smoke.sh, a time-boxed run of every fuzz target, started beside the
#      tests at the lowest CPU priority and waited for after them;
#   5. at the end, passed or not: the step times and the 15 slowest test binaries.
#
# Under CI=true (as .ci/run is run) a test whose external tool is missing fails instead of
# skipping; elsewhere it prints why it skipped. See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every external tool a test runs or requires (the tool rule of docs/testing.md), as
# TOOL=PACKAGE: the Debian package that installs it, or @venv for the pinned Python tools this
# script puts in venvs below, or @guest for a tool run inside the test OS's chroot (its recipe,
# scripts/guest-root.sh, installs it). Every package named here is installed below.
# tests/interop/tests/tool_list.rs fails when a test names a tool that is not in this list,
# when a package here is not installed by this script, and (under CI=true) when a tool here is
# not on PATH after the install.
TEST_TOOLS=(
    # images and their interop peers: qemu-img and qemu-io both ways, libvhdi for
    # differencing VHDX (which qemu refuses), FUSE to unmount vhdimount, compressed vectors
    qemu-img=qemu-utils qemu-io=qemu-utils qemu-nbd=qemu-utils
    vhdiinfo=libvhdi-utils vhdimount=libvhdi-utils fusermount3=fuse3 bzip2=bzip2
    # NBD peers, clients and load
    nbdkit=nbdkit nbdinfo=libnbd-bin nbdcopy=libnbd-bin fio=fio nbd-client=nbd-client
    # boot service and TFTP clients, certificates
    curl=curl tftp=tftp-hpa openssl=openssl jq=jq
    # disks of the boot-file and boot tests
    mkfs.ext4=e2fsprogs mkfs.ext2=e2fsprogs e2fsck=e2fsprogs dumpe2fs=e2fsprogs sfdisk=fdisk cpio=cpio
    # the QEMU boot tests (crates/guest): the machine, the test OS's build
    qemu-system-x86_64=qemu-system-x86 debootstrap=debootstrap strip=binutils
    # the console's end-to-end test: Debian's headless Chromium driven from node
    chromium=chromium node=nodejs
    # the device key in a TPM (crates/agent/tests/tpm.rs): a software TPM 2.0
    swtpm=swtpm swtpm_setup=swtpm-tools
    # listener and limit tests: ss for the accept queue, prlimit for the open-file limit
    ss=iproute2 prlimit=util-linux setpriv=util-linux flock=util-linux
    # the database outage test's own PostgreSQL cluster (initdb, pg_ctl run as postgres)
    runuser=util-linux chown=coreutils
    # network namespace tests: a bridge, veths and taps; dnsmasq as a site's DHCP server
    ip=iproute2 dnsmasq=dnsmasq-base
    mount=mount umount=mount
    # the layout check's test runs scripts/layout-check.py
    python3=python3
    # base tools the tests run (named so that a minimal machine gets them too)
    bash=bash sh=dash tar=tar kill=procps chroot=coreutils mkfifo=coreutils
    sha256sum=coreutils sync=coreutils timeout=coreutils true=coreutils
    # pinned in venvs by this script (install_schemathesis, install_moto)
    moto_server=@venv schemathesis=@venv
    # run by `ferry target install-initramfs` inside the test OS's chroot
    update-initramfs=@guest
)

# Packages besides the tools' own: ipxe-qemu (the NIC's iPXE ROM) and ipxe (undionly.kpxe,
# ipxe.efi) for the boot tests, ovmf (UEFI firmware for the UEFI boots), postgresql (the
# farm suite's second backend), python3-venv
# (the venvs below), musl-tools (musl-gcc, for the static boot agent ferry-boot that the QEMU
# boot tests put into the test OS's initramfs).
APT_PACKAGES=(ipxe-qemu ipxe ovmf postgresql python3-venv musl-tools)
for entry in "${TEST_TOOLS[@]}"; do
    pkg="${entry#*=}"
    case "$pkg" in
        @*) continue ;;
        # node and npm run playwright-core; Debian's are installed only when none is on PATH.
        nodejs) command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && continue
                APT_PACKAGES+=(nodejs npm); continue ;;
    esac
    [[ " ${APT_PACKAGES[*]} " == *" $pkg "* ]] || APT_PACKAGES+=("$pkg")
done

# The farm tests' PostgreSQL (crates/farm/tests/it/common): a role that may create databases,
# and a database to connect to first. FERRY_TEST_PG_URL overrides the URL the tests use.
PG_ROLE=ferry
PG_PASSWORD=ferry
PG_DATABASE=ferry_test
export FERRY_TEST_PG_URL="${FERRY_TEST_PG_URL:-postgres://$PG_ROLE:$PG_PASSWORD@127.0.0.1:5432/$PG_DATABASE}"
# schemathesis, pinned, in a venv outside the repository (crates/cli/tests/farm.rs runs it).
SCHEMATHESIS_VERSION=4.32.5
SCHEMATHESIS_VENV="${HOME}/.cache/ferry/schemathesis-$SCHEMATHESIS_VERSION"
export FERRY_SCHEMATHESIS="$SCHEMATHESIS_VENV/bin/schemathesis"
# moto's S3 server, pinned, in a venv outside the repository (crates/cli/tests/s3.rs starts
# one per test on a free loopback port; docs/s3.md).
MOTO_VERSION=5.1.18
MOTO_VENV="${HOME}/.cache/ferry/moto-$MOTO_VERSION"
export FERRY_MOTO="$MOTO_VENV/bin/moto_server"

# A CI run builds everything once from nothing: incremental compilation's bookkeeping is then
# only a cost (the 109 test binaries built in 476 s without it, 586 s with it; clippy 285 s
# and 287 s). A developer's repeated runs keep it.
if [[ "${CI:-}" == true ]]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

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
    # Debian 12's qemu-system-x86 depends on the qemu-utils of its own version; on a machine
    # with a newer qemu-utils (backports) apt would remove it, so bookworm's is named in the
    # same run (a downgrade: the image and interop suites pass with its qemu-img 7.2).
    local extra=()
    if [[ " ${missing[*]} " == *" qemu-system-x86 "* ]] &&
        apt-cache policy qemu-utils | grep -q ' bookworm/main'; then
        local kept=()
        for pkg in "${missing[@]}"; do
            [[ "$pkg" == qemu-utils ]] || kept+=("$pkg")
        done
        missing=("${kept[@]}" qemu-utils/bookworm)
        extra=(--allow-downgrades)
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${extra[@]}" "${missing[@]}"
    # An install can remove what an earlier package put there (Debian 12's qemu-system-x86
    # replaces a newer qemu-utils): every listed tool must be on PATH afterwards.
    local entry tool again=()
    for entry in "${TEST_TOOLS[@]}"; do
        tool="${entry%%=*}" pkg="${entry#*=}"
        [[ "$pkg" == @* ]] && continue
        command -v "$tool" >/dev/null 2>&1 || again+=("$pkg")
    done
    if [[ ${#again[@]} -gt 0 ]]; then
        say "installing again, their tools are missing: ${again[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            --allow-downgrades "${again[@]}"
    fi
}

# The test OS of the QEMU boot tests (scripts/guest-root.sh): built once into
# ${FERRY_GUEST_CACHE:-~/.cache/ferry/guest} and rebuilt when the recipe changes, here as a
# step of its own (about 3.5 minutes the first time) rather than inside the first boot test.
build_guest_root() {
    as_root env FERRY_GUEST_CACHE="${FERRY_GUEST_CACHE:-$HOME/.cache/ferry/guest}" \
        bash scripts/guest-root.sh >/dev/null
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
    # The boot agent (ferry-boot) is a static musl binary: its target, and musl-gcc (Debian's
    # musl-tools, in APT_PACKAGES) for ring's C code.
    if ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
        say "adding the x86_64-unknown-linux-musl target (the boot agent)"
        rustup target add x86_64-unknown-linux-musl
    fi
    # cargo-nextest runs the tests (one process per test, binaries side by side; see
    # .config/nextest.toml). Rust machines of this project's kind carry it; elsewhere it is
    # built once from crates.io.
    if ! cargo nextest --version >/dev/null 2>&1; then
        say "installing cargo-nextest"
        cargo install cargo-nextest --locked
    fi
    if [[ "${FERRY_SKIP_FUZZ:-0}" != 1 ]] && ! cargo fuzz --version >/dev/null 2>&1; then
        say "installing cargo-fuzz"
        cargo install cargo-fuzz --locked
    fi
}

# Starts the PostgreSQL cluster when it is down and makes the test role and database; each
# step is skipped when already done.
start_postgres() {
    local version cluster
    read -r version cluster < <(pg_lsclusters --no-header | awk 'NR==1 {print $1, $2}')
    if [[ -z "${version:-}" ]]; then
        echo "test.sh: postgresql is installed but has no cluster" >&2
        return 1
    fi
    if ! pg_lsclusters --no-header | awk 'NR==1 {print $4}' | grep -q online; then
        say "starting PostgreSQL $version/$cluster"
        as_root pg_ctlcluster "$version" "$cluster" start
    fi
    local psql=(as_root su postgres -c)
    if ! "${psql[@]}" "psql -tAc \"SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE'\"" | grep -q 1; then
        say "creating PostgreSQL role $PG_ROLE"
        "${psql[@]}" "psql -c \"CREATE ROLE $PG_ROLE LOGIN PASSWORD '$PG_PASSWORD' CREATEDB\""
    fi
    if ! "${psql[@]}" "psql -tAc \"SELECT 1 FROM pg_database WHERE datname = '$PG_DATABASE'\"" | grep -q 1; then
        say "creating PostgreSQL database $PG_DATABASE"
        "${psql[@]}" "createdb -O $PG_ROLE $PG_DATABASE"
    fi
    # Each farm test makes its own database (ferry_t_<uuid>); drop those of earlier runs. A
    # regular expression, not LIKE: LIKE's '_' matches any character, so 'ferry_t_%' would
    # also drop ferry_test itself.
    local db
    for db in $("${psql[@]}" "psql -tAc \"SELECT datname FROM pg_database WHERE datname ~ '^ferry_t_'\""); do
        "${psql[@]}" "dropdb --if-exists $db"
    done
}

install_schemathesis() {
    if [[ -x "$FERRY_SCHEMATHESIS" ]]; then
        return 0
    fi
    say "installing schemathesis $SCHEMATHESIS_VERSION into $SCHEMATHESIS_VENV"
    python3 -m venv "$SCHEMATHESIS_VENV"
    "$SCHEMATHESIS_VENV/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
}

install_moto() {
    if [[ -x "$FERRY_MOTO" ]]; then
        return 0
    fi
    say "installing moto[server] $MOTO_VERSION into $MOTO_VENV"
    python3 -m venv "$MOTO_VENV"
    "$MOTO_VENV/bin/pip" install --quiet "moto[server]==$MOTO_VERSION"
}

# `npm ci` in web/e2e when its lock file differs from the one last installed (a copy kept in
# node_modules), so a second run installs nothing.
install_console_e2e() {
    local dir=web/e2e
    if cmp -s "$dir/package-lock.json" "$dir/node_modules/.ferry-installed-lock.json"; then
        return 0
    fi
    say "npm ci in $dir (playwright-core for the console test)"
    npm ci --prefix "$dir" --no-audit --no-fund
    cp "$dir/package-lock.json" "$dir/node_modules/.ferry-installed-lock.json"
}

# Each step's wall-clock time, printed at the end (docs/testing.md keeps the figures).
STEP_TIMES=()
STEP_NAME=""
STEP_START=$SECONDS
RUN_START=$SECONDS
step() {
    if [[ -n "$STEP_NAME" ]]; then
        STEP_TIMES+=("$(printf '%6d s  %s' $((SECONDS - STEP_START)) "$STEP_NAME")")
    fi
    STEP_NAME="$1"
    STEP_START=$SECONDS
    [[ -n "$1" ]] && say "$1"
    return 0
}
times_report() {
    if [[ -n "${FUZZ_PID:-}" ]]; then
        kill -- "-$FUZZ_PID" 2>/dev/null || true
    fi
    step ""
    say "step times (wall clock, $((SECONDS - RUN_START)) s in all):"
    printf '%s\n' "${STEP_TIMES[@]}" >&2
    if [[ -f target/nextest/ci/junit.xml ]]; then
        python3 scripts/test-times.py target/nextest/ci/junit.xml 15 >&2 || true
    fi
}
trap times_report EXIT

# The sample vectors live beside the repository (../shared/vectors, as CI checks it out) or
# where FERRY_VECTORS names: say so before building rather than after 30 failed tests.
vectors_dir="${FERRY_VECTORS:-../shared/vectors}"
if [[ ! -f "$vectors_dir/README.md" ]]; then
    echo "test.sh: the sample vectors are not at $vectors_dir (clone beside shared/, or set FERRY_VECTORS to shared/vectors)" >&2
    exit 2
fi

step "installing what the tests need"
install_apt_packages
install_rust_tools
install_console_e2e
start_postgres
install_schemathesis
install_moto
step "guest root for the boot tests (scripts/guest-root.sh)"
build_guest_root

step "cargo fmt --all --check"
cargo fmt --all --check
step "scripts/layout-check.py (file lengths, import cycles, docs naming the tree)"
python3 scripts/layout-check.py
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# The boot agent the diskless boot tests install into the test OS (crates/cli/tests/netboot.rs
# reads FERRY_BOOT_AGENT).
step "cargo build --profile boot-agent --target x86_64-unknown-linux-musl -p boot-agent"
cargo build --profile boot-agent --target x86_64-unknown-linux-musl -p boot-agent
export FERRY_BOOT_AGENT="$PWD/target/x86_64-unknown-linux-musl/boot-agent/ferry-boot"
# The fuzz smoke run (its build with sanitizers in its own target directory, then every
# target for FUZZ_SECONDS) runs beside the tests at the lowest CPU priority: it takes the
# cores only while the tests wait on sockets, timers and the last QEMU machines.
FUZZ_PID=""
FUZZ_LOG="fuzz/target/fuzz-smoke.log"
if [[ "${FERRY_SKIP_FUZZ:-0}" != 1 && -f scripts/fuzz-smoke.sh ]]; then
    mkdir -p fuzz/target
    # A session of its own (setsid), so that a failed run stops the whole group.
    setsid nice -n 19 bash scripts/fuzz-smoke.sh >"$FUZZ_LOG" 2>&1 &
    FUZZ_PID=$!
fi
step "cargo nextest run --workspace --profile ci${CI:+ (CI=$CI: missing tools fail)}"
rm -f target/nextest/ci/junit.xml
cargo nextest run --workspace --profile ci --no-fail-fast
# nextest runs no doctests: these run here.
step "cargo test --workspace --doc"
cargo test --workspace --doc

if [[ "${FERRY_SKIP_FUZZ:-0}" == 1 ]]; then
    say "fuzz smoke run skipped (FERRY_SKIP_FUZZ=1)"
elif [[ -n "$FUZZ_PID" ]]; then
    step "scripts/fuzz-smoke.sh (started beside the tests; waiting for its end)"
    fuzz_status=0
    wait "$FUZZ_PID" || fuzz_status=$?
    FUZZ_PID=""
    grep -v '^\s*\(Compiling\|Finished\|Running\)' "$FUZZ_LOG" | tail -n 40 >&2
    if [[ $fuzz_status -ne 0 ]]; then
        echo "test.sh: the fuzz smoke run failed (exit $fuzz_status; full log: $FUZZ_LOG)" >&2
        exit "$fuzz_status"
    fi
fi
say "all tests passed"
