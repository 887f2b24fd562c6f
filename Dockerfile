# syntax=docker/dockerfile:1
# Multi-stage: build a static binary, ship it on a small image with CA certificates and a
# non-root user.
# The Go of go.mod's go line, or later: the golang image sets GOTOOLCHAIN=local, so an older
# one (such as a cached golang:1.26) stops at go mod download.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/outboxd ./cmd/outboxd

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 outboxd \
    && useradd --system --uid 10001 --gid 10001 --no-create-home outboxd
COPY --from=build /out/outboxd /usr/local/bin/outboxd
# Numeric, so that a cluster requiring non-root users (Kubernetes runAsNonRoot) can tell.
USER 10001:10001
ENV OUTBOX_HTTP_ADDR=:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/outboxd"]
CMD ["serve"]
