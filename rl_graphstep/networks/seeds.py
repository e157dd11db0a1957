"""K seeds' copies of one network as one module (:class:`SeedStack`): their parameters and
buffers stacked along a leading seed dimension, called through one ``torch.vmap``, so a
custom network trains K seeds without the user writing batched code.

Each seed's network is built as that seed alone builds it (:func:`stack_networks`,
:func:`stack_pairs`), and a module vmap cannot batch is one line at build time
(:func:`check_batchable`).
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError, first_line
from rl_graphstep.envs.vector import seed_everything

__all__ = [
    "MIRRORED_ATTRIBUTES",
    "SeedStack",
    "check_batchable",
    "stack_networks",
    "stack_pairs",
]

MIRRORED_ATTRIBUTES = ("observation_size", "action_size", "num_critics", "normalization")
"""The members' attributes the rest of the code reads from a network; a stack has each its
members have."""


class _MethodCall(nn.Module):
    """Calls a method of ``module`` by name, so ``functional_call`` can run any method of a
    network, not only its forward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call = self.module if method == "forward" else getattr(self.module, method)
        return call(*args, **kwargs)


class SeedStack(nn.Module):
    """K networks of one class as one module: every parameter and buffer stacked along a new
    leading dimension of size K (seed k's at index k), each call one ``torch.vmap`` over
    ``torch.func.functional_call``.

    The stacked tensors live in ``self.stacked``, a copy of the first member whose tensors are
    the stacked ones, under the member's own names: an optimizer over ``parameters()`` holds
    all K seeds' parameters (element-wise optimizers such as Adam then keep each seed's state
    apart), ``state_dict()`` has the member's keys prefixed ``stacked.``, each (K, ...), and
    ``.to()``, ``deepcopy`` (target networks) and Polyak averaging work on it unchanged.

    Calls take inputs with a leading K dimension and return outputs with one (tuples too):
    ``stack(observations)`` for forward, and every public method of the member's class under
    its own name, batched (``stack.sample(observations, noise=noise)``,
    ``stack.deterministic_action(observations)``), with the member's signature; a method the
    member lacks, the stack lacks too. So the algorithms' duck typing
    (``getattr(actor, "sample", None)``, ``inspect.signature(actor.sample)``) reads a stack as
    it reads one network. :meth:`call` is the same by name. Tensor arguments, positional or
    keyword, are split along their first dimension; other values (None, numbers) go to every
    seed as they are. Random draws inside differ across seeds (``randomness="different"``).

    Args:
        modules: the K networks, of one class and one set of parameter and buffer shapes,
            dtypes and devices. They are copied, not kept.
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        if not modules:
            raise ValueError("a SeedStack needs at least one module")
        _check_alike(modules)
        first = modules[0]
        self.num_seeds = len(modules)
        self.member_class = type(first)
        self.stacked = _copy_with_tensors(first, lambda name, tensor, is_parameter: _stack(
            [_tensor_of(m, name, is_parameter) for m in modules], tensor, is_parameter))
        self.stacked.train(first.training)
        for attribute in MIRRORED_ATTRIBUTES:
            if hasattr(first, attribute):
                setattr(self, attribute, getattr(first, attribute))
        # Not a registered submodule: its module *is* self.stacked, registered above.
        self.__dict__["_caller"] = _MethodCall(self.stacked)
        self.__dict__["_member_methods"] = _public_methods(type(first))

    # ------------------------------------------------------------------ calling it

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The members' forward, batched: inputs and outputs (K, ...)."""
        return self.call("forward", *inputs, **kwargs)

    def call(self, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """The members' ``method`` (``"forward"`` or a method's name), batched over seeds."""
        tensors = {f"module.{name}": t for name, t in self._stacked_tensors()}
        names = tuple(kwargs)
        values = tuple(kwargs[name] for name in names)

        def one_seed(seed_tensors: dict[str, Tensor], args: tuple[Any, ...],
                     keyword_values: tuple[Any, ...]) -> Any:
            keywords = dict(zip(names, keyword_values, strict=True))
            return torch.func.functional_call(self._caller, seed_tensors, (method, *args),
                                              keywords)

        batched = torch.vmap(one_seed, in_dims=(0, _dims(inputs), _dims(values)),
                             randomness="different")
        return batched(tensors, inputs, values)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name not in self.__dict__.get("_member_methods", ()):
                raise
        return self._batched_method(name)

    def _batched_method(self, name: str) -> Callable[..., Any]:
        call = functools.partial(self.call, name)
        method = functools.update_wrapper(call, getattr(self.member_class, name))
        # The member's signature, bound (no self): `"noise" in signature(stack.sample)` holds
        # where it holds for a member.
        method.__signature__ = inspect.signature(getattr(self.stacked, name))  # type: ignore[attr-defined]
        return method

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.__dict__.get("_member_methods", ())})

    def _stacked_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(name, stacked tensor) of every parameter and buffer, read at call time: a
        ``functional_call`` around the stack (the algorithms' frozen critic) has swapped its
        own tensors in by then."""
        yield from self.stacked.named_parameters()
        yield from self.stacked.named_buffers()

    # ------------------------------------------------------------------ one seed

    def member(self, k: int) -> nn.Module:
        """A standalone copy of seed ``k``'s network (for evaluation or a per-seed
        checkpoint): the member's class, its tensors copies of index ``k``."""
        k = self._seed_index(k)
        return _copy_with_tensors(self.stacked, lambda name, tensor, is_parameter: _slice(
            tensor, k, is_parameter))

    @torch.no_grad()
    def load_member_state_dict(self, k: int, state_dict: Mapping[str, Any]) -> None:
        """Seed ``k``'s weights from a single network's ``state_dict`` (a resume, or a group
        made from single runs); the other seeds are left as they are. Keys and shapes must
        be the member's, checked as ``nn.Module.load_state_dict`` (strict) checks them."""
        k = self._seed_index(k)
        single = self.member(k)
        single.load_state_dict(state_dict)
        for name, tensor in self.stacked.state_dict(keep_vars=True).items():
            tensor[k].copy_(single.state_dict()[name])

    def _seed_index(self, k: int) -> int:
        if not -self.num_seeds <= k < self.num_seeds:
            raise IndexError(f"seed index {k} out of range for {self.num_seeds} seeds")
        return k % self.num_seeds

    def extra_repr(self) -> str:
        return f"num_seeds={self.num_seeds}, member={self.member_class.__name__}"


# --------------------------------------------------------------------------------------------
# Building a group as its seeds alone would build it
# --------------------------------------------------------------------------------------------


def stack_networks(build: Callable[[int], nn.Module], seeds: Sequence[int]) -> SeedStack:
    """One network per seed, each built by ``build(seed)`` right after
    ``seed_everything(seed)``, as a single run seeds before building its networks, and stacked.
    The global random state is left where the last seed's build left it."""
    return SeedStack([_seeded(build, seed) for seed in _checked_seeds(seeds)])


def stack_pairs(build_pair: Callable[[int], tuple[nn.Module, nn.Module]], seeds: Sequence[int],
                *, observation_size: int | None = None, action_size: int | None = None,
                batch_size: int = 8) -> tuple[SeedStack, SeedStack]:
    """The actor stack and the critic stack of a group: per seed, ``seed_everything(seed)``
    and then ``build_pair(seed) -> (actor, critic)``, the one function that builds both in a
    single run's order (the critic's initialisation draws after the actor's); then each role
    stacked. Given the sizes, both stacks are checked once on an example batch
    (:func:`check_batchable`); the global random state is then left where the last seed's
    build left it."""
    pairs = [_seeded(build_pair, seed) for seed in _checked_seeds(seeds)]
    actors = SeedStack([actor for actor, _ in pairs])
    critics = SeedStack([critic for _, critic in pairs])
    if observation_size is not None and action_size is not None:
        device = next(_tensors_of(actors.stacked), torch.empty(0)).device
        with _forked_rng(device):
            shape = (len(pairs), batch_size)
            observations = torch.randn(*shape, observation_size, device=device)
            actions = torch.rand(*shape, action_size, device=device) * 2 - 1
        check_batchable(actors, "actor", (observations,))
        check_batchable(critics, "critic", (observations, actions))
    return actors, critics


def _checked_seeds(seeds: Sequence[int]) -> list[int]:
    seeds = [int(seed) for seed in seeds]
    if not seeds:
        raise ConfigError("a group of seeds needs at least one seed")
    return seeds


def _seeded(build: Callable[[int], Any], seed: int) -> Any:
    seed_everything(seed)
    return build(seed)


# --------------------------------------------------------------------------------------------
# Can it be batched?
# --------------------------------------------------------------------------------------------

_CHECKED_METHODS = ("sample", "deterministic_action")
"""The methods, besides forward, that run batched on an actor where it has them."""


def check_batchable(stack: SeedStack, role: str, example: tuple[Tensor, ...],
                    calls: Mapping[str, tuple[Tensor, ...]] | None = None) -> None:
    """Run ``stack``'s forward once on ``example`` (inputs with a leading K dimension), and
    its ``sample`` (with and, where it takes one, without ``noise``) and
    ``deterministic_action`` where the member has them, then each method of ``calls`` on its
    own example inputs (PPO's ``log_prob_and_entropy(observations, actions)``), as a
    build-time check that vmap can batch the member. Its buffers (BatchNorm's running
    statistics, say) and the random streams are left as they were.

    Raises:
        ConfigError: ``actor MyNet cannot be batched over seeds (<the cause's first line>);
            train with --num-seeds 1``.
    """
    name = stack.member_class.__name__
    saved = {key: buffer.clone() for key, buffer in stack.stacked.named_buffers()}
    method = "forward"
    try:
        with _forked_rng(example[0].device):
            output = stack(*example)
            for method in _CHECKED_METHODS:
                if method not in dir(stack):
                    continue
                action = stack.call(method, *example)
                if method == "sample" and "noise" in inspect.signature(stack.sample).parameters:
                    stack.sample(*example, noise=torch.randn_like(action))
            for method, inputs in (calls or {}).items():
                stack.call(method, *inputs)
    except Exception as error:  # any failure to batch: the line names its cause
        where = "" if method == "forward" else f"in {method}: "
        raise ConfigError(f"{role} {name} cannot be batched over seeds ({where}"
                          f"{first_line(error)}); train with --num-seeds 1") from error
    finally:
        with torch.no_grad():
            for key, buffer in stack.stacked.named_buffers():
                buffer.copy_(saved[key])
    del output


@contextmanager
def _forked_rng(device: torch.device) -> Iterator[None]:
    # The check must not shift the run's random streams, as netcheck's checks do not.
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        yield


# --------------------------------------------------------------------------------------------
# Stacking and slicing tensors
# --------------------------------------------------------------------------------------------


def _check_alike(modules: Sequence[nn.Module]) -> None:
    """One class, one set of tensor names, shapes, dtypes and devices."""
    first = modules[0]
    layout = _layout(first)
    for k, module in enumerate(modules[1:], start=1):
        if type(module) is not type(first):
            raise ValueError(f"a SeedStack's modules must be of one class: module {k} is a "
                             f"{_class_name(type(module))}, module 0 a "
                             f"{_class_name(type(first))}")
        if _layout(module) != layout:
            raise ValueError(f"a SeedStack's modules must have the same parameters and "
                             f"buffers: module {k}'s differ from module 0's in name, shape, "
                             "dtype or device")


def _class_name(cls: type) -> str:
    """``module.QualName``: two classes of one name (a file loaded twice) read apart."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _layout(module: nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype, torch.device]]:
    named = [*module.named_parameters(), *module.named_buffers()]
    return [(name, tuple(t.shape), t.dtype, t.device) for name, t in named]


def _tensors_of(module: nn.Module) -> Iterator[Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _tensor_of(module: nn.Module, name: str, is_parameter: bool) -> Tensor:
    return module.get_parameter(name) if is_parameter else module.get_buffer(name)


def _stack(tensors: list[Tensor], like: Tensor, is_parameter: bool) -> Tensor:
    stacked = torch.stack([t.detach() for t in tensors])
    return nn.Parameter(stacked, requires_grad=like.requires_grad) if is_parameter else stacked


def _slice(tensor: Tensor, k: int, is_parameter: bool) -> Tensor:
    one = tensor.detach()[k].clone()
    return nn.Parameter(one, requires_grad=tensor.requires_grad) if is_parameter else one


def _copy_with_tensors(module: nn.Module,
                       replace: Callable[[str, Tensor, bool], Tensor]) -> nn.Module:
    """A deep copy of ``module`` whose every parameter and buffer is ``replace(name, tensor,
    is_parameter)``, without copying the old tensors first. Tied parameters stay tied: the
    copy is driven by the tensors' identities (deepcopy's memo)."""
    memo: dict[int, Any] = {}
    for name, tensor in module.named_parameters():
        memo[id(tensor)] = replace(name, tensor, True)
    for name, tensor in module.named_buffers():
        memo[id(tensor)] = replace(name, tensor, False)
    return copy.deepcopy(module, memo)


def _dims(values: tuple[Any, ...]) -> tuple[int | None, ...]:
    """vmap's in_dims for call arguments: tensors split along dimension 0, the rest shared."""
    return tuple(0 if isinstance(value, Tensor) else None for value in values)


def _public_methods(cls: type) -> frozenset[str]:
    """The public methods ``cls`` adds to ``nn.Module``: those a stack mirrors, batched."""
    return frozenset(
        name for name in dir(cls)
        if not name.startswith("_") and not hasattr(nn.Module, name)
        and inspect.isfunction(inspect.getattr_static(cls, name))
    )
