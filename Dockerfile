# Herald's container image: compiled in the Rust image, run in distroless
# (glibc, CA certificates, no shell) as the non-root user 65532, data in
# /data, listening on 0.0.0.0:8080.
#
#   docker build -t herald .
#   docker run -p 8080:8080 -v herald-data:/data herald
#
# BINARY_FROM=prebuilt takes the binary from deploy/.build/herald instead of
# compiling it (what deploy/check-image does in CI, which has built it).
ARG BINARY_FROM=build

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p herald --bin herald \
 && objcopy --strip-debug target/release/herald /herald \
 && mkdir /data

FROM scratch AS prebuilt
COPY deploy/.build/herald /herald
COPY deploy/.build/data /data

FROM ${BINARY_FROM} AS binary

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="Herald" \
      org.opencontainers.image.description="Durable, signed, retried outbound webhooks (Svix-compatible API)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/herald-webhooks/herald" \
      org.opencontainers.image.documentation="docs/docker.md"
COPY --from=binary /herald /usr/local/bin/herald
COPY --from=binary --chown=65532:65532 /data /data
ENV HERALD_LISTEN=0.0.0.0:8080 \
    HERALD_DATABASE_URL=sqlite:///data/herald.db
VOLUME ["/data"]
EXPOSE 8080
USER 65532:65532
# Herald handles SIGTERM itself (it is PID 1 here): it stops taking work,
# lets requests in flight finish and exits 0.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/herald", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/herald"]
CMD ["serve"]
