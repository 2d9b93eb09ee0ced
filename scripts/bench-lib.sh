# Sourced by the scripts that start services on loopback (bench,
# bench-cluster, bench-ir, bench-wrk, build-pgo): free ports, waiting for
# a listener, the processes stopped on exit, and fencegate's configuration
# in front of a backend, written once here.

# The processes to stop on exit: add each one's pid.
PIDS=()
stop_pids() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_port PORT [SECONDS]: until something listens on 127.0.0.1:PORT
# (10 s by default; a proxy under valgrind needs longer).
wait_port() {
    for _ in $(seq $((${2:-10} * 10))); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    exit 1
}

# fencegate_config DIR PORT ENDPOINT [REGION KEY SECRET]: DIR/fencegate.toml,
# fencegate's default settings on 127.0.0.1:PORT (its admin API on a free
# port, its data in DIR/data) in front of ENDPOINT, by default as the sink's
# credential (`fencegate bench sink` verifies no signature).
fencegate_config() {
    mkdir -p "$1"
    cat > "$1/fencegate.toml" <<CONF
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$(free_port)"
data_dir = "$1/data"

[backend]
kind = "s3"
endpoint = "$3"
region = "${4:-us-east-1}"
access_key_id = "${5:-sink}"
secret_access_key = "${6:-sink-secret}"
CONF
}
