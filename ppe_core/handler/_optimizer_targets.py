"""Several optimizers per model: what each optimizer steps (the Logic's ``optimizers`` option),
checked against the trainer's models and optimizers and planned once into ordered stages,
which the Logic's step runs (each :class:`Stage` checks its first outputs and steps its
optimizers); and which optimizers ``CodeBlockLogic`` steps (those holding its model's
parameters, or those its ``optimizers`` option names; PPE steps every optimizer of the
trainer)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ppe_core.errors import ConfigurationError, ModelOutputError
from ppe_core.handler._clipping import GradClipper
from ppe_core.handler._diagnostics import check_something_trains, holds_parameters

#: The keys an optimizer's entry in the ``optimizers`` option may have.
TARGET_KEYS = ("model", "loss", "grad_scaler")

_EXAMPLE = (
    "e.g. options={'optimizers': {'gen': {'loss': 'g_loss'}, 'dis': {'loss': 'd_loss'}}} "
    "(keys: the trainer's optimizer names; entries may name 'model', 'loss' and 'grad_scaler')"
)


@dataclasses.dataclass(frozen=True)
class OptimizerTarget:
    """One entry of the ``optimizers`` option: what the optimizer called ``name`` steps on.

    ``None`` fields take the Logic's value: its ``model_name``, its ``backward_outputs`` and
    its grad scaler (the ``grad_scaler`` option or the runtime's).
    """

    name: str
    model: str | None = None
    loss: tuple[str, ...] | None = None
    grad_scaler: torch.amp.GradScaler | None = None


def parse_targets(value: Any) -> dict[str, OptimizerTarget]:
    """The ``optimizers`` option as targets by optimizer name, in the given order.

    Accepts a list of optimizer names (each with the Logic's model, loss and scaler) or a dict
    ``{name: {"model": ..., "loss": ..., "grad_scaler": ...}}`` (every key optional).

    Raises:
        ConfigurationError: the option or an entry has the wrong shape.
    """
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str):
        items = [(name, {}) for name in value]
    else:
        raise ConfigurationError(
            f"option 'optimizers' must be a list of optimizer names or a dict of them, got "
            f"{value!r}; {_EXAMPLE}"
        )
    if not items:
        raise ConfigurationError(f"option 'optimizers' names no optimizer; {_EXAMPLE}")
    targets: dict[str, OptimizerTarget] = {}
    for name, entry in items:
        if not isinstance(name, str):
            raise ConfigurationError(
                f"option 'optimizers' names optimizers by their trainer key (a str), got "
                f"{name!r}; {_EXAMPLE}"
            )
        if name in targets:
            raise ConfigurationError(f"option 'optimizers' names the optimizer {name!r} twice")
        targets[name] = _parse_entry(name, {} if entry is None else entry)
    return targets


def _parse_entry(name: str, entry: Any) -> OptimizerTarget:
    where = f"option 'optimizers', entry {name!r}"
    if not isinstance(entry, Mapping):
        raise ConfigurationError(
            f"{where} must be a dict with the keys {list(TARGET_KEYS)} (each optional), got "
            f"{entry!r}; {_EXAMPLE}"
        )
    unknown = sorted(set(entry) - set(TARGET_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s) {unknown}; the keys are {list(TARGET_KEYS)} (an LR "
            "scheduler is an extension: ppe.training.extensions.LRScheduler(scheduler) per "
            "optimizer)"
        )
    model = entry.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigurationError(f"{where}: 'model' must be a model name (a str), got {model!r}")
    loss = entry.get("loss")
    keys = (loss,) if isinstance(loss, str) else loss
    if keys is not None and (
        not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) for k in keys)
    ):
        raise ConfigurationError(
            f"{where}: 'loss' must be an output key or a non-empty list of them, got {loss!r}"
        )
    scaler = entry.get("grad_scaler")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise ConfigurationError(
            f"{where}: 'grad_scaler' must be a torch.amp.GradScaler, got {type(scaler).__name__}"
        )
    return OptimizerTarget(name, model, None if keys is None else tuple(keys), scaler)


@dataclasses.dataclass
class StepGroup:
    """Optimizers stepped on the same loss: one backward pass, one grad scaler."""

    loss: tuple[str, ...] | None  # None: the Logic's backward_outputs
    names: list[str]
    optimizers: list[torch.optim.Optimizer]
    scaler: torch.amp.GradScaler | None

    def parameters(self) -> list[torch.Tensor]:
        """The trainable parameters of the group's optimizers (read each step: layers may be
        unfrozen during training)."""
        return [
            p
            for optimizer in self.optimizers
            for group in optimizer.param_groups
            for p in group["params"]
            if p.requires_grad
        ]


@dataclasses.dataclass
class Stage:
    """One model's forward pass and the optimizers stepped on its outputs."""

    model_name: str
    model: torch.nn.Module
    groups: list[StepGroup]
    #: The scalers whose last optimizer steps in this stage: updated after its steps.
    updates: list[torch.amp.GradScaler]
    #: Whether the first step's checks (loss keys, something trains) have run.
    checked: bool = False

    def check(
        self, outputs: Mapping[str, Any], backward_outputs: str | Sequence[str] | None
    ) -> None:
        """At the stage's first step: each named loss is an output that backpropagates, and
        with a default loss (no group's own, no ``backward_outputs``), something can train
        (what the backward then does cannot change that: it backpropagates only outputs with
        a graph)."""
        for group in self.groups:
            for key in group.loss or ():
                if key not in outputs:
                    raise ConfigurationError(
                        f"the optimizer(s) {group.names} step on the loss {key!r}, but the "
                        f"model {self.model_name!r} returns the outputs {sorted(outputs)}; "
                        "name one of them in option 'optimizers' (its 'loss'), or return it"
                    )
                value = outputs[key]
                if not isinstance(value, torch.Tensor) or value.grad_fn is None:
                    raise ModelOutputError(
                        f"the loss {key!r} of the optimizer(s) {group.names} has no graph to "
                        "backpropagate (it is not a tensor computed with autograd: not under "
                        "torch.no_grad(), not .detach()ed or .item()ed)"
                    )
                if value.numel() != 1:
                    raise ModelOutputError(
                        f"the loss {key!r} of the optimizer(s) {group.names} has shape "
                        f"{tuple(value.shape)}, but backward needs a scalar; reduce it in "
                        "forward (e.g. loss.mean())"
                    )
        if backward_outputs is None and any(group.loss is None for group in self.groups):
            check_something_trains(self.model, outputs)
        self.checked = True

    def step(self, clipper: GradClipper | None) -> None:
        """Steps the stage's optimizers, each through its group's scaler (its gradients
        clipped first by ``clipper``, the clipping options'), then updates the scalers that
        have stepped their last optimizer of the step."""
        for group in self.groups:
            scaler = group.scaler
            for name, optimizer in zip(group.names, group.optimizers, strict=True):
                if clipper is not None:
                    clipper.clip(name, optimizer, scaler)
                if scaler is None:
                    optimizer.step()
                else:
                    scaler.step(optimizer)
        for scaler in self.updates:
            scaler.update()


@dataclasses.dataclass
class Plan:
    """The stages of a step, for one ``models``/``optimizers`` pair of dicts."""

    models: Mapping[str, torch.nn.Module]
    optimizers: Mapping[str, torch.optim.Optimizer]
    stages: list[Stage]
    #: Whether each group backpropagates to its own optimizers' parameters only (several
    #: groups: a generator's loss must not leave gradients on the discriminator).
    restrict: bool


def own_scalers(
    targets: Mapping[str, OptimizerTarget] | None, shared: torch.amp.GradScaler | None
) -> dict[str, torch.amp.GradScaler]:
    """The optimizers' own grad scalers (other than the Logic's ``shared`` one), by optimizer
    name."""
    return {
        t.name: t.grad_scaler
        for t in (targets or {}).values()
        if t.grad_scaler is not None and t.grad_scaler is not shared
    }


def plan_stages(
    targets: Mapping[str, OptimizerTarget],
    models: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer],
    *,
    model_name: str,
    backward_outputs: str | Sequence[str] | None,
    grad_scaler: torch.amp.GradScaler | None,
    backward_function: Callable[[torch.Tensor], Any] | None,
) -> Plan:
    """The ``targets`` checked against the trainer's dicts and ordered into stages: a stage per
    model in the order the targets first name it, in a stage a group per loss in the same
    order. A target's ``None`` fields take the Logic's ``model_name``, ``backward_outputs``
    and ``grad_scaler``.

    Raises:
        ConfigurationError: an unknown optimizer or model name, an optimizer of the trainer
            that no target names, an optimizer holding none of its model's parameters, one
            loss with two grad scalers, or a ``backward_function`` with several losses.
    """
    refuse_unknown(targets, optimizers, "option 'optimizers'")
    unlisted = [name for name in optimizers if name not in targets]
    if unlisted:
        raise ConfigurationError(
            f"the trainer's optimizer(s) {unlisted} are not in option 'optimizers' "
            f"({list(targets)}), so the Logic would never step them; add them to the option "
            "or leave them out of the trainer"
        )
    keys = backward_outputs
    loss = None if keys is None else (keys,) if isinstance(keys, str) else tuple(keys)
    stages: dict[str, Stage] = {}
    groups: dict[tuple[str, tuple[str, ...] | None], StepGroup] = {}
    last_stage: dict[int, tuple[torch.amp.GradScaler, Stage]] = {}
    for target in targets.values():
        name = target.model if target.model is not None else model_name
        if name not in models:
            raise ConfigurationError(
                f"option 'optimizers', entry {target.name!r}, steps the model {name!r}"
                f"{'' if target.model is not None else ' (the Logic model_name)'}, but the "
                f"models are named {sorted(models)}; set its 'model' to one of them"
            )
        model = models[name]
        optimizer = optimizers[target.name]
        if not holds_parameters(optimizer, model.parameters()):
            raise ConfigurationError(
                f"the optimizer {target.name!r} holds none of the parameters of the model "
                f"{name!r} it steps on; set its 'model' to the model whose forward computes "
                f"its loss and holds its parameters (models: {sorted(models)})"
            )
        stage = stages.setdefault(name, Stage(name, model, [], []))
        key = target.loss if target.loss is not None else loss
        scaler = target.grad_scaler if target.grad_scaler is not None else grad_scaler
        group = groups.get((name, key))
        if group is None:
            group = groups[(name, key)] = StepGroup(key, [], [], scaler)
            stage.groups.append(group)
        elif group.scaler is not scaler:
            raise ConfigurationError(
                f"the optimizers {[*group.names, target.name]} step on the same loss "
                f"{list(key) if key is not None else '(the default)'} of model {name!r} with "
                "different grad scalers, but a loss is scaled once; give them one "
                "'grad_scaler', or separate losses"
            )
        group.names.append(target.name)
        group.optimizers.append(optimizer)
        if scaler is not None:
            last_stage[id(scaler)] = (scaler, stage)
    for scaler, stage in last_stage.values():
        stage.updates.append(scaler)
    restrict = len(groups) > 1
    if restrict and backward_function is not None:
        raise ConfigurationError(
            "option 'backward_function' cannot be combined with optimizers stepped on "
            "different losses or models: each loss is backpropagated to its own optimizers' "
            "parameters only, with torch.autograd.backward(loss, inputs=...). Remove the "
            "option, or subclass ppe.handler.BaseLogic for this step"
        )
    return Plan(models, optimizers, list(stages.values()), restrict)


def refuse_unknown(names: Iterable[str], optimizers: Mapping[str, Any], option: str) -> None:
    """Refuses ``option`` (its text in the message) naming optimizers the trainer lacks.

    Raises:
        ConfigurationError: a name in ``names`` is not a key of ``optimizers``.
    """
    unknown = [name for name in names if name not in optimizers]
    if unknown:
        raise ConfigurationError(
            f"{option} names {unknown}, but the trainer's optimizers are named "
            f"{sorted(optimizers)}; key the option by those names (a bare optimizer is 'main')"
        )


def pop_optimizer_names(
    options: dict[str, Any], current: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """Pops ``CodeBlockLogic``'s ``optimizers`` option, a list of the trainer's optimizer names
    (``current`` when it is not given).

    Raises:
        ConfigurationError: the option is not a list of str.
    """
    names = options.pop("optimizers", None)
    if names is None:
        return current
    if isinstance(names, (Mapping, str)) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(
            f"CodeBlockLogic option 'optimizers' must be a list of optimizer names, got "
            f"{names!r}; e.g. options={{'optimizers': ['adam', 'sgd']}}. A code block "
            "steps them all on one loss; a loss, model or grad scaler per optimizer "
            "needs ppe.handler.Logic's 'optimizers' option"
        )
    return tuple(names)


def code_block_optimizers(
    model: torch.nn.Module,
    optimizers: Mapping[str, torch.optim.Optimizer],
    names: tuple[str, ...] | None,
    model_name: str,
) -> list[torch.optim.Optimizer]:
    """The optimizers ``CodeBlockLogic`` steps for ``model`` (keyed ``model_name``): those
    named by ``names`` (its ``optimizers`` option), else every one holding parameters of the
    model (with several models, PPE #700, the others' optimizers stay out).

    Raises:
        ConfigurationError: none holds the model's parameters, or ``names`` names an unknown
            optimizer or one holding none of them.
    """
    if names is not None:
        return _named_optimizers(model, optimizers, names, model_name)
    chosen = [o for o in optimizers.values() if holds_parameters(o, model.parameters())]
    if not chosen and optimizers:
        raise _none_hold_model(optimizers, model_name)
    return chosen


def _none_hold_model(optimizers: Mapping[str, Any], model_name: str) -> ConfigurationError:
    """The error for a ``CodeBlockLogic`` none of whose trainer's optimizers holds parameters
    of its model (PPE steps them all)."""
    return ConfigurationError(
        f"none of the optimizers {sorted(optimizers)} holds parameters of the model "
        f"{model_name!r} CodeBlockLogic trains, so nothing would learn; build "
        "one from that model's parameters, or set model_name to the model they train"
    )


def _named_optimizers(
    model: torch.nn.Module,
    optimizers: Mapping[str, torch.optim.Optimizer],
    names: tuple[str, ...],
    model_name: str,
) -> list[torch.optim.Optimizer]:
    """The optimizers ``CodeBlockLogic``'s ``optimizers`` option names (PPE has no such option).

    Raises:
        ConfigurationError: ``names`` names an unknown optimizer or one holding none of the
            parameters of ``model`` (keyed ``model_name``).
    """
    refuse_unknown(names, optimizers, "CodeBlockLogic option 'optimizers'")
    idle = [n for n in names if not holds_parameters(optimizers[n], model.parameters())]
    if idle:
        raise ConfigurationError(
            f"CodeBlockLogic option 'optimizers' names {idle}, which hold none of the "
            f"parameters of the model {model_name!r} it trains"
        )
    return [optimizers[n] for n in names]
