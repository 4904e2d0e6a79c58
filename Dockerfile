# syntax=docker/dockerfile:1
# leafproxy image: the same binary `make build` makes (go build ./cmd/leafproxy), built with
# cgo because the SQL parser (pg_query_go) is C, on the glibc the runtime image has. The
# builder is pinned to the Go release go.mod requires (go 1.26.8), so the build never needs
# to download another toolchain.

FROM golang:1.26.8-bookworm AS build
ENV GOTOOLCHAIN=local
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-X main.version=${VERSION}" -o /out/leafproxy ./cmd/leafproxy \
 && /out/leafproxy version

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tzdata \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/leafproxy --create-home leafproxy
COPY --from=build /out/leafproxy /usr/local/bin/leafproxy
USER 10001:10001
WORKDIR /var/lib/leafproxy
# In a container the proxy and the admin server listen on all interfaces; publish the admin
# port only where it should be reachable, or set LEAFPROXY_HTTP_TOKEN.
ENV LEAFPROXY_LISTEN=0.0.0.0:6432 \
    LEAFPROXY_HTTP=0.0.0.0:8080
EXPOSE 6432 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["leafproxy", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["leafproxy"]
CMD ["serve"]
