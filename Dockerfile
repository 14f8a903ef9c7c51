# rankserve: the binary on an NVIDIA CUDA runtime base (docs/deploy.md).
#
# The binary loads CUDA dynamically (cudarc): on a node with an NVIDIA GPU and the NVIDIA
# container runtime it finds the driver the runtime mounts and this image's NVRTC and cuBLAS;
# without a GPU the same image serves on the CPU (the GPU probe says why in /readyz).
#
#   docker build -t rankserve .
#   docker run -p 8080:8080 -v /data/index:/index rankserve serve --index /index

# Builder: the toolchain of Cargo.lock's era; the lock is honoured (--locked).
FROM rust:1.95-bookworm AS builder
WORKDIR /src
# The whole tree (.dockerignore leaves out build outputs): the manifest names tests and benches.
COPY . .
RUN cargo build --release --locked --bin rankserve \
    && strip target/release/rankserve

# Runtime: CUDA 13's libraries (NVRTC, cuBLAS) for the kernels compiled at start-up.
FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04
RUN groupadd --system --gid 10001 rankserve \
    && useradd --system --uid 10001 --gid rankserve --home-dir /var/lib/rankserve --create-home rankserve
COPY --from=builder /src/target/release/rankserve /usr/local/bin/rankserve
COPY rankers /etc/rankserve/rankers
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001
WORKDIR /var/lib/rankserve
ENV RANKSERVE_ADDR=0.0.0.0:8080 \
    RANKSERVE_RANKERS=/etc/rankserve/rankers \
    RANKSERVE_DATA_DIR=/var/lib/rankserve \
    RANKSERVE_LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/rankserve"]
CMD ["serve"]
