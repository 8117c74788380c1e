"""``ppe.config`` behaves as PPE 0.9's on the same trees and files.

Each test runs the same config through ``pytorch_pfn_extras.config`` and ``ppe_core.config``
and compares resolved values, the objects built (types, weights on the same seed, sharing),
how often each type is called, and the builtin exception raised on bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytorch_pfn_extras.config as ppe_config
import torch
import yaml

import ppe_core.config as core_config
from ppe_core.errors import (
    ConfigCycleError,
    ConfigKeyError,
    ConfigurationError,
    OptionalDependencyError,
    PPEError,
)

BOTH = [ppe_config, core_config]
IDS = ["ppe", "core"]


def _types(module: Any, calls: list[str] | None = None) -> dict[str, Callable[..., Any]]:
    """Real PyTorch types, with an optimizer factory that finds its model by a default."""

    @module.customize_type(model="/model")
    def sgd(model: torch.nn.Module, lr: float) -> torch.optim.SGD:
        if calls is not None:
            calls.append("sgd")
        return torch.optim.SGD(model.parameters(), lr=lr)

    def linear(**kwargs: Any) -> torch.nn.Linear:
        if calls is not None:
            calls.append("linear")
        return torch.nn.Linear(**kwargs)

    return {"Linear": linear, "SGD": sgd, "Dropout": torch.nn.Dropout}


TREE: dict[str, Any] = {
    "width": 4,
    "model": {"type": "Linear", "in_features": "@/width", "out_features": 3},
    "optimizer": {"type": "SGD", "lr": 0.5},
    "dropout": {"type": "Dropout", "p": "@../rates/1"},
    "rates": [0.1, 0.25],
    "nested": {"a": {"b": "@../c", "raw": "@!/model"}, "c": ["@/width", "x"]},
    "fan_in": "@/model.in_features",
    "rows": "@/model.weight.shape.0",
    "plain": {"k": 1, "v": "@k"},
}


@pytest.mark.parametrize("module", BOTH, ids=IDS)
def test_resolved_values_and_built_objects_match_ppe(module: Any) -> None:
    torch.manual_seed(0)
    config = module.Config(TREE, _types(module))
    assert config["/width"] == 4
    assert config["/fan_in"] == 4 and config["/rows"] == 3
    assert config["/nested/a/b"] == [4, "x"]  # relative '..', a list with a reference inside
    assert config["nested/c/0"] == 4  # a key without a leading '/' starts at the root
    assert config["/nested/a/raw"] == TREE["model"]  # '!': the raw dict, not the module
    assert config["!/dropout/p"] == "@../rates/1"
    assert config["/plain"] == {"k": 1, "v": 1}
    model, optimizer, dropout = config["/model"], config["/optimizer"], config["/dropout"]
    assert type(model) is torch.nn.Linear and type(dropout) is torch.nn.Dropout
    assert dropout.p == 0.25
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["lr"] == 0.5
    # Built once: the optimizer holds the very parameters of the model the config returns.
    assert optimizer.param_groups[0]["params"][0] is model.weight
    assert config["/model"] is model


def test_same_weights_as_ppe_on_the_same_seed() -> None:
    built = []
    for module in BOTH:
        torch.manual_seed(7)
        built.append(module.Config(TREE, _types(module))["/model"].state_dict())
    assert built[0].keys() == built[1].keys()
    for key in built[0]:
        assert torch.equal(built[0][key], built[1][key])


def test_evaluation_is_lazy_and_each_object_is_built_once_as_in_ppe() -> None:
    log: dict[str, list[str]] = {}
    for name, module in zip(IDS, BOTH, strict=True):
        calls: list[str] = []
        config = module.Config(TREE, _types(module, calls))
        assert config["/width"] == 4
        assert calls == []  # reading a scalar builds nothing
        config["/optimizer"]  # builds the model through the customize_type default
        config["/model"]
        config["/rows"]
        log[name] = calls
    assert log["core"] == log["ppe"] == ["linear", "sgd"]


def test_customize_type_defaults_are_shared_with_ppe_and_explicit_keys_win() -> None:
    tree = {
        "model": {"type": "Linear", "in_features": 2, "out_features": 2},
        "other": {"type": "Linear", "in_features": 5, "out_features": 1},
        "default": {"type": "SGD", "lr": 0.1},
        "explicit": {"type": "SGD", "lr": 0.1, "model": "@/other"},
    }
    # A type decorated with PPE's customize_type keeps its default in ppe-core, and back.
    for decorate_with, run_with in [(ppe_config, core_config), (core_config, ppe_config)]:
        config = run_with.Config(tree, _types(decorate_with))
        default, explicit = config["/default"], config["/explicit"]
        assert default.param_groups[0]["params"][0] is config["/model"].weight
        assert explicit.param_groups[0]["params"][0] is config["/other"].weight


def _write_files(tmp_path: Path, dump: Callable[[Any], str], suffix: str) -> Path:
    (tmp_path / "sub").mkdir()
    base = {"model": {"type": "Linear", "in_features": 3, "out_features": 1}, "lr": 0.1}
    (tmp_path / "sub" / f"base{suffix}").write_text(dump(base))
    main = {
        "train": {"import": f"sub/base{suffix}", "lr": 0.01, "model/out_features": 2},
        "optimizer": {"type": "SGD", "lr": "@/train/lr", "model": "@/train/model"},
    }
    path = tmp_path / f"main{suffix}"
    path.write_text(dump(main))
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_load_path_expands_imports_with_overrides_as_ppe(tmp_path: Path, suffix: str) -> None:
    dump: Callable[[Any], str] = json.dumps if suffix == ".json" else yaml.safe_dump
    path = _write_files(tmp_path, dump, suffix)
    # PPE reads JSON unless given a loader; ppe-core picks YAML by the suffix.
    ppe_loader = None if suffix == ".json" else _yaml_file
    ppe = ppe_config.Config.load_path(str(path), loader=ppe_loader, types=_types(ppe_config))
    core = core_config.Config.load_path(str(path), types=_types(core_config))
    assert core["!/train"] == ppe["!/train"]
    assert core["!/train"]["model"]["out_features"] == 2 and core["/train/lr"] == 0.01
    assert core["/optimizer"].param_groups[0]["lr"] == ppe["/optimizer"].param_groups[0]["lr"]
    assert core["/train/model"].weight.shape == ppe["/train/model"].weight.shape == (2, 3)


def test_load_path_accepts_a_loader_as_ppe(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("a: 1\nb: '@/a'\n")
    for module in BOTH:
        assert module.Config.load_path(str(path), loader=_yaml_file)["/b"] == 1


def _yaml_file(path: str) -> Any:
    with open(path) as f:
        return yaml.safe_load(f)


def test_yaml_without_pyyaml_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(OptionalDependencyError, match=r"ppe-core\[yaml\]"):
        core_config.Config.load_path(str(path))


def test_import_ppe_core_does_not_load_the_config_package_or_yaml() -> None:
    code = (
        "import sys, ppe_core as ppe\n"
        "assert 'ppe_core.config' not in sys.modules and 'yaml' not in sys.modules\n"
        "ppe.config.Config({})\n"
        "assert 'ppe_core.config' in sys.modules and 'yaml' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# Bad input: (tree, key, the builtin PPE lets through, words in ppe-core's message).
BAD: list[tuple[Any, str, type[BaseException], str]] = [
    ({"a": "@/b", "b": "@/a"}, "/a", RuntimeError, "/a -> /b -> /a"),
    ({"a": {"x": "@y", "y": "@x"}}, "/a", RuntimeError, "circular"),
    ({"a": 1}, "/missing", KeyError, "'missing' not in /"),
    ({"a": "@/b/c", "b": {"d": 1}}, "/a", KeyError, "keys: 'd'"),
    ({"a": [1, 2]}, "/a/5", IndexError, "a list of 2"),
    ({"a": 3}, "/a/b", TypeError, "has no keys"),
    ({"a": {"type": "Nope"}}, "/a", KeyError, "'Nope'"),
    ({"a": {"type": "Linear", "in_features": 1, "out_features": 1}}, "/a.nope", TypeError, "nope"),
    ({"a": {"k": 1}}, "/a.z", KeyError, "neither an attribute"),
]


@pytest.mark.parametrize(("tree", "key", "builtin", "words"), BAD)
def test_bad_input_raises_the_builtin_ppe_raises(
    tree: Any, key: str, builtin: type[BaseException], words: str
) -> None:
    with pytest.raises(builtin):
        ppe_config.Config(tree, _types(ppe_config))[key]
    with pytest.raises(builtin, match=words) as info:
        core_config.Config(tree, _types(core_config))[key]
    assert isinstance(info.value, PPEError)
    expected = ConfigCycleError if builtin is RuntimeError else ConfigKeyError
    assert isinstance(info.value, expected)


def test_an_error_in_a_users_type_keeps_its_class_as_in_ppe() -> None:
    tree = {"a": {"type": "Linear", "in_features": -1, "out_features": 1}}
    for module in BOTH:
        with pytest.raises(RuntimeError, match="negative dimension"):
            module.Config(tree, _types(module))["/a"]


def test_circular_import_raises_runtime_error_as_ppe(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"x": {"import": "b.json"}}))
    (tmp_path / "b.json").write_text(json.dumps({"y": {"import": "a.json"}}))
    with pytest.raises(RuntimeError):
        ppe_config.Config.load_path(str(tmp_path / "a.json"))
    with pytest.raises(ConfigCycleError, match=r"circular import .*a\.json"):
        core_config.Config.load_path(str(tmp_path / "a.json"))


def test_override_of_a_missing_imported_key_raises_key_error_as_ppe(tmp_path: Path) -> None:
    (tmp_path / "base.json").write_text(json.dumps({"model": {"units": 1}}))
    (tmp_path / "main.json").write_text(
        json.dumps({"m": {"import": "base.json", "nothing/units": 2}})
    )
    with pytest.raises(KeyError):
        ppe_config.Config.load_path(str(tmp_path / "main.json"))
    with pytest.raises(ConfigKeyError, match=r"/nothing/units not in .*base\.json"):
        core_config.Config.load_path(str(tmp_path / "main.json"))


@pytest.mark.parametrize("module", BOTH, ids=IDS)
def test_update_via_args_matches_ppe(module: Any) -> None:
    tree = {"lr": 0.1, "epochs": 3, "flag": True, "late": 1, "use": "@/late"}
    config = module.Config(tree)
    assert (config["/lr"], config["/epochs"], config["/flag"]) == (0.1, 3, True)
    config.update_via_args([("/lr", "0.5"), ("/epochs", "7"), ("/flag", "FALSE"), ("/late", 9)])
    # Evaluated keys keep their type; a key not read yet takes the value as given, and
    # references to it see the new value.
    assert (config["/lr"], config["/epochs"], config["/flag"]) == (0.5, 7, False)
    assert config["/use"] == 9
    with pytest.raises(ValueError, match="true"):
        config.update_via_args([("/flag", "yes")])


@pytest.mark.parametrize(
    ("tree", "key", "words"),
    [
        ({"a": {"b": "@../../x"}}, "/a/b", "above the root"),
        ({"a": {"b": 1}}, "!/a.b", "raw"),
    ],
)
def test_keys_ppe_rejects_with_assertion_error_raise_config_key_error(
    tree: Any, key: str, words: str
) -> None:
    with pytest.raises(AssertionError):
        ppe_config.Config(tree)[key]
    with pytest.raises(ConfigKeyError, match=words):
        core_config.Config(tree)[key]


def test_an_absolute_key_beside_import_raises_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "base.json").write_text(json.dumps({"units": 1}))
    (tmp_path / "main.json").write_text(json.dumps({"import": "base.json", "/units": 2}))
    with pytest.raises(AssertionError):
        ppe_config.Config.load_path(str(tmp_path / "main.json"))
    with pytest.raises(ConfigurationError, match="relative key path"):
        core_config.Config.load_path(str(tmp_path / "main.json"))


TRAINING_YAML = """\
seed: 3
model: {type: Linear, in_features: 4, out_features: 2}
optimizer: {type: SGD, lr: 0.05}
manager: {type: Manager, max_epochs: 2, iters_per_epoch: 5}
"""


def _yaml_driven_training(ppe: Any, path: str) -> dict[str, torch.Tensor]:
    """A YAML-driven training script as PPE users write it; only ``ppe`` differs."""

    @ppe.config.customize_type(model="/model")
    def sgd(model: torch.nn.Module, lr: float) -> torch.optim.SGD:
        return torch.optim.SGD(model.parameters(), lr=lr)

    @ppe.config.customize_type(model="/model", optimizer="/optimizer")
    def manager(model: Any, optimizer: Any, max_epochs: int, iters_per_epoch: int) -> Any:
        return ppe.training.ExtensionsManager(
            {"main": model}, {"main": optimizer}, max_epochs, iters_per_epoch=iters_per_epoch
        )

    config = ppe.config.Config.load_path(
        path, loader=_yaml_file, types={"Linear": torch.nn.Linear, "SGD": sgd, "Manager": manager}
    )
    torch.manual_seed(config["/seed"])
    trainer = config["/manager"]  # builds the model, then the optimizer, then the manager
    model = config["/model"]
    data = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    target = torch.randn(10, 2, generator=torch.Generator().manual_seed(2))
    while not trainer.stop_trigger:
        for i in range(0, 10, 2):
            with trainer.run_iteration(step_optimizers=["main"]):
                loss = torch.nn.functional.mse_loss(model(data[i : i + 2]), target[i : i + 2])
                ppe.reporting.report({"loss": loss.item()})
                loss.backward()
    assert trainer.iteration == 10
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_yaml_driven_training_script_trains_bit_identically_with_either_import(
    tmp_path: Path,
) -> None:
    import pytorch_pfn_extras

    import ppe_core

    path = tmp_path / "train.yaml"
    path.write_text(TRAINING_YAML)
    ppe_weights = _yaml_driven_training(pytorch_pfn_extras, str(path))
    core_weights = _yaml_driven_training(ppe_core, str(path))
    assert ppe_weights.keys() == core_weights.keys()
    for key in ppe_weights:
        assert torch.equal(ppe_weights[key], core_weights[key]), key
