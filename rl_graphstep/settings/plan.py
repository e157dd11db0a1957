"""The run plan: how a run executes (device, CUDA graphs, compile, action stream, env kind,
precision), resolved once from the config, and the one place a capture failure changes it."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator

import torch

from rl_graphstep.core.compiling import compile_pays
from rl_graphstep.core.errors import CaptureError, CompileError, ConfigError
from rl_graphstep.envs.shared import default_workers, ordered_stores, usable_cpus
from rl_graphstep.settings.config import Config


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Every mode of a run as a decision; nothing here means "auto".

    ``graph_fallback`` and ``compile_fallback`` say whether the choice was automatic, so that
    an update that cannot be captured (or compiled) runs eagerly (or uncompiled) with a
    warning instead of stopping the run; ``insist_on_action_stream``: ``--action-stream on``,
    which warns when the action cannot run on its own stream; ``env_workers``, the shared
    env's worker processes, from the CPUs the run may use.
    """

    device: torch.device
    graphs: bool
    compile: bool
    action_stream: bool
    vec_env: str
    tf32: bool
    graph_fallback: bool = False
    compile_fallback: bool = False
    insist_on_action_stream: bool = False
    compile_note: str = ""  # why automatic compiling chose as it did
    env_workers: int = 1  # the shared env's worker processes
    acting_note: str = ""  # how the actions are chosen, where not by the off-policy pipe

    def describe(self) -> str:
        """``CUDA graphs + torch.compile, action stream, sync envs, float32 matmuls``."""
        updates = ("CUDA graphs" if self.graphs else "eager") + (
            " + torch.compile" if self.compile else "")
        acting = self.acting_note or ("action stream" if self.action_stream
                                      else "actions in line")
        precision = "TF32 matmuls" if self.tf32 else "float32 matmuls"
        return f"{updates}, {acting}, {self.vec_env} envs, {precision}"


def resolve_device(cfg: Config) -> torch.device:
    """``auto`` takes CUDA when present; ``cuda`` without a GPU is an error."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA GPU is available; "
                          "use --device auto or --device cpu")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def plan_run(cfg: Config, device: torch.device, *, updates_ahead: int,
             cpus: int | None = None) -> RunPlan:
    """The plan ``cfg`` asks for, training on ``device``; ``updates_ahead``, the updates the
    run will still make, decides automatic compiling (a short run spends less uncompiled than
    it would compiling); ``cpus``, the CPUs the run may use (default: all this process may
    run on), the vector env and its workers."""
    if cpus is not None and cpus < 1:
        raise ValueError(f"cpus must be at least 1, got {cpus}")
    cpus = cpus or usable_cpus()
    on_cuda = device.type == "cuda"
    if cfg.graph == "on" and not on_cuda:
        raise ConfigError(f"--graph on needs a CUDA device, but training runs on {device}; "
                          "use --graph auto or --graph off")
    graphs = cfg.graph == "on" or (cfg.graph == "auto" and on_cuda)
    note = ""
    if cfg.compile != "auto":
        compile = cfg.compile == "on"
    elif not graphs:
        compile = False  # eager steps stay uncompiled: their compile would fail mid-run
    else:
        compile, why = compile_pays(updates_ahead)
        note = f"compile auto: {'on' if compile else 'off'}, {why}"
    return RunPlan(device=device, graphs=graphs, compile=compile,
                   action_stream=cfg.action_stream != "off" and graphs,
                   vec_env=choose_vec_env(cfg.vec_env, cfg.num_seeds * cfg.num_envs, graphs,
                                          cpus),
                   env_workers=default_workers(cpus),
                   tf32=cfg.tf32 and device.type == "cuda",  # CPUs have no TF32
                   graph_fallback=cfg.graph == "auto" and graphs,
                   compile_fallback=cfg.compile == "auto" and compile,
                   insist_on_action_stream=cfg.action_stream == "on", compile_note=note)


# Below this many CPUs the shared env's workers would step the envs in turn, as sync does
# (benchmarks/LOG.md, vec_envs.py: one worker on 2 CPUs measured as sync).
SHARED_ENV_MIN_CPUS = 4


def choose_vec_env(requested: str, envs: int, graphs: bool, cpus: int) -> str:
    """``requested``, or for ``auto`` the vector env measured fastest for the run: shared
    memory workers when the loop replays CUDA graphs (the host's env step is then on the
    critical path), steps several envs (K seeds x num_envs) and has the CPUs to step them at
    once on an x86-64 host (the shared env's polling needs x86's ordered stores); else sync,
    in the process; ``cpus``: the CPUs the run may use. On the H200 host (16 CPUs) shared
    stepped 8 HalfCheetah envs in 109 µs against sync's 520, and K=8 seeds trained at 1,287
    iterations/s against sync's 998."""
    if requested != "auto":
        return requested
    shared = (graphs and envs > 1 and cpus >= SHARED_ENV_MIN_CPUS
              and ordered_stores())
    return "shared" if shared else "sync"


def fall_back(plan: RunPlan, error: CaptureError) -> RunPlan:
    """The plan after the updates failed to build with ``error``: uncompiled after a compiler
    failure, eager (and uncompiled) after a capture failure, each with a one-line warning,
    where the choice was automatic; otherwise ``error`` is raised."""
    if isinstance(error, CompileError) and plan.compile and plan.compile_fallback:
        warnings.warn(f"{error}; running the updates uncompiled instead", stacklevel=3)
        return dataclasses.replace(plan, compile=False, compile_fallback=False)
    if not isinstance(error, CompileError) and plan.graphs and plan.graph_fallback:
        warnings.warn(f"{error}; running the updates eagerly instead", stacklevel=3)
        compile = plan.compile and not plan.compile_fallback
        return dataclasses.replace(plan, graphs=False, graph_fallback=False, compile=compile,
                                   action_stream=False)
    raise error


def settle_action_stream(plan: RunPlan, noise_size: int, actor_name: str) -> RunPlan:
    """Whether the action really runs on a stream of its own: it needs CUDA graphs and an
    actor that takes its exploration noise from the host (two streams drawing on the device
    would share the generator's offset). ``--action-stream on`` warns when it cannot."""
    if not plan.insist_on_action_stream and not plan.action_stream:
        return plan
    if not plan.graphs:
        why = "it needs CUDA graphs"
    elif noise_size == 0:
        why = (f"{actor_name} has no sample(observations, noise), so the action would draw "
               "its noise on the device")
    else:
        return plan
    if plan.insist_on_action_stream:
        warnings.warn(f"--action-stream: acting on the updates' stream instead ({why})",
                      stacklevel=3)
    return dataclasses.replace(plan, action_stream=False)


@contextlib.contextmanager
def matmul_precision(tf32: bool) -> Iterator[None]:
    """float32 matmuls on TF32 tensor cores while inside, when ``tf32``; the process's
    setting is restored after. Set before the updates are built: a captured graph keeps the
    kernels chosen at capture."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
