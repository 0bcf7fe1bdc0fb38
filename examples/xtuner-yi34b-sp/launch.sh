# 8 GPUs, one node; `--deepspeed deepspeed_zero3_offload` is resolved by name to
# xtuner/configs/deepspeed/deepspeed_zero3_offload.json (copy in this folder).
NPROC_PER_NODE=8 xtuner train yi_34b_200k_full_alpaca_enzh_128k_sp8.py --deepspeed deepspeed_zero3_offload
