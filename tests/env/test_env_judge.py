"""Each ENV rule fires where it should and stays silent where it lacks facts (no false alarms)."""

from __future__ import annotations

import dataclasses

import pytest

from zerodoctor.env import judge_environment
from zerodoctor.env.model import DeepSpeedInfo, Environment, GpuInfo, HostInfo, PackageInfo, TorchInfo
from zerodoctor.findings import Severity

MiB, GiB = 1024**2, 1024**3
OFFLOAD_PINNED = {
    "ds.zero_optimization.offload_optimizer.device": "cpu",
    "ds.zero_optimization.offload_optimizer.pin_memory": True,
}
NO_OFFLOAD = {
    "ds.zero_optimization.offload_optimizer.device": "none",
    "ds.zero_optimization.offload_param.device": "none",
}


def gpu(i: int) -> GpuInfo:
    return GpuInfo(i, "NVIDIA H100 80GB HBM3", 80 * GiB, "550.54.15", "12.4")


def make_env(**kw) -> Environment:
    """A healthy 8-GPU node; each test breaks one thing."""
    base = dict(
        python="3.10.12",
        platform="Linux",
        packages={
            "deepspeed": PackageInfo("deepspeed", "0.16.9"),
            "torch": PackageInfo("torch", "2.4.0+cu121"),
        },
        packages_complete=True,
        torch=TorchInfo("2.4.0+cu121", cuda="12.1"),
        deepspeed=DeepSpeedInfo(
            "0.16.9",
            installed_ops={"cpu_adam": False},
            compatible_ops={"cpu_adam": True},
            accelerator="cuda",
            installed_accelerator="cuda",
            import_ok=True,
        ),
        gpus=[gpu(i) for i in range(8)],
        gpus_probed=True,
        host=HostInfo(
            ram_total_bytes=1024 * GiB,
            ram_available_bytes=900 * GiB,
            swap_total_bytes=0,
            shm_total_bytes=500 * GiB,
            shm_free_bytes=500 * GiB,
            memlock_soft_bytes=None,
            memlock_hard_bytes=None,
            memlock_known=True,
            cpu_count=96,
        ),
        cuda_home="/usr/local/cuda",
        nvcc_version="12.1",
    )
    base.update(kw)
    return Environment(**base)


def host(**kw) -> HostInfo:
    return dataclasses.replace(make_env().host, **kw)


def run(env: Environment, facts=None) -> dict[str, object]:
    return {f.id: f for f in judge_environment(env, facts, include_kb=False)}


def test_healthy_node_is_silent():
    assert run(make_env()) == {}
    assert run(make_env(), OFFLOAD_PINNED) == {}


# ENV001 -------------------------------------------------------------------------------------------------


def test_env001_docker_default_shm_with_8_gpus_is_an_error():
    f = run(make_env(host=host(shm_total_bytes=64 * MiB)))["ENV001"]
    assert f.severity is Severity.ERROR and f.name == "env.small-dev-shm"
    assert "64.0 MiB" in f.message and "8 GPUs" in f.message and "--shm-size" in f.message
    assert "NVIDIA/nccl#290" in f.references and f.evidence[0].key == "host.shm_total_bytes"


def test_env001_unknown_gpu_count_with_nccl_is_a_warning():
    env = make_env(
        host=host(shm_total_bytes=256 * MiB), gpus=[], gpus_probed=False, env_vars={"NCCL_DEBUG": "INFO"}
    )
    assert run(env)["ENV001"].severity is Severity.WARNING


@pytest.mark.parametrize(
    "kw",
    [
        {"host": host(shm_total_bytes=16 * GiB)},
        {"host": host(shm_total_bytes=64 * MiB), "gpus": [gpu(0)]},
        {"host": host(shm_total_bytes=64 * MiB), "env_vars": {"CUDA_VISIBLE_DEVICES": "0"}},
        {"host": host(shm_total_bytes=64 * MiB), "env_vars": {"NCCL_SHM_DISABLE": "1"}},
        {"host": host(shm_total_bytes=64 * MiB), "gpus": [], "gpus_probed": False},  # no NCCL hint
        {"host": host(shm_total_bytes=None)},
    ],
)
def test_env001_silent(kw):
    assert "ENV001" not in run(make_env(**kw))


# ENV002 -------------------------------------------------------------------------------------------------


def test_env002_low_memlock_with_pinned_offload_warns():
    f = run(make_env(host=host(memlock_soft_bytes=8 * MiB, memlock_hard_bytes=8 * MiB)), OFFLOAD_PINNED)[
        "ENV002"
    ]
    assert f.severity is Severity.WARNING and f.name == "env.low-memlock-with-pinned-offload"
    assert "8.0 MiB" in f.message and "ulimit -l unlimited" in f.message and "not confirmed" in f.message
    assert f.data["confirmed"] is False


def test_env002_without_facts_is_info_only():
    f = run(make_env(host=host(memlock_soft_bytes=64 * 1024)))["ENV002"]
    assert f.severity is Severity.INFO


@pytest.mark.parametrize(
    ("memlock", "facts"),
    [
        (None, OFFLOAD_PINNED),  # unlimited
        (64 * GiB, OFFLOAD_PINNED),
        (8 * MiB, NO_OFFLOAD),
        (
            8 * MiB,
            {
                **OFFLOAD_PINNED,
                "ds.zero_optimization.offload_optimizer.pin_memory": False,
                "ds.zero_optimization.offload_param.device": "none",
            },
        ),
    ],
)
def test_env002_silent(memlock, facts):
    assert "ENV002" not in run(make_env(host=host(memlock_soft_bytes=memlock)), facts)


def test_env002_silent_when_limit_unknown():
    assert "ENV002" not in run(
        make_env(host=host(memlock_known=False, memlock_soft_bytes=None)), OFFLOAD_PINNED
    )


# ENV003 -------------------------------------------------------------------------------------------------


def test_env003_major_mismatch_with_offload_is_an_error():
    f = run(make_env(nvcc_version="12.1", torch=TorchInfo("2.1.0+cu118", cuda="11.8")), OFFLOAD_PINNED)[
        "ENV003"
    ]
    assert f.severity is Severity.ERROR and "CUDAMismatchException" in f.message
    assert "12.1" in f.message and "11.8" in f.message and "deepspeedai/DeepSpeed#1846" in f.references


def test_env003_major_mismatch_without_setup_is_a_warning():
    f = run(make_env(nvcc_version="12.1", torch=TorchInfo("2.1.0+cu118", cuda="11.8")))["ENV003"]
    assert f.severity is Severity.WARNING


def test_env003_prebuilt_cpu_adam_lowers_severity():
    ds = DeepSpeedInfo(
        "0.16.9",
        installed_ops={"cpu_adam": True},
        accelerator="cuda",
        installed_accelerator="cuda",
        import_ok=True,
    )
    f = run(make_env(nvcc_version="12.1", torch=TorchInfo("x", cuda="11.8"), deepspeed=ds), OFFLOAD_PINNED)[
        "ENV003"
    ]
    assert f.severity is Severity.WARNING and "prebuilt" in f.message


def test_env003_minor_mismatch_accepted_by_deepspeed_is_info():
    f = run(make_env(nvcc_version="12.4", torch=TorchInfo("x", cuda="12.1")), OFFLOAD_PINNED)["ENV003"]
    assert f.severity is Severity.INFO


def test_env003_skip_cuda_check_is_info():
    env = make_env(
        nvcc_version="12.1", torch=TorchInfo("x", cuda="11.8"), env_vars={"DS_SKIP_CUDA_CHECK": "1"}
    )
    assert run(env, OFFLOAD_PINNED)["ENV003"].severity is Severity.INFO


@pytest.mark.parametrize(
    "kw",
    [
        {"nvcc_version": "12.1"},  # matches 12.1
        {"nvcc_version": None},
        {"torch": TorchInfo("2.4.0+cpu", cuda=None)},
        {"torch": TorchInfo("2.3.1", build_known=False)},
        {"torch": None},
    ],
)
def test_env003_silent(kw):
    assert "ENV003" not in run(make_env(**kw), OFFLOAD_PINNED)


# ENV004 -------------------------------------------------------------------------------------------------

BAD_DS = DeepSpeedInfo(
    "0.16.9",
    installed_ops={"cpu_adam": False},
    compatible_ops={"cpu_adam": False},
    compat_errors={"cpu_adam": "MissingCUDAException: CUDA_HOME does not exist"},
    accelerator="cuda",
    import_ok=True,
)


def test_env004_offload_without_cpu_adam_warns():
    f = run(make_env(deepspeed=BAD_DS), OFFLOAD_PINNED)["ENV004"]
    assert f.severity is Severity.WARNING and f.name == "env.cpu-adam-unavailable"
    assert "CUDA_HOME does not exist" in f.message and "DS_BUILD_CPU_ADAM=1" in f.fixes[1].text


def test_env004_without_facts_is_info():
    assert run(make_env(deepspeed=BAD_DS))["ENV004"].severity is Severity.INFO


def test_env004_unknown_compatibility_is_info_could_not_check():
    ds = dataclasses.replace(BAD_DS, compatible_ops={}, probe_note="deep probe off")
    f = run(make_env(deepspeed=ds), OFFLOAD_PINNED)["ENV004"]
    assert f.severity is Severity.INFO and "not checked" in f.message
    assert "ENV004" not in run(make_env(deepspeed=ds))  # and without a setup: silent


def test_env004_uses_the_optimizer_op():
    ds = dataclasses.replace(BAD_DS, compatible_ops={"cpu_adam": False, "cpu_lion": True})
    assert "ENV004" not in run(make_env(deepspeed=ds), {**OFFLOAD_PINNED, "ds.optimizer.type": "Lion"})


@pytest.mark.parametrize(
    ("ds", "facts"),
    [
        (dataclasses.replace(BAD_DS, compatible_ops={"cpu_adam": True}), OFFLOAD_PINNED),
        (
            dataclasses.replace(BAD_DS, installed_ops={"cpu_adam": True}, installed_accelerator="cuda"),
            OFFLOAD_PINNED,
        ),
        (BAD_DS, NO_OFFLOAD),
        (None, OFFLOAD_PINNED),
    ],
)
def test_env004_silent(ds, facts):
    assert "ENV004" not in run(make_env(deepspeed=ds), facts)


def test_env004_prebuilt_for_another_accelerator_does_not_count():
    ds = dataclasses.replace(BAD_DS, installed_ops={"cpu_adam": True}, installed_accelerator="cpu")
    assert "ENV004" in run(make_env(deepspeed=ds), OFFLOAD_PINNED)


# ENV005 / ENV006 -----------------------------------------------------------------------------------------


def test_env005_broken_deepspeed():
    ds = DeepSpeedInfo(
        "0.16.9", import_ok=False, import_error="import deepspeed failed: ImportError: libcudart.so.11.0"
    )
    f = run(make_env(deepspeed=ds))["ENV005"]
    assert f.severity is Severity.ERROR and "libcudart" in f.message
    assert "ENV004" not in run(make_env(deepspeed=ds), OFFLOAD_PINNED)


@pytest.mark.parametrize("import_ok", [True, None])
def test_env005_silent(import_ok):
    assert "ENV005" not in run(make_env(deepspeed=dataclasses.replace(BAD_DS, import_ok=import_ok)))


def test_env006_no_gpu_is_info():
    f = run(make_env(gpus=[], gpu_probe_note="no GPU: NVML could not start (NVML Shared Library Not Found)"))[
        "ENV006"
    ]
    assert f.severity is Severity.INFO and "NVML Shared Library Not Found" in f.message


def test_env006_silent_when_not_probed():
    assert "ENV006" not in run(make_env(gpus=[], gpus_probed=False))


def test_findings_carry_source_and_names():
    env = make_env(
        host=host(shm_total_bytes=64 * MiB, memlock_soft_bytes=8 * MiB),
        deepspeed=BAD_DS,
        gpus=[],
        gpus_probed=True,
    )
    for f in judge_environment(env, include_kb=False):
        assert f.source == "env" and f.name and f.name.startswith("env.") and f.message


# known-bad versions from the KB ---------------------------------------------------------------------------


def test_known_bad_deepspeed_version_from_the_kb():
    preflight = pytest.importorskip("zerodoctor.kb.preflight")
    assert preflight.known_failures  # the agreed signature: known_failures(versions, facts)
    env = make_env(packages={"deepspeed": PackageInfo("deepspeed", "0.14.2")})
    facts = {**OFFLOAD_PINNED, "ds.zero_optimization.stage": 3, "ds.gradient_clipping": 1.0}
    ids = {f.id for f in judge_environment(env, facts)}
    assert "ds-z3-offload-clipgrad-device-mismatch" in ids
    ok = make_env(packages={"deepspeed": PackageInfo("deepspeed", "0.14.3")})
    assert "ds-z3-offload-clipgrad-device-mismatch" not in {f.id for f in judge_environment(ok, facts)}


def test_env_text_shows_the_table_once(run_cli):
    code, out, err = run_cli("env", "--no-deep", "--fail-on", "never")
    assert code == 0, err
    assert out.count("Environment (") == 1, out


@pytest.mark.parametrize(
    ("ds", "arch", "fires"),
    [
        ("0.19.8", "9.0a", True),  # NVIDIA's H100 images: DeepSpeed >= 0.19 cannot sort it (int('0a'))
        ("0.19.8", "8.0;9.0+PTX", False),  # +PTX is stripped before int()
        ("0.18.0", "9.0a", False),  # a plain sort before 0.19.0
        ("0.19.8", None, False),  # no arch list in the snapshot: unknown, never a warning
    ],
)
def test_a_suffixed_cuda_arch_list_is_named_before_launch_on_deepspeed_019(ds, arch, fires):
    env = make_env(
        packages={"deepspeed": PackageInfo("deepspeed", ds), "torch": PackageInfo("torch", "2.4.0+cu121")},
        deepspeed=dataclasses.replace(make_env().deepspeed, version=ds),
        env_vars={} if arch is None else {"TORCH_CUDA_ARCH_LIST": arch},
    )
    ids = {f.id for f in judge_environment(env)}
    assert ("ds-cuda-arch-suffix-jit-build" in ids) is fires, ids
