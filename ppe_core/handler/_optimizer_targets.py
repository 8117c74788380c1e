"""Several optimizers per model: what each optimizer steps (the Logic's ``optimizers`` option),
checked against the trainer's models and optimizers, planned once into ordered stages, and the
Logic's step that runs them (:class:`StagedSteps`); and which optimizers ``CodeBlockLogic``
steps (those holding its model's parameters, or those its ``optimizers`` option names; PPE
steps every optimizer of the trainer)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ppe_core.errors import ConfigurationError, ModelOutputError
from ppe_core.handler._accumulation import Accumulation, no_sync
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


@dataclasses.dataclass
class Plan:
    """The stages of a step, for one ``models``/``optimizers`` pair of dicts."""

    models: Mapping[str, torch.nn.Module]
    optimizers: Mapping[str, torch.optim.Optimizer]
    stages: list[Stage]
    #: Whether each group backpropagates to its own optimizers' parameters only (several
    #: groups: a generator's loss must not leave gradients on the discriminator).
    restrict: bool


class StagedSteps(Accumulation):
    """The Logic's step with the ``optimizers`` option, mixed into ``ppe.handler.Logic``.

    Each stage in turn zeroes its optimizers, runs its model's forward and backpropagates each
    loss to its own optimizers' parameters; the stages before the last step their optimizers
    at once (the next forward sees the update), the last in ``train_step_optimizers``.
    """

    # The Logic's state this step uses, with its defaults (options not given).
    model_name: str
    backward_outputs: str | list[str] | tuple[str, ...] | None = None
    #: The ``optimizers`` option; None: one optimizer, keyed like the model.
    _targets: dict[str, OptimizerTarget] | None = None
    #: The stages planned from ``_targets`` (planned again when the options change).
    _plan: Plan | None = None
    _grad_scaler: torch.amp.GradScaler | None = None
    _backward_fn: Callable[[torch.Tensor], Any] | None = None
    #: The ``grad_clip_norm`` / ``grad_clip_value`` options' clipper (None: no clipping).
    _clipper: GradClipper | None = None

    if TYPE_CHECKING:

        def _autocast_forward(self, model: torch.nn.Module, batch: Any) -> Any: ...

        def _keyed(self, outputs: Any) -> Mapping[str, Any]: ...

        def named_outputs(self, outputs: Any) -> Mapping[str, Any]: ...

        def _to_backward(self, outputs: Mapping[str, Any]) -> list[torch.Tensor]: ...

    def _consume_staged_options(self, options: dict[str, Any]) -> None:
        """Pops the ``grad_accumulation_steps`` and ``optimizers`` options (one not given keeps
        its value), and plans the stages again at the next step: the options changed."""
        steps = options.pop("grad_accumulation_steps", None)
        self.grad_accumulation_steps = steps or self.grad_accumulation_steps
        targets = options.pop("optimizers", None)
        self._targets = self._targets if targets is None else parse_targets(targets)
        self._plan = None

    def _staged_models(self, models: Mapping[str, torch.nn.Module]) -> list[torch.nn.Module]:
        """The models the targets name, once each (an unknown name is the plan's to explain)."""
        assert self._targets is not None
        names = dict.fromkeys(
            t.model if t.model is not None else self.model_name for t in self._targets.values()
        )
        return [models[name] for name in names if name in models]

    def _own_scalers(self) -> dict[str, torch.amp.GradScaler]:
        """The optimizers' own grad scalers (the ``optimizers`` option), by optimizer name."""
        if self._targets is None:
            return {}
        return {
            t.name: t.grad_scaler
            for t in self._targets.values()
            if t.grad_scaler is not None and t.grad_scaler is not self._grad_scaler
        }

    def _planned(
        self, models: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
    ) -> Plan:
        """The plan for these trainer dicts, built when they change: the targets checked
        against them and ordered into stages, a stage per model in the order the targets first
        name it, in a stage a group per loss in the same order. A target's ``None`` fields take
        the Logic's ``model_name``, ``backward_outputs`` and grad scaler.

        Raises:
            ConfigurationError: an unknown optimizer or model name, an optimizer of the trainer
                that no target names, an optimizer holding none of its model's parameters, one
                loss with two grad scalers, or a ``backward_function`` with several losses.
        """
        plan = self._plan
        if plan is not None and plan.models is models and plan.optimizers is optimizers:
            return plan
        targets = self._targets
        assert targets is not None
        refuse_unknown(targets, optimizers, "option 'optimizers'")
        unlisted = [name for name in optimizers if name not in targets]
        if unlisted:
            raise ConfigurationError(
                f"the trainer's optimizer(s) {unlisted} are not in option 'optimizers' "
                f"({list(targets)}), so the Logic would never step them; add them to the option "
                "or leave them out of the trainer"
            )
        keys = self.backward_outputs
        loss = None if keys is None else (keys,) if isinstance(keys, str) else tuple(keys)
        stages: dict[str, Stage] = {}
        groups: dict[tuple[str, tuple[str, ...] | None], StepGroup] = {}
        last_stage: dict[int, tuple[torch.amp.GradScaler, Stage]] = {}
        for target in targets.values():
            name = target.model if target.model is not None else self.model_name
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
            scaler = target.grad_scaler if target.grad_scaler is not None else self._grad_scaler
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
        if restrict and self._backward_fn is not None:
            raise ConfigurationError(
                "option 'backward_function' cannot be combined with optimizers stepped on "
                "different losses or models: each loss is backpropagated to its own optimizers' "
                "parameters only, with torch.autograd.backward(loss, inputs=...). Remove the "
                "option, or subclass ppe.handler.BaseLogic for this step"
            )
        self._plan = Plan(models, optimizers, list(stages.values()), restrict)
        return self._plan

    def _train_stages(
        self,
        models: Mapping[str, torch.nn.Module],
        optimizers: Mapping[str, torch.optim.Optimizer],
        batch_idx: int,
        batch: Any,
    ) -> Any:
        """Each stage in turn: zero_grad, its model's forward, each loss's backward; the
        stages before the last step their optimizers here (the next forward sees the update),
        the last in ``train_step_optimizers``."""
        plan = self._planned(models, optimizers)
        n = self.grad_accumulation_steps
        window, ends = (1, True) if n == 1 else self._window(batch_idx)
        stages = plan.stages
        merged: dict[str, Any] = {}
        for stage in stages:
            model, groups = stage.model, stage.groups
            if batch_idx % n == 0:
                for group in groups:
                    for optimizer in group.optimizers:
                        optimizer.zero_grad()
            with contextlib.nullcontext() if ends else no_sync(model):
                outputs = self._autocast_forward(model, batch)
                named = self._keyed(outputs)
                if not stage.checked:
                    self._check_stage(stage, named)
                for i, group in enumerate(groups):
                    keys = group.loss
                    tensors = self._to_backward(named) if keys is None else [named[k] for k in keys]
                    if not tensors:
                        continue
                    if window != 1:
                        tensors = [t / window for t in tensors]
                    if group.scaler is not None:
                        tensors = [group.scaler.scale(t) for t in tensors]
                    if self._backward_fn is not None:  # one group: the plan refuses more
                        for t in tensors:
                            self._backward_fn(t)
                    else:
                        # Several groups: only this group's parameters (a generator's loss must
                        # not leave gradients on the discriminator); later ones reuse the graph.
                        inputs = group.parameters() if plan.restrict else None
                        retain = i < len(groups) - 1
                        torch.autograd.backward(tensors, inputs=inputs, retain_graph=retain)
            if len(stages) == 1:
                return outputs
            merged.update(self.named_outputs(outputs))
            if ends and stage is not stages[-1]:
                self._step_stage(stage)
        return merged

    def _check_stage(self, stage: Stage, outputs: Mapping[str, Any]) -> None:
        """At a stage's first step: each named loss is an output that backpropagates, and
        with a default loss, something can train (what the backward then does cannot change
        that: it backpropagates only outputs with a graph)."""
        for group in stage.groups:
            for key in group.loss or ():
                if key not in outputs:
                    raise ConfigurationError(
                        f"the optimizer(s) {group.names} step on the loss {key!r}, but the "
                        f"model {stage.model_name!r} returns the outputs {sorted(outputs)}; "
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
        if any(group.loss is None for group in stage.groups) and self.backward_outputs is None:
            check_something_trains(stage.model, outputs)
        stage.checked = True

    def _step_stage(self, stage: Stage) -> None:
        """Steps the stage's optimizers, each through its group's scaler (its gradients
        clipped first, with the clipping options), then updates the scalers that have stepped
        their last optimizer of the step."""
        clipper = self._clipper
        for group in stage.groups:
            scaler = group.scaler
            for name, optimizer in zip(group.names, group.optimizers, strict=True):
                if clipper is not None:
                    clipper.clip(name, optimizer, scaler)
                if scaler is None:
                    optimizer.step()
                else:
                    scaler.step(optimizer)
        for scaler in stage.updates:
            scaler.update()


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
