#!/bin/sh
# Install bubblewrap (the agent sandbox, a2rl_bench/isolation/sandbox.py) and check that it can create its namespaces here.
# Idempotent: does nothing when a working bwrap is already installed. Exit code 0 = the sandbox works;
# 1 = it does not (the message says why; runs then need SandboxPolicy(allow_unsandboxed=True), reported as
# "sandbox: none (weaker)").
set -u

probe() {
    # The namespaces a2rl asks for: a root harness does not need a user namespace; any other user does.
    if [ "$(id -u)" -eq 0 ]; then userns=""; else userns="--unshare-user --disable-userns"; fi
    # shellcheck disable=SC2086
    bwrap --unshare-pid --unshare-net --unshare-ipc --unshare-uts $userns --die-with-parent \
        --ro-bind / / --proc /proc --dev /dev true 2>&1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else return 1; fi
}

if ! command -v bwrap >/dev/null 2>&1; then
    echo "install-sandbox: installing bubblewrap"
    if command -v apt-get >/dev/null 2>&1; then
        as_root apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
            || { as_root apt-get update -qq && as_root apt-get install -y -qq bubblewrap; }
    elif command -v dnf >/dev/null 2>&1; then as_root dnf install -y -q bubblewrap
    elif command -v yum >/dev/null 2>&1; then as_root yum install -y -q bubblewrap
    elif command -v apk >/dev/null 2>&1; then as_root apk add -q bubblewrap
    elif command -v pacman >/dev/null 2>&1; then as_root pacman -S --noconfirm --needed bubblewrap
    fi
fi

if ! command -v bwrap >/dev/null 2>&1; then
    echo "install-sandbox: bubblewrap is not installed and could not be installed here (no root, or no known" >&2
    echo "  package manager): install the 'bubblewrap' package, or run agents with the weaker fallback." >&2
    exit 1
fi
if [ "$(id -u)" -eq 0 ] && ! command -v setpriv >/dev/null 2>&1; then
    echo "install-sandbox: a root harness also needs setpriv (package util-linux) to drop the agent's uid" >&2
    exit 1
fi
if ! out=$(probe); then
    echo "install-sandbox: $(command -v bwrap) is installed but cannot create namespaces here: $out" >&2
    echo "  Unprivileged user namespaces may be off: sysctl kernel.unprivileged_userns_clone=1 (Debian)," >&2
    echo "  user.max_user_namespaces > 0, or on Ubuntu 24.04 an AppArmor profile that allows bwrap." >&2
    echo "  In a container, run it with user namespaces allowed (e.g. without a seccomp profile that blocks them)." >&2
    exit 1
fi
echo "install-sandbox: $(bwrap --version) works here"
