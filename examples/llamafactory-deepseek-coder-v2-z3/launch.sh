# 6 nodes x 8 GPUs (48 x 80 GB), run on every node with its NODE_RANK (LLaMA-Factory README multi-node form):
FORCE_TORCHRUN=1 NNODES=6 NODE_RANK=${NODE_RANK} MASTER_ADDR=${MASTER_ADDR} MASTER_PORT=29500 \
  llamafactory-cli train deepseek_coder_v2_full_sft.yaml
