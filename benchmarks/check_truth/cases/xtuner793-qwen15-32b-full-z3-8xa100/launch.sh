NPROC_PER_NODE=8 xtuner train qwen1_5_32b_chat_full.py --deepspeed deepspeed_zero3
