# InternLM/xtuner#793: the user's config (settings part as posted; the rest as xtuner's qwen1_5 full configs).
# Launch: NPROC_PER_NODE=8 xtuner train qwen1_5_32b_chat --deepspeed deepspeed_zero3
from mmengine.optim import AmpOptimWrapper
from torch.optim import AdamW
from transformers import AutoModelForCausalLM, AutoTokenizer
from xtuner.model import SupervisedFinetune

pretrained_model_name_or_path = 'Qwen/Qwen1.5-32B-Chat'
use_varlen_attn = False
max_length = 200
pack_to_max_length = False
sequence_parallel_size = 1
batch_size = 1  # per_device
accumulative_counts = 1
accumulative_counts *= sequence_parallel_size
dataloader_num_workers = 0
max_epochs = 3
optim_type = AdamW
lr = 1e-5
betas = (0.9, 0.999)
weight_decay = 0
max_norm = 1  # grad clip
warmup_ratio = 0.03
save_steps = 500
save_total_limit = 1

model = dict(
    type=SupervisedFinetune,
    use_varlen_attn=use_varlen_attn,
    llm=dict(
        type=AutoModelForCausalLM.from_pretrained,
        pretrained_model_name_or_path=pretrained_model_name_or_path,
        trust_remote_code=True))

train_dataloader = dict(batch_size=batch_size, num_workers=dataloader_num_workers)

optim_wrapper = dict(
    type=AmpOptimWrapper,
    optimizer=dict(type=optim_type, lr=lr, betas=betas, weight_decay=weight_decay),
    clip_grad=dict(max_norm=max_norm, error_if_nonfinite=False),
    accumulative_counts=accumulative_counts,
    loss_scale='dynamic',
    dtype='float16')
