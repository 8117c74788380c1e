"""The declarative runtime-option spec and its validator, and the shared options' pieces
(ppe_core.runtime._option_specs, _shared_options)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping

import pytest
import torch

from ppe_core.errors import ArgumentTypeError, ConfigurationError, RuntimeOptionError
from ppe_core.runtime import OptionSpec, RuntimeOptions, RuntimeOptionTypeError, positive_int
from ppe_core.runtime._shared_options import (
    AutocastForward,
    BatchMover,
    device_autocast_kwargs,
    set_autocast_forward,
)

SPEC = RuntimeOptions(
    "DemoRuntime",
    OptionSpec("fast", (bool,), False, "Go fast."),
    OptionSpec("threads", (int,), None, "Threads.", "4", positive_int),
    OptionSpec("autocast", (bool, torch.dtype, Mapping), False, "Autocast.", "torch.bfloat16"),
)


def test_validate_fills_defaults_and_keeps_given_values() -> None:
    assert SPEC.validate(None) == {"fast": False, "threads": None, "autocast": False}
    assert SPEC.validate({"fast": True, "threads": 2}) == {
        "fast": True,
        "threads": 2,
        "autocast": False,
    }
    assert SPEC.validate({"threads": None})["threads"] is None  # None means "the default"
    assert SPEC.names == frozenset({"fast", "threads", "autocast"})


def test_unknown_option_names_it_and_lists_the_accepted_ones() -> None:
    with pytest.raises(RuntimeOptionError) as info:
        SPEC.validate({"fsat": True})
    message = str(info.value)
    assert "'fsat'" in message and "DemoRuntime" in message
    assert "fast (bool), threads (int), autocast (bool, torch.dtype or dict)" in message
    assert isinstance(info.value, ConfigurationError) and isinstance(info.value, ValueError)


def test_wrong_type_names_the_type_wanted_and_is_a_type_error() -> None:
    with pytest.raises(RuntimeOptionTypeError, match=r"'threads' must be int, got str '2'") as e:
        SPEC.validate({"threads": "2"})
    assert isinstance(e.value, TypeError) and isinstance(e.value, ArgumentTypeError)
    assert "options={'threads': 4}" in str(e.value)


def test_bool_is_not_accepted_as_an_int_unless_listed() -> None:
    with pytest.raises(TypeError, match="'threads' must be int, got bool True"):
        SPEC.validate({"threads": True})
    with pytest.raises(TypeError, match="'fast' must be bool, got int 1"):
        SPEC.validate({"fast": 1})


def test_check_rejects_values_with_the_problem_stated() -> None:
    with pytest.raises(RuntimeOptionError, match=r"'threads' must be >= 1, got 0"):
        SPEC.validate({"threads": 0})


def test_an_option_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        RuntimeOptions("X", OptionSpec("a", (bool,)), OptionSpec("a", (int,)))


def test_markdown_table_lists_every_option() -> None:
    table = SPEC.markdown_table().splitlines()
    assert table[0] == "| option | accepts | default | meaning |"
    assert table[2] == "| `fast` | bool | `False` | Go fast. |"
    assert len(table) == 2 + 3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, {"device_type": "cpu", "dtype": torch.bfloat16}),
        (torch.float16, {"device_type": "cpu", "dtype": torch.float16}),
        (
            {"cache_enabled": False},
            {"device_type": "cpu", "dtype": torch.bfloat16, "cache_enabled": False},
        ),
        ({"enabled": False}, None),
        (False, None),
        (None, None),
    ],
)
def test_autocast_forms_become_torch_autocast_kwargs(value: object, expected: object) -> None:
    assert device_autocast_kwargs(value, "cpu", torch.bfloat16, "R") == expected


def test_autocast_rejects_another_device_type_and_unsupported_dtypes() -> None:
    with pytest.raises(RuntimeOptionError, match=r"device_type='cuda'.*runs on 'cpu'"):
        device_autocast_kwargs({"device_type": "cuda"}, "cpu", torch.bfloat16, "R")
    with pytest.raises(
        RuntimeOptionError, match=r"torch\.bfloat16 or torch\.float16, got torch\.int8"
    ):
        device_autocast_kwargs(torch.int8, "cpu", torch.bfloat16, "R")


def test_autocast_forward_survives_deepcopy_and_pickle_and_can_be_removed() -> None:
    module = torch.nn.Linear(3, 2)
    set_autocast_forward(module, {"device_type": "cpu", "dtype": torch.bfloat16})
    assert module(torch.ones(1, 3)).dtype == torch.bfloat16
    assert sorted(module.state_dict()) == ["bias", "weight"]
    clone = copy.deepcopy(module)
    assert isinstance(clone.forward, AutocastForward) and clone.forward.module is clone
    loaded = pickle.loads(pickle.dumps(module))
    assert loaded(torch.ones(1, 3)).dtype == torch.bfloat16
    set_autocast_forward(module, None)
    assert "forward" not in module.__dict__
    assert module(torch.ones(1, 3)).dtype == torch.float32


def test_autocast_refuses_to_replace_a_user_instance_forward() -> None:
    module = torch.nn.Linear(3, 2)
    module.forward = lambda x: x  # type: ignore[method-assign]
    with pytest.raises(RuntimeOptionError, match="instance-level forward"):
        set_autocast_forward(module, {"device_type": "cpu", "dtype": torch.bfloat16})
    set_autocast_forward(module, None)  # nothing to remove: the user's forward is kept
    assert module(torch.ones(1)).shape == (1,)


def test_batch_mover_converts_only_4d_tensors_to_channels_last() -> None:
    move = BatchMover(torch.device("cpu"), non_blocking=True, channels_last=True)
    image = move(torch.ones(2, 3, 4, 5))
    assert image.is_contiguous(memory_format=torch.channels_last)
    assert not image.is_contiguous()
    flat = move(torch.ones(2, 3))
    assert flat.is_contiguous()
    plain = BatchMover(torch.device("cpu"), non_blocking=False, channels_last=False)
    assert plain(torch.ones(2, 3, 4, 5)).is_contiguous()
    assert pickle.loads(pickle.dumps(move)).channels_last


def test_the_docs_and_readme_option_tables_are_the_plugins_specs() -> None:
    from pathlib import Path

    from ppe_cpu import CPU_OPTIONS
    from ppe_cuda import CUDA_OPTIONS

    root = Path(__file__).parent.parent
    page = (root / "docs" / "runtimes.md").read_text()
    assert CPU_OPTIONS.markdown_table() in page
    assert CUDA_OPTIONS.markdown_table() in page
    # The plugins' READMEs show the same tables.
    assert CPU_OPTIONS.markdown_table() in (root / "plugins/ppe_cpu/README.md").read_text()
    assert CUDA_OPTIONS.markdown_table() in (root / "plugins/ppe_cuda/README.md").read_text()
