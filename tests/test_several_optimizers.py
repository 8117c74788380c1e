"""Several optimizers per model (issue 26): the default Logic's ``optimizers`` option on a small
GAN and on one model with two optimizers, against hand-written PyTorch loops to the bit; each
optimizer's grad scaler and LR scheduler in snapshots and a mid-epoch resume; the errors; and
CodeBlockLogic's targeting by ``model_name`` (PPE #700)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_examples import EXAMPLES, run_example
from torch.utils.data import DataLoader

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, ModelOutputError

E = ppe.training.extensions
bce = torch.nn.functional.binary_cross_entropy_with_logits
GAN_TARGETS = {"gen": {"loss": "g_loss"}, "dis": {"loss": "d_loss"}}


def generator() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def discriminator() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(2, 8), torch.nn.LeakyReLU(0.2), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1)
    )


def d_loss_of(dis: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    d_real, d_fake = dis(real), dis(fake.detach())
    return bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))


def g_loss_of(dis: torch.nn.Module, fake: torch.Tensor) -> torch.Tensor:
    d_fake = dis(fake)
    return bce(d_fake, torch.ones_like(d_fake))


class GAN(torch.nn.Module):
    """Both losses in one forward, from the same parameters (a simultaneous update)."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = generator()
        self.dis = discriminator()

    def forward(self, real: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        fake = self.gen(z)
        return {"g_loss": g_loss_of(self.dis, fake), "d_loss": d_loss_of(self.dis, real, fake)}


class DisStep(torch.nn.Module):
    """The discriminator's loss (the textbook loop's first half)."""

    def __init__(self, gen: torch.nn.Module, dis: torch.nn.Module) -> None:
        super().__init__()
        self.gen, self.dis = gen, dis

    def forward(self, real: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"d_loss": d_loss_of(self.dis, real, self.gen(z))}


class GenStep(DisStep):
    """The generator's loss, through the discriminator just updated."""

    def forward(self, real: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"g_loss": g_loss_of(self.dis, self.gen(z))}


def gan_loader(n: int = 48, batch_size: int = 8) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(1)
    real = torch.randn(n, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0])
    z = torch.randn(n, 3, generator=g)
    data = [{"real": real[i], "z": z[i]} for i in range(n)]
    return DataLoader(data, batch_size=batch_size, shuffle=True)  # type: ignore[arg-type]


def adam(module: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(module.parameters(), lr=lr, betas=(0.5, 0.999))


def same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def run_gan(epochs: int, accumulate: int = 1) -> tuple[GAN, list[dict[str, Any]]]:
    torch.manual_seed(0)
    gan = ppe.to(GAN(), "cpu")
    optimizers = {"gen": adam(gan.gen, 2e-3), "dis": adam(gan.dis, 1e-3)}
    log = E.LogReport(trigger=(1, "epoch"))
    options: dict[str, Any] = {"optimizers": GAN_TARGETS}
    if accumulate > 1:
        options["grad_accumulation_steps"] = accumulate
    trainer = ppe.engine.create_trainer(
        gan, optimizers, epochs, device="cpu", options=options, extensions=[log]
    )
    trainer.run(gan_loader())
    return gan, log.log


def test_gan_in_one_model_equals_the_hand_written_simultaneous_loop_to_the_bit() -> None:
    trained, log = run_gan(3)

    torch.manual_seed(0)
    gan = GAN()
    opt_g, opt_d = adam(gan.gen, 2e-3), adam(gan.dis, 1e-3)
    loader = gan_loader()
    for _ in range(3):
        gan.train()
        for batch in loader:
            out = gan(**batch)
            opt_g.zero_grad()
            out["g_loss"].backward(retain_graph=True)
            opt_d.zero_grad()  # the generator's loss reached the discriminator too: drop it
            out["d_loss"].backward()
            opt_g.step()
            opt_d.step()
    same(trained, gan)
    assert {"train/g_loss", "train/d_loss"} <= set(log[-1])
    assert trained.training is False  # the epoch's end switched the model to eval mode


def test_gan_with_gradient_accumulation_equals_the_hand_written_loop() -> None:
    trained, _ = run_gan(2, accumulate=4)  # 6 batches per epoch: windows of 4 and 2

    torch.manual_seed(0)
    gan = GAN()
    opt_g, opt_d = adam(gan.gen, 2e-3), adam(gan.dis, 1e-3)
    loader = gan_loader()
    for _ in range(2):
        gan.train()
        for i, batch in enumerate(loader):
            window = 4 if i < 4 else 2
            if i % 4 == 0:
                opt_g.zero_grad()
                opt_d.zero_grad()
            out = gan(**batch)
            gen_params = list(gan.gen.parameters())
            torch.autograd.backward(out["g_loss"] / window, inputs=gen_params, retain_graph=True)
            torch.autograd.backward(out["d_loss"] / window, inputs=list(gan.dis.parameters()))
            if i in (3, 5):
                opt_g.step()
                opt_d.step()
    same(trained, gan)


def test_two_models_step_in_turn_as_the_textbook_loop() -> None:
    """Discriminator first, then the generator through the updated discriminator."""
    torch.manual_seed(0)
    gen, dis = generator(), discriminator()
    models = {"dis": ppe.to(DisStep(gen, dis), "cpu"), "gen": ppe.to(GenStep(gen, dis), "cpu")}
    optimizers = {"dis": adam(dis, 1e-3), "gen": adam(gen, 2e-3)}
    targets = {"dis": {"model": "dis", "loss": "d_loss"}, "gen": {"model": "gen", "loss": "g_loss"}}
    log = E.LogReport(trigger=(1, "epoch"))
    trainer = ppe.engine.create_trainer(
        models, optimizers, 3, device="cpu", options={"optimizers": targets}, extensions=[log]
    )
    trainer.run(gan_loader())
    assert {"train/g_loss", "train/d_loss"} <= set(log.log[-1])  # both models' outputs

    torch.manual_seed(0)
    gen2, dis2 = generator(), discriminator()
    opt_d, opt_g = adam(dis2, 1e-3), adam(gen2, 2e-3)
    loader = gan_loader()
    for _ in range(3):
        gen2.train()
        dis2.train()
        for batch in loader:
            opt_d.zero_grad()
            d_loss_of(dis2, batch["real"], gen2(batch["z"])).backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss_of(dis2, gen2(batch["z"])).backward()
            opt_g.step()
    same(gen, gen2)
    same(dis, dis2)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(5, 6)
        self.l2 = torch.nn.Linear(6, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        pred = self.l2(torch.relu(self.l1(x))).squeeze(1)
        return {"loss": torch.nn.functional.mse_loss(pred, y)}


def regression_loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 5, generator=g)
    data = [{"x": x[i], "y": x[i].sum()} for i in range(40)]
    return DataLoader(data, batch_size=8, shuffle=True)  # type: ignore[arg-type]


def test_one_model_one_loss_two_optimizers_on_its_layers_as_in_ppe_700() -> None:
    torch.manual_seed(0)
    model = ppe.to(TwoLayers(), "cpu")
    optimizers = {
        "adam": torch.optim.Adam(model.l1.parameters(), lr=0.01),
        "sgd": torch.optim.SGD(model.l2.parameters(), lr=0.05, momentum=0.9),
    }
    sched = torch.optim.lr_scheduler.StepLR(optimizers["sgd"], step_size=1, gamma=0.5)
    trainer = ppe.engine.create_trainer(
        model,
        optimizers,
        3,
        device="cpu",
        logic=ppe.handler.Logic(options={"optimizers": ["adam", "sgd"]}),
        extensions=[E.LRScheduler(sched)],
    )
    trainer.run(regression_loader())

    torch.manual_seed(0)
    plain = TwoLayers()
    adam_, sgd = (
        torch.optim.Adam(plain.l1.parameters(), lr=0.01),
        torch.optim.SGD(plain.l2.parameters(), lr=0.05, momentum=0.9),
    )
    plain_sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    loader = regression_loader()
    for _ in range(3):
        for batch in loader:
            adam_.zero_grad()
            sgd.zero_grad()
            plain(**batch)["loss"].backward()
            adam_.step()
            sgd.step()
        plain_sched.step()
    same(model, plain)
    assert optimizers["sgd"].param_groups[0]["lr"] == sgd.param_groups[0]["lr"] == 0.05 / 8


# Scalers, schedulers, snapshots -----------------------------------------------------------


def scaled_gan_trainer(out: Path, stop: Any = None) -> Any:
    """A GAN whose optimizers have their own grad scaler and LR scheduler each."""
    torch.manual_seed(0)
    gan = ppe.to(GAN(), "cpu")
    opt_g, opt_d = adam(gan.gen, 2e-3), adam(gan.dis, 1e-3)
    scalers = {
        "gen": torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=4),
        "dis": torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3),
    }
    targets = {name: {**GAN_TARGETS[name], "grad_scaler": scalers[name]} for name in scalers}
    snapshot = ppe.training.ExtensionEntry(
        E.snapshot(autoload=True, filename="snapshot_{.iteration}"), trigger=(5, "iteration")
    )
    return ppe.engine.create_trainer(
        gan,
        {"gen": opt_g, "dis": opt_d},
        3,
        device="cpu",
        out_dir=str(out),
        options={"optimizers": targets},
        stop_trigger=stop,
        extensions=[
            ppe.training.ExtensionEntry(
                E.LRScheduler(torch.optim.lr_scheduler.ExponentialLR(opt_g, 0.9)),
                trigger=(1, "iteration"),
                name="lr/gen",
            ),
            ppe.training.ExtensionEntry(
                E.LRScheduler(torch.optim.lr_scheduler.StepLR(opt_d, 1, 0.5)), name="lr/dis"
            ),
            snapshot,
        ],
    )


def scaler_of(trainer: Any, name: str) -> torch.amp.GradScaler:
    scaler = trainer.handler.logic._targets[name].grad_scaler
    assert isinstance(scaler, torch.amp.GradScaler)
    return scaler


def test_each_optimizer_keeps_its_own_scaler_and_scheduler_and_a_mid_epoch_resume_is_exact(
    tmp_path: Path,
) -> None:
    straight = scaled_gan_trainer(tmp_path / "straight")
    straight.run(gan_loader())
    # The scalers grew apart (their own growth intervals) and the schedulers decayed apart.
    assert scaler_of(straight, "gen").get_scale() == 2.0**12 * 2 ** (18 // 4)
    assert scaler_of(straight, "dis").get_scale() == 2.0**8 * 2 ** (18 // 3)
    assert straight.optimizers["gen"].param_groups[0]["lr"] == pytest.approx(2e-3 * 0.9**18)
    assert straight.optimizers["dis"].param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**3)

    out = tmp_path / "run"
    first = scaled_gan_trainer(out, stop=(10, "iteration"))  # 6 iterations per epoch
    first.run(gan_loader())
    assert first.iteration == 10
    state = torch.load(out / "snapshot_10", weights_only=True)
    assert set(state["optimizers"]) == {"gen", "dis"}
    handler_state = state["_ppe_core"]["handler"]
    scales = {k: v["scale"] for k, v in handler_state["logic"]["grad_scalers"].items()}
    assert scales == {"gen": 2.0**12 * 4, "dis": 2.0**8 * 8}
    saved = {k: state["extensions"][k]["extension"]["scheduler"] for k in ("lr/gen", "lr/dis")}
    assert (saved["lr/gen"]["last_epoch"], saved["lr/dis"]["last_epoch"]) == (10, 1)

    resumed = scaled_gan_trainer(out)
    resumed.run(gan_loader())
    assert resumed.iteration == 18
    same(resumed.models["main"], straight.models["main"])
    for name in ("gen", "dis"):
        assert scaler_of(resumed, name).state_dict() == scaler_of(straight, name).state_dict()
        a, b = resumed.optimizers[name].state_dict(), straight.optimizers[name].state_dict()
        assert a["param_groups"] == b["param_groups"]
        for key, value in a["state"].items():
            for field, tensor in value.items():
                assert torch.equal(tensor, b["state"][key][field]), (name, key, field)


def test_the_scalers_scale_each_loss_and_unscale_each_optimizer() -> None:
    """With scalers, the update is the unscaled one: the same weights as without them."""
    trained, _ = run_gan(1)
    torch.manual_seed(0)
    gan = ppe.to(GAN(), "cpu")
    optimizers = {"gen": adam(gan.gen, 2e-3), "dis": adam(gan.dis, 1e-3)}
    targets = {
        name: {**GAN_TARGETS[name], "grad_scaler": torch.amp.GradScaler("cpu", init_scale=2.0**k)}
        for name, k in (("gen", 4), ("dis", 6))
    }
    trainer = ppe.engine.create_trainer(
        gan, optimizers, 1, device="cpu", options={"optimizers": targets}
    )
    trainer.run(gan_loader())
    same(gan, trained)  # powers of two scale and unscale exactly


# Errors -------------------------------------------------------------------------------------


def gan_trainer(targets: Any, **options: Any) -> Any:
    torch.manual_seed(0)
    gan = ppe.to(GAN(), "cpu")
    optimizers = {"gen": adam(gan.gen, 1e-3), "dis": adam(gan.dis, 1e-3)}
    return ppe.engine.create_trainer(
        gan, optimizers, 1, device="cpu", options={"optimizers": targets, **options}
    )


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (
            {"gen": {"loss": "g_loss"}, "disc": {"loss": "d_loss"}},
            "names ['disc'], but the trainer's optimizers are named ['dis', 'gen']",
        ),
        ({"gen": {"loss": "g_loss"}}, "optimizer(s) ['dis'] are not in option 'optimizers'"),
        (
            {"gen": {"model": "generator"}, "dis": {}},
            "steps the model 'generator', but the models are named ['main']",
        ),
        (
            {"gen": {"loss": "gen_loss"}, "dis": {"loss": "d_loss"}},
            "step on the loss 'gen_loss', but the model 'main' returns the outputs "
            "['d_loss', 'g_loss']",
        ),
    ],
)
def test_unknown_names_are_refused_naming_the_known_ones(targets: Any, message: str) -> None:
    trainer = gan_trainer(targets)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        trainer.run(gan_loader())


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ("gen", "must be a list of optimizer names or a dict of them"),
        ([], "names no optimizer"),
        ({"gen": "g_loss"}, "entry 'gen' must be a dict with the keys"),
        ({"gen": {"scheduler": 1}}, "unknown key(s) ['scheduler']"),
        ({"gen": {"loss": 3}}, "'loss' must be an output key"),
        ({"gen": {"model": ["main"]}}, "'model' must be a model name"),
        ({"gen": {"grad_scaler": 1.0}}, "'grad_scaler' must be a torch.amp.GradScaler"),
        ({1: {}}, "names optimizers by their trainer key"),
    ],
)
def test_malformed_option_is_refused_when_given(targets: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        ppe.handler.Logic(options={"optimizers": targets})


def test_an_optimizer_holding_none_of_its_models_parameters_is_refused() -> None:
    torch.manual_seed(0)
    gen, dis = generator(), discriminator()
    models = {"dis": ppe.to(DisStep(gen, dis), "cpu"), "gen": ppe.to(gen, "cpu")}
    optimizers = {"dis": adam(dis, 1e-3), "gen": adam(gen, 1e-3)}
    targets = {"dis": {"model": "gen", "loss": "d_loss"}, "gen": {"model": "gen"}}
    trainer = ppe.engine.create_trainer(
        models, optimizers, 1, device="cpu", options={"optimizers": targets}
    )
    with pytest.raises(ConfigurationError, match="'dis' holds none of the parameters of the model"):
        trainer.run(gan_loader())


def test_one_loss_with_two_scalers_and_a_backward_function_with_two_losses_are_refused() -> None:
    scalers = [torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")]
    two = {"gen": {"grad_scaler": scalers[0]}, "dis": {"grad_scaler": scalers[1]}}
    with pytest.raises(ConfigurationError, match=r"same loss .* different grad scalers"):
        gan_trainer(two).run(gan_loader())
    with pytest.raises(ConfigurationError, match="'backward_function' cannot be combined"):
        gan_trainer(GAN_TARGETS, backward_function=lambda t: t.backward()).run(gan_loader())


def test_a_loss_without_a_graph_is_refused() -> None:
    class Detached(GAN):
        def forward(self, real: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
            out = super().forward(real, z)
            return {**out, "g_loss": out["g_loss"].detach()}

    torch.manual_seed(0)
    gan = ppe.to(Detached(), "cpu")
    optimizers = {"gen": adam(gan.gen, 1e-3), "dis": adam(gan.dis, 1e-3)}
    trainer = ppe.engine.create_trainer(
        gan, optimizers, 1, device="cpu", options={"optimizers": GAN_TARGETS}
    )
    with pytest.raises(ModelOutputError, match=r"'g_loss' of the optimizer.*no graph"):
        trainer.run(gan_loader())


def test_closure_logic_refuses_several_optimizers() -> None:
    with pytest.raises(ConfigurationError, match="ClousureLogic steps one optimizer"):
        ppe.handler.ClousureLogic(options={"optimizers": ["a", "b"]})


def test_the_default_single_optimizer_path_is_unchanged_in_state_and_snapshots() -> None:
    logic = ppe.handler.Logic()
    assert logic._targets is None
    assert logic.state_dict() == {}
    scaler = torch.amp.GradScaler("cpu")
    assert set(ppe.handler.Logic(options={"grad_scaler": scaler}).state_dict()) == {"grad_scaler"}


# CodeBlockLogic: targeting by model_name (PPE #700) ---------------------------------------


def step_counter(optimizer: torch.optim.Optimizer) -> list[int]:
    calls: list[int] = []
    optimizer.register_step_post_hook(lambda *_: calls.append(1))
    return calls


def codeblock_run(options: dict[str, Any] | None = None) -> tuple[list[int], list[int], Any]:
    torch.manual_seed(0)
    main, other = ppe.to(TwoLayers(), "cpu"), ppe.to(TwoLayers(), "cpu")
    optimizers = {
        "main": torch.optim.SGD(main.parameters(), lr=0.1),
        "other": torch.optim.SGD(other.parameters(), lr=0.1),
    }
    counts = step_counter(optimizers["main"]), step_counter(optimizers["other"])
    for p in other.parameters():
        p.grad = torch.ones_like(p)  # CodeBlockLogic stepping "other" would zero these
    trainer = ppe.engine.create_trainer(
        {"main": main, "other": other},
        optimizers,
        1,
        device="cpu",
        logic=ppe.handler.CodeBlockLogic(options=options),
    )
    trainer.run(regression_loader())
    return counts[0], counts[1], other


def test_code_block_logic_steps_only_the_optimizers_of_its_model() -> None:
    main_steps, other_steps, other = codeblock_run()
    assert (len(main_steps), len(other_steps)) == (5, 0)  # PPE steps (and zeroes) both
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in other.parameters())


def test_code_block_logic_steps_several_optimizers_of_one_model_and_named_ones() -> None:
    torch.manual_seed(0)
    model = ppe.to(TwoLayers(), "cpu")
    optimizers = {
        "l1": torch.optim.SGD(model.l1.parameters(), lr=0.1),
        "l2": torch.optim.SGD(model.l2.parameters(), lr=0.1),
    }
    counts = [step_counter(o) for o in optimizers.values()]
    trainer = ppe.engine.create_trainer(
        model, optimizers, 1, device="cpu", logic=ppe.handler.CodeBlockLogic()
    )
    trainer.run(regression_loader())
    assert [len(c) for c in counts] == [5, 5]  # as PPE's #533: every optimizer of the model

    main_steps, other_steps, _ = codeblock_run({"optimizers": ["main"]})
    assert (len(main_steps), len(other_steps)) == (5, 0)
    with pytest.raises(ConfigurationError, match=re.escape("names ['nope'], but the trainer's")):
        codeblock_run({"optimizers": ["nope"]})
    with pytest.raises(ConfigurationError, match="hold none of the parameters of the model"):
        codeblock_run({"optimizers": ["other"]})
    with pytest.raises(ConfigurationError, match="must be a list of optimizer names"):
        ppe.handler.CodeBlockLogic(options={"optimizers": {"main": {}}})


# The example ----------------------------------------------------------------------------------


@pytest.fixture
def gan_example() -> Iterator[Callable[..., str]]:
    def run(cwd: Path, *args: str) -> str:
        return run_example(EXAMPLES / "train_gan.py", cwd, *args).stdout

    yield run


def test_train_gan_example_learns_the_target_and_resumes(
    tmp_path: Path, gan_example: Callable[..., str]
) -> None:
    out = tmp_path / "out"
    first = gan_example(tmp_path, "--out", str(out))
    match = re.search(r"^generated mean error: ([0-9.]+) \(epoch (\d+)\)$", first, re.M)
    assert match, first[-2000:]
    assert float(match.group(1)) < 0.5
    second = gan_example(tmp_path, "--out", str(out), "--epochs", str(int(match.group(2)) + 1))
    assert "resumed from" in second


def test_logic_state_round_trips_through_the_handler() -> None:
    trainer = gan_trainer(
        {name: {"grad_scaler": torch.amp.GradScaler("cpu", init_scale=8.0)} for name in ("gen",)}
        | {"dis": {"loss": "d_loss"}}
    )
    state = trainer.handler.state_dict()
    assert state == {"logic": {"grad_scalers": {"gen": state["logic"]["grad_scalers"]["gen"]}}}
    changed = copy.deepcopy(state)
    changed["logic"]["grad_scalers"]["gen"]["scale"] = 2.0
    trainer.handler.load_state_dict(changed)
    assert trainer.handler.logic._targets["gen"].grad_scaler.get_scale() == 2.0
