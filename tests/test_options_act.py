"""Options that are accepted act (issue 42, items 9 and 10).

Every option of each first-party runtime's ``RuntimeOptions``, at every place an option is
accepted (``ppe.to``, ``create_trainer(runtime_options=)``, ``create_evaluator(runtime_options=)``,
``options={"runtime": ...}``) on a model tagged by ``ppe.to``, either takes effect (observed on
the model, the batch, the reported values or torch's switches) or raises a
``RuntimeOptionError`` that says to give it to ``ppe.to``; the evaluator ignores only the options
the docs list. ``options={"async": True}`` warns that it has no effect. ``Throughput(flops=True)``
leaves a compiled model compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import IgnoredArgumentWarning, RuntimeOptionError

E = ppe.training.extensions

PLACES = ("ppe.to", "create_trainer", "create_evaluator", "options['runtime']")
#: Options that act on the module the runtime moves: outside ``ppe.to`` they must raise when
#: they differ from the model's (the trainer's runtime never moves the model).
MODULE_OPTIONS = {"autocast", "channels_last", "compile", "report_memory"}
#: Options the evaluator accepts and ignores (docs/runtimes.md says so): no backward pass and
#: no training step to scale or report.
EVALUATOR_IGNORES = {"grad_scaler"}


class ConvNet(torch.nn.Module):
    """Records what its forward saw: the compute dtype and the input's memory format."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.dtypes: list[torch.dtype] = []
        self.channels_last_inputs: list[bool] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.conv(x).mean(dim=(2, 3))
        self.dtypes.append(y.dtype)
        self.channels_last_inputs.append(x.is_contiguous(memory_format=torch.channels_last))
        return {"loss": ((y.float() - t) ** 2).mean()}


class Counting:
    """A torch.compile backend that runs the captured graph eagerly and counts the graphs."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


def batches(n: int = 2) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randn(2, 3, 5, 5, generator=g), "t": torch.randn(2, 4, generator=g)}
        for _ in range(n)
    ]


@dataclasses.dataclass
class Run:
    """What one run observed."""

    model: ConvNet
    runner: Any
    observed: dict[str, Any]
    device: str

    def runtime(self) -> Any:
        """The runtime that converted the batches."""
        return self.runner.handler.entry_runtime


@dataclasses.dataclass
class Case:
    """A non-default value of one option, and how to see that it acted."""

    value: Callable[[], Any]
    acted: Callable[[Run, Any], bool]


def _grew(run: Run, scaler: Any) -> bool:
    return bool(scaler.get_scale() > 2.0)  # growth_interval=1: grows at every finite step


def _other_thread_count() -> int:
    return 1 if torch.get_num_threads() != 1 else 2


SHARED: dict[str, Case] = {
    "autocast": Case(lambda: True, lambda run, v: run.model.dtypes[-1] != torch.float32),
    "channels_last": Case(
        lambda: True,
        lambda run, v: (
            run.model.conv.weight.is_contiguous(memory_format=torch.channels_last)
            and run.model.channels_last_inputs[-1]
        ),
    ),
    "compile": Case(lambda: {"backend": Counting()}, lambda run, v: v["backend"].graphs >= 1),
}
CASES: dict[str, dict[str, Case]] = {
    "cpu": {
        **SHARED,
        "grad_scaler": Case(
            lambda: torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=1),
            _grew,
        ),
        "num_threads": Case(_other_thread_count, lambda run, v: torch.get_num_threads() == v),
    },
    "cuda": {
        **SHARED,
        "grad_scaler": Case(
            lambda: torch.amp.GradScaler("cuda", init_scale=2.0, growth_interval=1),
            _grew,
        ),
        "non_blocking": Case(lambda: True, lambda run, v: run.runtime().non_blocking is True),
        "cudnn_benchmark": Case(
            lambda: not torch.backends.cudnn.benchmark,
            lambda run, v: torch.backends.cudnn.benchmark is v,
        ),
        "tf32": Case(
            lambda: not torch.backends.cuda.matmul.allow_tf32,
            lambda run, v: (
                torch.backends.cuda.matmul.allow_tf32 is v and torch.backends.cudnn.allow_tf32 is v
            ),
        ),
        "report_memory": Case(
            lambda: 1,
            lambda run, v: "cuda/max_memory_allocated" in run.observed,
        ),
    },
}


def _runtime_options(device: str) -> Any:
    if device == "cpu":
        from ppe_cpu import CPU_OPTIONS

        return CPU_OPTIONS
    from ppe_cuda import CUDA_OPTIONS

    return CUDA_OPTIONS


def _names(device: str) -> list[str]:
    return [spec.name for spec in _runtime_options(device)]


PARAMS = [
    pytest.param(
        device,
        name,
        place,
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ]
        if device == "cuda"
        else [],
        id=f"{device}-{name}-{place}",
    )
    for device in ("cpu", "cuda")
    for name in _names(device)
    for place in PLACES
]


@pytest.fixture
def restore_switches() -> Iterator[None]:
    """Puts back the process-wide switches options set."""
    threads = torch.get_num_threads()
    benchmark = torch.backends.cudnn.benchmark
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def run_at(place: str, device: str, options: dict[str, Any]) -> Run:
    """Train (or, for ``create_evaluator``, evaluate) a model tagged by ``ppe.to`` on ``device``,
    with ``options`` given at ``place``."""
    torch.manual_seed(0)
    model = ConvNet()
    ppe.to(model, device, options=options if place == "ppe.to" else None)
    observed: dict[str, Any] = {}

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: Any) -> None:
        observed.update(manager.observation)

    data = batches()  # on the host: the runtime converts them
    if place == "create_evaluator":
        evaluator = ppe.engine.create_evaluator(model, device=device, runtime_options=options)
        evaluator.run(data)
        return Run(model, evaluator, observed, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs: dict[str, Any] = {
        "ppe.to": {},
        "create_trainer": {"runtime_options": options},
        "options['runtime']": {"options": {"runtime": options}},
    }[place]
    trainer = ppe.engine.create_trainer(
        model, optimizer, 1, device=device, extensions=[record], **kwargs
    )
    trainer.run(data)
    return Run(model, trainer, observed, device)


def test_every_option_has_a_case_and_the_module_options_are_declared_on_move() -> None:
    for device in ("cpu", "cuda"):
        specs = list(_runtime_options(device))
        assert {s.name for s in specs} == set(CASES[device]), f"add a case for {device}'s options"
        declared = {s.name for s in specs if s.on_move}
        assert declared == MODULE_OPTIONS & {s.name for s in specs}


@pytest.mark.usefixtures("restore_switches")
@pytest.mark.parametrize(("device", "name", "place"), PARAMS)
def test_an_accepted_option_acts_or_raises_naming_ppe_to(
    device: str, name: str, place: str
) -> None:
    assert ppe.runtime.runtime_registry.get(device).option_spec is _runtime_options(device)
    case = CASES[device][name]
    value = case.value()
    if place != "ppe.to" and name in MODULE_OPTIONS:
        with pytest.raises(RuntimeOptionError, match=rf"ppe\.to\(model, '{device}'.*{name!r}"):
            run_at(place, device, {name: value})
        return
    run = run_at(place, device, {name: value})
    ignored = place == "create_evaluator" and name in EVALUATOR_IGNORES
    assert case.acted(run, value) is not ignored, f"{name}={value!r} at {place} did not act"


@pytest.mark.usefixtures("restore_switches")
def test_one_dict_given_to_ppe_to_the_trainer_and_its_evaluator_is_one_runtime_and_acts() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=1)
    options = {"autocast": True, "channels_last": True, "grad_scaler": scaler, "num_threads": 1}
    model = ppe.to(ConvNet(), "cpu", options=options)
    evaluator = ppe.engine.create_evaluator(model, runtime_options=options)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(model, sgd, 1, runtime_options=options, evaluator=evaluator)
    runtime = ppe.runtime.get_runtime(model)
    assert trainer.handler.entry_runtime is runtime and evaluator.handler.entry_runtime is runtime
    trainer.run(batches(), batches(1))
    assert model.dtypes == [torch.bfloat16] * 3 and all(model.channels_last_inputs)
    assert scaler.get_scale() == 8.0 and torch.get_num_threads() == 1
    # A dict of the trainer-side options only, for a model moved without options: the
    # evaluator accepts it too (and ignores grad_scaler).
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0, growth_interval=1)
    options = {"grad_scaler": scaler, "num_threads": 1}
    model = ppe.to(ConvNet(), "cpu")
    evaluator = ppe.engine.create_evaluator(model, runtime_options=options)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(model, sgd, 1, runtime_options=options, evaluator=evaluator)
    trainer.run(batches(), batches(1))
    assert scaler.get_scale() == 8.0 and torch.get_num_threads() == 1


def test_the_refusal_says_where_to_give_the_option_and_the_logics_autocast() -> None:
    model = ppe.to(ConvNet(), "cpu")
    with pytest.raises(RuntimeOptionError) as info:
        ppe.engine.create_trainer(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            1,
            runtime_options={"autocast": True},
        )
    message = str(info.value)
    assert "ppe.to(model, 'cpu', options={..., 'autocast': True})" in message
    assert "options={'autocast': True}" in message  # the Logic's option, the other place


def test_the_same_autocast_in_both_places_is_one_runtime_and_an_equal_one_is_accepted() -> None:
    model = ppe.to(ConvNet(), "cpu", options={"autocast": True})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(model, sgd, 1, runtime_options={"autocast": True})
    assert trainer.handler.entry_runtime is ppe.runtime.get_runtime(model)
    # Another spelling of the same request: compared by effect, not refused.
    trainer = ppe.engine.create_trainer(model, sgd, 1, runtime_options={"autocast": torch.bfloat16})
    trainer.run(batches())
    assert model.dtypes == [torch.bfloat16] * 2


def test_a_grad_scaler_no_step_would_use_is_refused() -> None:
    mine, other = (torch.amp.GradScaler("cpu") for _ in range(2))
    model = ppe.to(ConvNet(), "cpu", options={"grad_scaler": mine})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeOptionError, match="has its own grad_scaler"):
        ppe.engine.create_trainer(model, sgd, 1, runtime_options={"grad_scaler": other})
    # Code blocks run on the model's runtime, with its scaler: the trainer's would be unused.
    plain = ppe.to(ConvNet(), "cpu")
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    with pytest.raises(RuntimeOptionError, match=r"CodeBlockLogic.*ppe\.to\(model, 'cpu'"):
        ppe.engine.create_trainer(
            plain, sgd, 1, logic="codeblock", runtime_options={"grad_scaler": other}
        )
    # The evaluator ignores it (no backward pass), whatever the logic.
    ppe.engine.create_evaluator(plain, logic="codeblock", runtime_options={"grad_scaler": other})


@pytest.mark.parametrize("factory", ["trainer", "evaluator"])
def test_async_warns_once_that_it_has_no_effect(factory: str) -> None:
    model = ppe.to(ConvNet(), "cpu")
    with pytest.warns(IgnoredArgumentWarning, match="'async'.*no effect") as records:
        if factory == "trainer":
            runner: Any = ppe.engine.create_trainer(
                model, torch.optim.SGD(model.parameters(), lr=0.1), 1, options={"async": True}
            )
        else:
            runner = ppe.engine.create_evaluator(model, options={"async": True})
        runner.run(batches())
    assert len([r for r in records if issubclass(r.category, IgnoredArgumentWarning)]) == 1


# Item 10: Throughput(flops=True) and torch.compile -----------------------------------------------


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": ((self.body(x) - t) ** 2).mean()}


def train_compiled(extensions: list[Any]) -> tuple[Counting, list[torch.Tensor]]:
    torch.manual_seed(0)
    backend = Counting()
    model = ppe.to(Mlp(), "cpu", options={"compile": {"backend": backend}})
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, extensions=extensions
    )
    g = torch.Generator().manual_seed(1)
    trainer.run([{"x": torch.randn(3, 4, generator=g), "t": torch.randn(3, 2, generator=g)}] * 3)
    return backend, [p.detach().clone() for p in model.parameters()]


def test_flop_counting_leaves_the_compiled_model_compiled_and_training_unchanged() -> None:
    plain_backend, plain = train_compiled([])
    throughput = E.Throughput(flops=True)
    backend, weights = train_compiled([throughput])
    assert plain_backend.graphs >= 1
    assert backend.graphs >= 1, "the compiled model never compiled under Throughput(flops=True)"
    assert all(torch.equal(a, b) for a, b in zip(plain, weights, strict=True))
    # Forward, backward and the SGD step of the first step, per sample.
    by_hand = (2 * 4 * 8 + 2 * 8 * 2) + (2 * 4 * 8 + 2 * 8 * 2) + 2 * 8 * 2
    assert throughput.flops_per_sample == by_hand
