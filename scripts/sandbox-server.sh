#!/usr/bin/env bash
# sandbox-server.sh: a real OpenSSH server on loopback that plays the "GPU server" for the demo,
# the tests and anyone trying gpusync without a server. One implementation, used by all three.
#
#   sandbox-server.sh start [--dir DIR] [--port N] [--password-user NAME:PASSWORD] [--new-host-key]
#                           [--sftp-server PATH] [--keep-config]
#   sandbox-server.sh stop DIR
#
# start prints shell assignments (GS_SANDBOX_PORT, GS_SANDBOX_PID, GS_SANDBOX_DIR, GS_SANDBOX_HOME)
# once sshd accepts connections. DIR/home is a HOME for the client: .ssh/id_ed25519 is authorised on
# the server and .ssh/known_hosts is left empty, so host-key prompts behave as for a new user.
# --sftp-server runs SFTP as most servers do, a program started through the user's login shell
# (so its rc files run first), instead of sshd's built-in internal-sftp. --keep-config (with --dir
# and --port) restarts from DIR's sshd_config as it stands, which a test may have edited.
set -euo pipefail

die() { echo "sandbox-server: $*" >&2; exit 1; }

usage() {
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
}

make_keys() {
    local dir=$1 new_host_key=$2
    mkdir -p "$dir/home/.ssh"
    chmod 700 "$dir/home" "$dir/home/.ssh"
    if [[ ! -f $dir/host_ed25519 || $new_host_key == 1 ]]; then
        rm -f "$dir/host_ed25519" "$dir/host_ed25519.pub"
        ssh-keygen -q -t ed25519 -N '' -C sandbox-host -f "$dir/host_ed25519"
    fi
    if [[ ! -f $dir/home/.ssh/id_ed25519 ]]; then
        ssh-keygen -q -t ed25519 -N '' -C sandbox-client -f "$dir/home/.ssh/id_ed25519"
        cp "$dir/home/.ssh/id_ed25519.pub" "$dir/authorized_keys"
    fi
    touch "$dir/home/.ssh/known_hosts"
}

make_password_user() {
    local name=${1%%:*} password=${1#*:}
    id "$name" >/dev/null 2>&1 || useradd -m -s /bin/bash "$name"
    echo "$name:$password" | chpasswd
}

write_config() {
    local dir=$1 port=$2 use_pam=$3 sftp_server=$4
    cat >"$dir/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys .ssh/authorized_keys
PermitRootLogin yes
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication $use_pam
KbdInteractiveAuthentication no
UsePAM $use_pam
Subsystem sftp $sftp_server
MaxStartups 100
MaxSessions 20
LogLevel INFO
CONF
}

# Starts sshd on $port and waits for its "Server listening" line; returns 1 if the port was taken.
launch() {
    local dir=$1 port=$2
    : >"$dir/sshd.log"
    setsid /usr/sbin/sshd -D -e -f "$dir/sshd_config" >>"$dir/sshd.log" 2>&1 </dev/null &
    local pid=$!
    for _ in $(seq 1 500); do
        grep -q 'Server listening' "$dir/sshd.log" && { echo "$pid" >"$dir/sshd.pid.main"; return 0; }
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.01
    done
    kill "$pid" 2>/dev/null
    die "sshd did not start within 5 s; see $dir/sshd.log"
}

start() {
    local dir="" port="" pwuser="" new_host_key=0 sftp_server=internal-sftp keep_config=0
    while [[ $# -gt 0 ]]; do
        case $1 in
        --dir) dir=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --password-user) pwuser=$2; shift 2 ;;
        --new-host-key) new_host_key=1; shift ;;
        --sftp-server) sftp_server=$2; shift 2 ;;
        --keep-config) keep_config=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
        esac
    done
    [[ -x /usr/sbin/sshd ]] || die "/usr/sbin/sshd not found: run scripts/setup.sh (installs openssh-server)"
    [[ -n $dir ]] || dir=$(mktemp -d /tmp/gpusync-sandbox.XXXXXX)
    mkdir -p "$dir" /run/sshd
    dir=$(cd "$dir" && pwd)
    make_keys "$dir" "$new_host_key"
    local use_pam=no
    [[ -n $pwuser ]] && { make_password_user "$pwuser"; use_pam=yes; }
    if [[ $keep_config == 1 ]]; then
        [[ -n $port && -f $dir/sshd_config ]] || die "--keep-config needs --port and DIR/sshd_config"
    fi
    local tries=0
    while :; do
        local p=${port:-$((20000 + RANDOM % 30000))}
        [[ $keep_config == 1 ]] || write_config "$dir" "$p" "$use_pam" "$sftp_server"
        if launch "$dir" "$p"; then port=$p; break; fi
        [[ -z $port ]] || die "port $port is in use; see $dir/sshd.log"
        tries=$((tries + 1)); [[ $tries -lt 20 ]] || die "no free port found"
    done
    echo "$port" >"$dir/port"
    echo "GS_SANDBOX_PORT=$port"
    echo "GS_SANDBOX_PID=$(cat "$dir/sshd.pid.main")"
    echo "GS_SANDBOX_DIR=$dir"
    echo "GS_SANDBOX_HOME=$dir/home"
}

stop() {
    local dir=${1:?usage: sandbox-server.sh stop DIR}
    [[ -f $dir/sshd.pid.main ]] || exit 0
    local pid
    pid=$(cat "$dir/sshd.pid.main")
    # sshd runs in its own session, and each connection's child calls setsid(): end the
    # connections (children of the listener) and then the listener's group.
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    rm -f "$dir/sshd.pid.main"
}

case ${1:-} in
start) shift; start "$@" ;;
stop) shift; stop "$@" ;;
-h|--help|"") usage ;;
*) die "unknown command $1 (start, stop)" ;;
esac
