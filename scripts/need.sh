# Sourced by scripts/run and scripts/test: install Debian packages when a
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
