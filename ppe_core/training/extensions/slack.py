"""PPE's path ``training.extensions.slack``: the Slack notification extensions."""

from __future__ import annotations

from ppe_core.training.extensions._slack import Slack, SlackWebhook, _slack_sdk_available

__all__ = ["Slack", "SlackWebhook", "_slack_sdk_available"]
