# syntax=docker/dockerfile:1
# The memcached-operator image: `make docker-build docker-push IMG=registry/memcached-operator:tag`.
#
# Stage 1 builds a statically linked binary (musl, the default target of rust:alpine) with
# exactly the cargo command of `make build-release`. Stage 2 is distroless/static: no shell,
# no libc, CA certificates and a nonroot user (65532) only. Expected image size: about
# 20-30 MB (the binary; the base is ~2 MB).

FROM rust:1-alpine AS builder
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
RUN cargo build --release --locked -p memcached-operator \
 && cp target/release/memcached-operator /memcached-operator

FROM gcr.io/distroless/static:nonroot
COPY --from=builder /memcached-operator /memcached-operator
USER 65532:65532
ENTRYPOINT ["/memcached-operator"]
CMD ["run"]
