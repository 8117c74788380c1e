"""PPE's path ``training.extensions.slack``: the Slack notification extensions."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Slack", "SlackWebhook", "_slack_sdk_available"]

if TYPE_CHECKING:  # for type checkers only: at run time ppe-extensions provides these
    from ppe_extensions._slack import Slack, SlackWebhook, _slack_sdk_available
else:
    from ppe_core._faces import forward

    __getattr__, __dir__ = forward(__name__, __all__)
