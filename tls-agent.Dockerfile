# syntax=docker/dockerfile:1
# The TLS reload agent's own image:
# `make docker-build-tls-agent TLS_AGENT_IMG=registry/memcached-tls-agent:tag`.
# Pools whose certificate is reloaded in place run it as a sidecar (--tls-agent-image);
# pools created before 0.2.0 keep running the agent from the operator's image they were
# created with, until their next rollout.
#
# As the operator's Dockerfile: stage 1 builds a statically linked binary (musl, the
# default target of rust:alpine), stage 2 is distroless/static (no shell, no libc, a
# nonroot user). The pod runs the agent as memcached's user (11211) anyway.

FROM rust:1-alpine AS builder
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
RUN cargo build --release --locked -p memcached-tls-agent \
 && cp target/release/memcached-tls-agent /memcached-tls-agent

FROM gcr.io/distroless/static:nonroot
COPY --from=builder /memcached-tls-agent /memcached-tls-agent
USER 65532:65532
ENTRYPOINT ["/memcached-tls-agent"]
