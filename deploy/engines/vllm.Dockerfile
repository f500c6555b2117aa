# The vllm server's image with triton-warmup installed: the chart's warmup init container
# runs in it (engine.name=vllm), so what it restores and checks is made by the server's own
# torch, Triton and vllm. Pin both versions; the chart refuses a `latest` tag.
#   docker build -f deploy/engines/vllm.Dockerfile -t REGISTRY/vllm-warm:v0.19.1-tw0.1.0 deploy/engines
#   helm install ... --set engine.name=vllm --set server.image.repository=REGISTRY/vllm-warm \
#     --set server.image.tag=v0.19.1-tw0.1.0 --set engine.model=/models/MODEL
FROM vllm/vllm-openai:v0.19.1
# triton-warmup's own dependencies (none is torch or triton), then the package without
# its dependencies: the engine's torch and Triton stay as they are (docs/kubernetes.md).
RUN python3 -m pip install --no-cache-dir "pydantic>=2.7,<3" "pydantic-settings>=2.3,<3" \
      "prometheus-client>=0.20,<1" "watchdog>=4,<8" "filelock>=4,<5" "pyyaml>=6,<7" "h11>=0.16,<1" \
      "cryptography>=42,<60" \
 && python3 -m pip install --no-cache-dir --no-deps triton-warmup==0.1.0 \
 && triton-warmup doctor --only compiler
