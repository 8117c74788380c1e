"""Gradient clipping, the Logic's ``grad_clip_norm`` / ``grad_clip_value`` options: each run
equals a hand-written PyTorch loop clipping at the same point, bit for bit (after unscaling,
once per accumulation window, per optimizer), and under torchrun (DDP, FSDP2) it equals one
process clipping the whole batch's gradient: the global norm, not one rank's or one shard's."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import launch

import ppe_core as ppe
from ppe_core.errors import ArgumentTypeError, ConfigurationError

F = torch.nn.functional
SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import grad_clipping_training as script  # noqa: E402  (the launched runs' model, data, reference)


class Net(torch.nn.Module):
    """Two layers (two optimizers can split them), both losses of the outputs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(3, 8)
        self.b = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.tanh(self.a(x))
        out = self.b(hidden)
        return {"loss": F.mse_loss(out, t), "l1": (out - t).abs().mean()}


def batches(n: int = 6) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {"x": torch.randn(4, 3, generator=g) * 3, "t": torch.randn(4, 1, generator=g) * 5}
        for _ in range(n)
    ]


def record_norms(keys: list[str]) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    """An extension keeping the given reported keys at every iteration (those reported)."""
    seen: list[dict[str, torch.Tensor]] = []

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def record(manager: Any) -> None:
        seen.append({k: manager.observation[k] for k in keys if k in manager.observation})

    return record, seen


def train(
    optimizer: Callable[[Any], torch.optim.Optimizer],
    options: dict[str, Any],
    keys: list[str] = ["train/grad_norm"],  # noqa: B006  (read only)
) -> tuple[Net, list[dict[str, torch.Tensor]]]:
    model = ppe.to(Net(), "cpu")
    record, seen = record_norms(keys)
    options = {"backward_outputs": "loss", **options}  # not l1, the second optimizer's loss
    trainer = ppe.engine.create_trainer(
        model, optimizer(model.parameters()), 1, options=options, extensions=[record]
    )
    trainer.run(batches())
    return model, seen


def assert_same(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, p), q in zip(
        model.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        assert torch.equal(p, q), name


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05),
    "adam": lambda params: torch.optim.Adam(params, lr=0.05),
}


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_norm_clipping_equals_a_raw_loop_with_clip_grad_norm(kind: str, norm_type: float) -> None:
    options = {"grad_clip_norm": 0.5, "grad_clip_norm_type": norm_type}
    model, seen = train(OPTIMIZERS[kind], options)
    reference = Net()
    optimizer = OPTIMIZERS[kind](reference.parameters())
    norms = []
    for batch in batches():
        optimizer.zero_grad()
        reference(**batch)["loss"].backward()
        norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5, norm_type))
        optimizer.step()
    assert min(norms) > 0.5  # every step was clipped: the comparison says something
    assert_same(model, reference)
    assert [entry["train/grad_norm"] for entry in seen] == norms


def test_value_clipping_equals_a_raw_loop_with_clip_grad_value() -> None:
    model, seen = train(OPTIMIZERS["sgd"], {"grad_clip_value": 0.2})
    reference = Net()
    optimizer = OPTIMIZERS["sgd"](reference.parameters())
    clamped = False
    for batch in batches():
        optimizer.zero_grad()
        reference(**batch)["loss"].backward()
        clamped |= any(bool((p.grad.abs() > 0.2).any()) for p in reference.parameters())
        torch.nn.utils.clip_grad_value_(reference.parameters(), 0.2)
        optimizer.step()
    assert clamped
    assert_same(model, reference)
    assert seen == [{}] * 6  # a value clips no norm: none is reported


def test_clipping_with_accumulation_clips_once_per_window() -> None:
    # 6 batches in windows of 4 and 2: clipped twice, on the window's summed gradients.
    options = {"grad_clip_norm": 0.5, "grad_accumulation_steps": 4}
    model, seen = train(OPTIMIZERS["adam"], options)
    reference = Net()
    optimizer = OPTIMIZERS["adam"](reference.parameters())
    norms = []
    for start, size in ((0, 4), (4, 2)):
        optimizer.zero_grad()
        for batch in batches()[start : start + size]:
            (reference(**batch)["loss"] / size).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5))
        optimizer.step()
    assert min(norms) > 0.5
    assert_same(model, reference)
    windows_end = [i for i, entry in enumerate(seen) if entry]
    assert windows_end == [3, 5] and all(list(e) == ["train/grad_norm"] for e in seen if e)
    assert [e["train/grad_norm"] for e in seen if e] == norms


def test_clipping_with_a_grad_scaler_clips_the_unscaled_gradients() -> None:
    def scaler() -> torch.amp.GradScaler:
        return torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)

    ours = scaler()
    options = {"grad_clip_norm": 0.5, "grad_scaler": ours}
    model, seen = train(OPTIMIZERS["sgd"], options)
    reference, theirs = Net(), scaler()
    optimizer = OPTIMIZERS["sgd"](reference.parameters())
    norms = []
    for batch in batches():
        optimizer.zero_grad()
        theirs.scale(reference(**batch)["loss"]).backward()
        theirs.unscale_(optimizer)
        norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5))
        theirs.step(optimizer)
        theirs.update()
    assert min(norms) > 0.5 and max(norms) < 1e3  # unscaled: the scale (>= 256) is gone
    assert_same(model, reference)
    assert ours.get_scale() == theirs.get_scale() == 2.0**11  # grown at steps 2, 4, 6
    assert [entry["train/grad_norm"] for entry in seen] == norms


def test_steps_the_grad_scaler_skips_stay_skipped_with_clipping() -> None:
    """A scale so large that the gradients overflow: the scaler skips those steps (found in
    ``unscale_``) and backs off, exactly as the raw loop; the norm reported is inf/NaN."""

    def scaler() -> torch.amp.GradScaler:
        return torch.amp.GradScaler("cpu", init_scale=2.0**127)

    ours = scaler()
    model, seen = train(OPTIMIZERS["adam"], {"grad_clip_norm": 0.5, "grad_scaler": ours})
    reference, theirs = Net(), scaler()
    optimizer = OPTIMIZERS["adam"](reference.parameters())
    norms = []
    for batch in batches():
        optimizer.zero_grad()
        theirs.scale(reference(**batch)["loss"]).backward()
        theirs.unscale_(optimizer)
        norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5))
        theirs.step(optimizer)
        theirs.update()
    assert not all(torch.isfinite(n) for n in norms)  # some steps were skipped
    assert ours.get_scale() == theirs.get_scale() < 2.0**127
    assert_same(model, reference)
    reported = torch.stack([entry["train/grad_norm"] for entry in seen])
    torch.testing.assert_close(reported, torch.stack(norms), rtol=0, atol=0, equal_nan=True)


def test_two_optimizers_are_clipped_each_with_its_own_limit() -> None:
    model = ppe.to(Net(), "cpu")
    opt_a = torch.optim.SGD(model.a.parameters(), lr=0.05)
    opt_b = torch.optim.Adam(model.b.parameters(), lr=0.05)
    record, seen = record_norms(["train/a/grad_norm", "train/b/grad_norm"])
    options = {
        "optimizers": {"a": {"loss": "loss"}, "b": {"loss": "l1"}},
        "grad_clip_norm": {"a": 0.3},
        "grad_clip_value": {"b": 0.1},
    }
    trainer = ppe.engine.create_trainer(
        model, {"a": opt_a, "b": opt_b}, 1, options=options, extensions=[record]
    )
    trainer.run(batches())
    reference = Net()
    ref_a = torch.optim.SGD(reference.a.parameters(), lr=0.05)
    ref_b = torch.optim.Adam(reference.b.parameters(), lr=0.05)
    norms = []
    for batch in batches():
        ref_a.zero_grad()
        ref_b.zero_grad()
        outputs = reference(**batch)
        a_params, b_params = list(reference.a.parameters()), list(reference.b.parameters())
        torch.autograd.backward([outputs["loss"]], inputs=a_params, retain_graph=True)
        torch.autograd.backward([outputs["l1"]], inputs=b_params)
        norms.append(torch.nn.utils.clip_grad_norm_(a_params, 0.3))
        ref_a.step()
        torch.nn.utils.clip_grad_value_(b_params, 0.1)
        ref_b.step()
    assert min(norms) > 0.3
    assert_same(model, reference)
    assert [entry["train/a/grad_norm"] for entry in seen] == norms
    assert all("train/b/grad_norm" not in entry for entry in seen)


BAD = {
    "negative": ({"grad_clip_norm": -1.0}, "'grad_clip_norm' must be a positive finite number"),
    "zero": ({"grad_clip_value": 0}, "'grad_clip_value' must be a positive finite number"),
    "nan": ({"grad_clip_norm": math.nan}, "positive finite number"),
    "bool": ({"grad_clip_norm": True}, "positive finite number .*, got True"),
    "str": ({"grad_clip_norm": "1.0"}, "positive finite number .*, got '1.0'"),
    "bad entry": (
        {"grad_clip_norm": {"main": -2}},
        "'grad_clip_norm', entry 'main', must be a positive",
    ),
    "empty dict": ({"grad_clip_value": {}}, "maps the trainer's optimizer names"),
    "unknown name": (
        {"grad_clip_norm": {"gen": 1.0}},
        r"names the optimizer\(s\) \['gen'\], but the Logic steps \['main'\]",
    ),
    "unknown target": (
        {"optimizers": ["gen", "dis"], "grad_clip_value": {"gan": 1.0}},
        r"\['gan'\], but the Logic steps \['gen', 'dis'\] \(its option 'optimizers'\)",
    ),
    "both": (
        {"grad_clip_norm": 1.0, "grad_clip_value": 0.5},
        r"both clip the optimizer\(s\) \['main'\]; give one per optimizer",
    ),
    "both on one": (
        {"optimizers": ["g", "d"], "grad_clip_norm": {"g": 1.0}, "grad_clip_value": 0.5},
        r"both clip the optimizer\(s\) \['g'\]",
    ),
    "norm type alone": ({"grad_clip_norm_type": 1.0}, "does nothing without 'grad_clip_norm'"),
    "norm type zero": (
        {"grad_clip_norm": 1.0, "grad_clip_norm_type": 0},
        "'grad_clip_norm_type' must be a positive number",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_clipping_options_are_refused_at_construction(case: str) -> None:
    options, match = BAD[case]
    with pytest.raises(ConfigurationError, match=match):
        ppe.handler.Logic(options=options)


def test_clipping_is_refused_by_closure_logic_and_lightnings_name_points_to_the_option() -> None:
    with pytest.raises(ConfigurationError, match="ClousureLogic cannot clip gradients"):
        ppe.handler.ClousureLogic(options={"grad_clip_norm": 1.0})
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ArgumentTypeError, match=r"gradient_clip_val.*options=\{'grad_clip_norm'"):
        ppe.engine.create_trainer(model, optimizer, 1, gradient_clip_val=1.0)


def test_a_base_logic_given_the_logic_options_is_told_to_subclass_logic() -> None:
    class Mine(ppe.handler.BaseLogic):
        def train_step(self, models: Any, optimizers: Any, batch_idx: int, batch: Any) -> Any:
            return models["main"](**batch)

    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    options = {"autocast": True, "grad_clip_norm": 1.0}
    match = (
        r"option\(s\) \['autocast', 'grad_clip_norm'\] are ppe.handler.Logic's, and Mine is not "
        r"a Logic subclass .* Subclass ppe.handler.Logic"
    )
    with pytest.raises(ConfigurationError, match=match):
        ppe.engine.create_trainer(model, optimizer, 1, logic=Mine(), options=options)


def test_clipping_code_runs_only_when_an_option_asks() -> None:
    """The default step gains no call: the clipping module is not entered without the
    options, and is with them."""
    import ppe_core.handler._clipping as clipping

    def entered(options: dict[str, Any]) -> int:
        model = ppe.to(Net(), "cpu")
        trainer = ppe.engine.create_trainer(
            model, torch.optim.SGD(model.parameters(), lr=0.1), 1, options=options
        )
        calls = []

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code.co_filename == clipping.__file__:
                calls.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            trainer.run(batches(2))
        finally:
            sys.setprofile(None)
        return len(calls)

    assert entered({}) == 0
    assert entered({"grad_clip_norm": 1.0}) >= 2  # clip, clip_norm: at each of 2 steps


# torchrun: DDP and FSDP2 --------------------------------------------------------------------
@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def launched(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp(request.param)
    code, stderr = launch(SCRIPTS / "grad_clipping_training.py", str(out), request.param)
    assert code == 0, stderr[-4000:]
    return request.param, [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def _max_difference(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> float:
    return max((weights[k] - v).abs().max().item() for k, v in model.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(script.RUNS))
def test_clipping_under_torchrun_equals_one_process_clipping_the_whole_batch(
    launched: Any, run: str
) -> None:
    kind, ranks = launched
    reference, norms = script.reference(run)
    unclipped, _ = script.reference(run, clip=False)
    assert _max_difference(unclipped.state_dict(), reference) > 1e-3  # clipping mattered
    for rank, result in enumerate(ranks):
        assert _max_difference(result[run]["weights"], reference) < 1e-6, (kind, rank)
        reported = result[run]["norms"]
        assert len(reported) == len(norms), (kind, rank)  # once per optimizer step, if a norm
        if norms:
            assert torch.allclose(torch.stack(reported), torch.stack(norms), atol=1e-5), rank
