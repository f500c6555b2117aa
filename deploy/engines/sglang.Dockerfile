# The sglang server's image with triton-warmup installed: the chart's warmup init container
# runs in it (engine.name=sglang), so what it restores and checks is made by the server's own
# torch, Triton and sglang. Pin both versions; the chart refuses a `latest` tag.
#   docker build -f deploy/engines/sglang.Dockerfile -t REGISTRY/sglang-warm:v0.5.18-cu130-tw0.1.0 deploy/engines
#   helm install ... --set engine.name=sglang --set server.image.repository=REGISTRY/sglang-warm \
#     --set server.image.tag=v0.5.18-cu130-tw0.1.0 --set engine.model=/models/MODEL
FROM lmsysorg/sglang:v0.5.18-cu130
# triton-warmup's own dependencies (none is torch or triton), then the package without
# its dependencies: the engine's torch and Triton stay as they are (docs/kubernetes.md).
RUN python3 -m pip install --no-cache-dir "pydantic>=2.7,<3" "pydantic-settings>=2.3,<3" \
      "prometheus-client>=0.20,<1" "watchdog>=4,<8" "filelock>=4,<5" "pyyaml>=6,<7" "h11>=0.16,<1" \
      "cryptography>=42,<60" \
 && python3 -m pip install --no-cache-dir --no-deps triton-warmup==0.1.0 \
 && triton-warmup doctor --only compiler
