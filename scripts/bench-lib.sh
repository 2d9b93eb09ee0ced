# Sourced by the scripts that start services on loopback (bench, bench-ab,
# bench-cluster, bench-conditions, bench-cores, bench-ir, bench-store,
# bench-wrk, build-pgo, s3-tests): free ports, waiting for
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

# start_garage DIR: a one-node Garage (GARAGE_BIN, sqlite metadata) in DIR
# with the bucket `bench`, its key allowed to create more. Sets G_S3 (its
# S3 port), G_KEY and G_SECRET; its pid joins PIDS. Garage's region is
# `garage`.
start_garage() {
    local dir=$1 rpc node key_out
    [ -x "$GARAGE_BIN" ] || { echo "Garage not found at $GARAGE_BIN (cargo install --locked garage --version 2.5.0)"; exit 1; }
    rpc=$(free_port) G_S3=$(free_port)
    mkdir -p "$dir"
    cat > "$dir/garage.toml" <<GARAGE
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$rpc"
rpc_public_addr = "127.0.0.1:$rpc"
rpc_secret = "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$G_S3"
root_domain = ".s3.garage.localhost"
GARAGE
    garage() { "$GARAGE_BIN" -c "$dir/garage.toml" "$@"; }
    RUST_LOG=warn "$GARAGE_BIN" -c "$dir/garage.toml" server 2> "$dir/garage.log" &
    PIDS+=($!)
    G_PID=$!
    for _ in $(seq 150); do garage status >/dev/null 2>&1 && break; sleep 0.2; done
    node=$(garage node id -q | head -1 | cut -d@ -f1)
    garage layout assign -z dc1 -c 100G "$node" >/dev/null
    garage layout apply --version 1 >/dev/null
    key_out=$(garage key create fencegate-backend)
    G_KEY=$(sed -n 's/^ *Key ID: *//p' <<<"$key_out")
    G_SECRET=$(sed -n 's/^ *Secret key: *//p' <<<"$key_out")
    garage key allow --create-bucket fencegate-backend >/dev/null
    garage bucket create bench >/dev/null
    garage bucket allow --read --write --owner bench --key fencegate-backend >/dev/null
    wait_port "$G_S3"
}
