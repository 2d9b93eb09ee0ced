# fencegate container image: multi-stage build, runs as an unprivileged user.
#
#   docker build -t fencegate .
#   docker run -p 127.0.0.1:9000:9000 -v fencegate-data:/var/lib/fencegate \
#       -v $PWD/my-fencegate.toml:/etc/fencegate/fencegate.toml:ro fencegate
#
# The image's default config (deploy/fencegate.container.toml) listens on
# 0.0.0.0 and names no credentials, so the built-in public demo credential
# applies, which fencegate refuses on a non-loopback listener: mount your
# own config with real [[credentials]] (fencegate refuses to start otherwise).

FROM rust:1-bookworm AS build
WORKDIR /src
# Every target Cargo.toml declares must be here for cargo to load it (the
# [[bench]] too): tests/deploy.rs loads the package from what these lines copy.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN apt-get update && apt-get install -y --no-install-recommends protobuf-compiler && rm -rf /var/lib/apt/lists/*
RUN cargo build --release --locked --bin fencegate

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system fencegate \
    && useradd --system --gid fencegate --home-dir /var/lib/fencegate --shell /usr/sbin/nologin fencegate \
    && mkdir -p /var/lib/fencegate /etc/fencegate \
    && chown fencegate:fencegate /var/lib/fencegate
COPY --from=build /src/target/release/fencegate /usr/local/bin/fencegate
COPY deploy/fencegate.container.toml /etc/fencegate/fencegate.toml
USER fencegate
WORKDIR /var/lib/fencegate
VOLUME ["/var/lib/fencegate"]
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/fencegate", "serve", "--config", "/etc/fencegate/fencegate.toml"]
