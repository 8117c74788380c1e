"""The per-step fast paths keep the general paths' behaviour.

Each training step takes shortcuts (a shallow batch copy when every tensor is already on the
CPU, cached ``train/<key>`` names, a loop choosing the tensors to backpropagate); these tests
pin what those shortcuts must not change, on real models and optimizers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import ppe_core as ppe

F = torch.nn.functional


def _batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"x": torch.randn(4, 3, generator=g), "t": torch.randn(4, 1, generator=g)} for _ in range(n)
    ]


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.mse_loss(self.fc(x), t)}


def test_cpu_convert_batch_returns_a_new_dict_holding_the_same_tensors() -> None:
    runtime = ppe.runtime.PyTorchRuntime("cpu", {})
    batch = _batches(1)[0]
    out = runtime.convert_batch(batch)
    assert out == batch and out is not batch
    assert all(out[k] is batch[k] for k in batch)  # nothing copied or moved
    out.pop("t")  # a logic that consumes keys must not change the loader's batch
    assert set(batch) == {"x", "t"}


def test_cpu_convert_batch_still_maps_nested_and_non_tensor_values() -> None:
    class Tagging(ppe.runtime.PyTorchRuntime):
        def move_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor + 1  # visible: proves the general path ran

    plain = ppe.runtime.PyTorchRuntime("cpu", {})
    batch = {"x": torch.zeros(2), "pair": [torch.zeros(1), "label"], "n": 3}
    out = plain.convert_batch(batch)
    assert out["pair"][1] == "label" and out["n"] == 3 and out["x"] is batch["x"]
    tagged = Tagging("cpu", {}).convert_batch(batch)
    assert tagged["x"].tolist() == [1.0, 1.0] and tagged["pair"][0].tolist() == [1.0]
    param = torch.nn.Parameter(torch.zeros(1))  # a Tensor subclass: the general path
    assert plain.convert_batch({"p": param})["p"] is param


def test_a_logic_that_pops_batch_keys_trains_several_epochs_on_cached_batches() -> None:
    class PopTarget(ppe.handler.Logic):
        def train_step(
            self, models: Mapping[str, torch.nn.Module], optimizers: Any, batch_idx: int, batch: Any
        ) -> Any:
            target = batch.pop("t")
            optimizers["main"].zero_grad()
            loss = F.mse_loss(models["main"].fc(batch["x"]), target)
            loss.backward()
            return {"loss": loss}

    model = ppe.to(Regressor(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = _batches()
    trainer = ppe.engine.create_trainer(model, opt, 3, logic=PopTarget())
    trainer.run(data)
    assert trainer.manager.iteration == 12
    assert all(set(b) == {"x", "t"} for b in data)


def test_reported_names_follow_ever_new_output_keys() -> None:
    """Output keys that change every step (past the name cache's bound) are reported right."""

    class Changing(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            self.step += 1
            loss = F.mse_loss(self.fc(x), t)
            return {"loss": loss, f"k{self.step}": loss.detach() * 0 + self.step}

    model = ppe.to(Changing(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(model, opt, 1)
    seen: dict[int, Mapping[str, Any]] = {}
    trainer.extend(
        lambda m: seen.update({m.iteration: dict(m.observation)}), trigger=(1, "iteration")
    )
    trainer.run(_batches(1100), train_len=1100)
    for step in (1, 1024, 1025, 1100):
        obs = seen[step]
        assert set(obs) == {"train/loss", f"train/k{step}"}
        assert float(obs[f"train/k{step}"]) == step


def test_only_graph_outputs_are_backpropagated_not_leaf_scalars() -> None:
    """A 0-dim parameter returned beside the loss is a leaf: reported, never backpropagated."""

    class WithLeaf(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.temperature = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": F.mse_loss(self.fc(x), t), "temperature": self.temperature}

    model = ppe.to(WithLeaf(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.fc.weight.detach().clone()
    trainer = ppe.engine.create_trainer(model, opt, 1)
    reported: list[float] = []
    trainer.extend(
        lambda m: reported.append(float(m.observation["train/temperature"])),
        trigger=(1, "iteration"),
    )
    trainer.run(_batches())
    assert model.temperature.grad is None  # a leaf output adds nothing to backward
    assert not torch.equal(model.fc.weight, before)  # the loss was backpropagated
    assert reported == [2.0] * 4


class ReportingRegressor(Regressor):
    """Also reports a value from ``forward``, as models do during evaluation."""

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().forward(x, t)
        ppe.reporting.report({"val/abs_err": (self.fc(x) - t).abs().mean()})
        return out


def test_evaluator_inline_path_gives_the_callback_paths_means() -> None:
    """No metrics: the Handler reports inside eval_step; a metric forces PPE's callback path."""
    model = ppe.to(ReportingRegressor(), "cpu")
    data = _batches(5)
    data.append({"x": data[0]["x"][:1], "t": data[0]["t"][:1]})  # a short last batch
    inline = ppe.engine.create_evaluator(model).run(data)
    callback = ppe.engine.create_evaluator(model, metrics=[lambda batch, out: {}]).run(data)
    assert set(inline) == {"val/loss", "val/abs_err"}
    assert {k: float(v) for k, v in inline.items()} == {k: float(v) for k, v in callback.items()}
    weights = [len(b["t"]) for b in data]
    with torch.no_grad():
        losses = [float(model(**b)["loss"]) for b in data]
    expected = sum(w * v for w, v in zip(weights, losses, strict=True)) / sum(weights)
    assert abs(float(inline["val/loss"]) - expected) < 1e-6


def test_evaluator_calls_an_overridden_eval_post_step_per_batch() -> None:
    calls: list[int] = []

    class Counting(ppe.handler.Handler):
        def eval_post_step(self, evaluator: Any, batch_idx: int, batch: Any, outputs: Any) -> None:
            calls.append(batch_idx)
            super().eval_post_step(evaluator, batch_idx, batch, outputs)

    model = ppe.to(Regressor(), "cpu")
    evaluator = ppe.engine.create_evaluator(model, handler_class=Counting)
    means = evaluator.run(_batches(3))
    assert calls == [0, 1, 2] and set(means) == {"val/loss"}
