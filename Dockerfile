# syntax=docker/dockerfile:1
# The tether image: `tether serve` (and every other subcommand) as a release
# binary on Debian slim, run as the non-root user 10001 that the Helm chart
# (helm/tether) expects. docs/OPERATIONS.md, "The image", says what the
# runtime stage must contain and how that was checked.
#
#   docker build -t tether:0.1.0 .
#   docker run --rm -p 8080:8080 tether:0.1.0          # embedded SQLite, demo-grade
#
# Build stage: the Rust toolchain plus gcc (the bundled SQLite is C). No
# protoc is needed: build.rs compiles the protobuf files with protox.
FROM rust:1.89-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tether \
    && install -m 0755 target/release/tether /usr/local/bin/tether

# Runtime stage: the same Debian release as the build stage (the binary needs
# its glibc), CA certificates for the system trust roots (TLS to servers and
# from daemons), coreutils' `sleep` for the chart's preStop hook; no compiler,
# no package manager caches, no shell use at run time.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 tether \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tether --shell /usr/sbin/nologin tether \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/tether \
    && install -d -m 0755 /etc/tether
COPY --from=build /usr/local/bin/tether /usr/local/bin/tether
USER 10001:10001
WORKDIR /var/lib/tether
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tether"]
# The chart replaces this with `serve` and a settings file (its listen address
# comes from there); `--listen` here makes a plain `docker run` reachable.
CMD ["serve", "--listen", "0.0.0.0:8080"]
