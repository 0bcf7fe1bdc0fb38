"""DS008 deepspeed.z3-16bit-gather-host-ram: the 16-bit gather at save lands the whole model on rank 0's host.

Why it matters: with `stage3_gather_16bit_weights_on_model_save: true`, HF Trainer's save calls
`_zero3_consolidated_16bit_state_dict()`, which gathers the model module by module and copies every tensor
to rank 0's CPU (DeepSpeed PR #893's design). (LoRA/QLoRA through HF Trainer on transformers >= 5.0 are not
reported: there Trainer.save_model gathers only the adapters, `exclude_frozen_parameters=True`, read in
5.17.0-5.23.0; on 4.x or an unknown version it gathers the whole base model, and turning the gather off is no fix
there: it writes an empty adapter file, DS007. Custom save functions that call `get_state_dict` on the engine
always gather the whole base model.) Rank 0's host therefore grows by about 2 bytes per parameter at every save, on top of
everything the node already holds (offloaded optimizer states, the other ranks): DeepSeek-Coder-V2 236B needs
about 472 GB extra on node 0 (hiyouga/LlamaFactory#7532; transformers#21482: "they have to consolidate it first on cpu
and that's where there might not be enough of memory").

Fixes: save adapters only for LoRA, keep gather off and convert offline with `zero_to_fp32.py`, or give node 0
the RAM. Reported as information when the model is large and the host size unknown.
"""

from __future__ import annotations

from collections.abc import Iterator

from zerodoctor.findings import Finding, Fix, Severity
from zerodoctor.lint.rule import Rule
from zerodoctor.lint.rules._common import gib, save_gather, trainer_peft_save, transformers_shown, truthy
from zerodoctor.setup.run import RunDescription

KEY = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
LARGE_GATHER = 100 * 2**30  # above this a rank-0 spike is worth knowing about even without host facts


def check(run: RunDescription) -> Iterator[Finding]:
    setup = run.files
    if (
        setup.ds_written is None
        or setup.zero_stage != 3
        or setup.total_params is None
        or trainer_peft_save(run) == "adapters"
    ):
        return
    if truthy(setup.ds_flat().get(KEY)) is not True:
        return
    gather = save_gather(run)
    assert gather is not None  # the model is known
    spike, held, ram = gather.spike, gather.held, gather.ram
    fixes = [
        Fix(
            "Turn the gather off and convert offline: python zero_to_fp32.py <ckpt> <out>",
            target="deepspeed",
            patch={KEY: False},
        )
    ]
    trainer_peft = trainer_peft_save(run) is not None
    if trainer_peft:
        # gather off would write an empty adapter file (DS007): the ways out are transformers 5.0 or the RAM
        fixes = [Fix("Upgrade transformers to 5.0 or later: its save gathers only the adapters")]
    elif setup.method in ("lora", "qlora"):
        fixes.insert(0, Fix("Save only the adapters (the base model is unchanged)"))
    whose = f" (HF Trainer's LoRA/QLoRA save on {transformers_shown(run)}; 5.0 and later gather only the adapters)"
    whose = whose if trainer_peft else ""
    ev = [setup.ds_evidence(KEY)]
    if ram:
        total = spike + held
        if gather.fits:
            return  # the host has room for the spike on top of what it holds
        assert run.cluster.host_ram_bytes is not None
        ev.append(run.cluster.host_ram_bytes.origin.evidence(gib(ram)))
        also = (
            f" on top of about {gib(held)} of offloaded model states it already holds,"
            if held
            else ", on top of the running job,"
        )
        yield RULE.finding(
            f"Each save gathers the 16-bit model onto rank 0's host: about {gib(spike)} for "
            f"{setup.total_params / 1e9:,.1f}B parameters{whose}{also} on a node with {gib(ram)}. "
            "Expect a host OOM kill (exitcode -9) or a stall at the first save.",
            evidence=ev,
            fixes=fixes,
            severity=Severity.ERROR if total > ram else Severity.WARNING,
        )
    elif spike >= LARGE_GATHER:
        yield RULE.finding(
            f"Each save gathers the 16-bit model onto rank 0's host: about {gib(spike)} for "
            f"{setup.total_params / 1e9:,.1f}B parameters{whose}, on top of the node's training state. Check node 0's RAM "
            "(give --env from a node to compare).",
            evidence=ev,
            fixes=fixes,
            severity=Severity.INFO,
        )


RULE = Rule(
    code="DS008",
    name="deepspeed.z3-16bit-gather-host-ram",
    title="ZeRO-3 16-bit gather at save vs rank-0 host RAM",
    severity=Severity.WARNING,
    references=("huggingface/transformers#21482", "hiyouga/LlamaFactory#7532", "deepspeedai/DeepSpeed#893"),
    check=check,
)
