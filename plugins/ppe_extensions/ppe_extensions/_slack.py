"""``Slack`` and ``SlackWebhook``: post training progress messages to Slack.

Both post a message when training starts, each time their trigger fires, when training
ends and when it fails. ``SlackWebhook`` needs only the standard library; ``Slack`` uses
``slack_sdk`` when it is installed (needed to upload files) and otherwise posts through
Slack's Web API with :mod:`urllib`. A failed post never stops training: it warns.
"""

from __future__ import annotations

import getpass
import importlib
import importlib.util
import json
import os
import shlex
import socket
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ppe_core.errors import OptionalDependencyError, SlackPostWarning, SlackTokenError
from ppe_core.training.extension import Extension, ManagerView
from ppe_core.training.triggers import Trigger, TriggerLike, get_trigger

__all__ = ["Slack", "SlackPostWarning", "SlackTokenError", "SlackWebhook"]

#: A message: a ``str.format`` template, or a callable ``(manager, context) -> str``.
MessageLike = str | Callable[[ManagerView, Any], str]
#: An error message: a template, or a callable ``(manager, exc, context) -> str``.
ErrorMessageLike = str | Callable[[ManagerView, BaseException, Any], str]
#: Files to upload: templates, or a callable ``(manager, context) -> list of paths``.
FilenamesLike = Sequence[str | os.PathLike[str]] | Callable[[ManagerView, Any], Sequence[str]]

_WEB_API = "https://slack.com/api/"

#: Whether ``slack_sdk`` is installed (PPE's flag); without it ``Slack`` posts through
#: urllib and cannot upload files.
_slack_sdk_available = importlib.util.find_spec("slack_sdk") is not None


def _safe(func: Callable[[], object]) -> str:
    try:
        return str(func())
    except Exception:
        return "UNKNOWN"


def _identity() -> str:
    return f"{_safe(getpass.getuser)}@{_safe(socket.gethostname)} [PID {os.getpid()}]"


def _default_msg(manager: ManagerView, context: Any) -> str:
    return f"Epoch #{manager.epoch}"


def _default_start_msg(manager: ManagerView, context: Any) -> str:
    command = " ".join(shlex.quote(arg) for arg in sys.argv)
    return f"\N{RUNNER} *Training started! {_identity()}*\nCommand: `{command}`"


def _default_end_msg(manager: ManagerView, context: Any) -> str:
    return f"\N{WHITE HEAVY CHECK MARK} *Training finished! {_identity()}*"


def _default_error_msg(manager: ManagerView, exc: BaseException, context: Any) -> str:
    frames = "".join(traceback.format_tb(exc.__traceback__)).strip()
    return (
        f"\N{CROSS MARK} *Error during training. {_identity()}*\n"
        f"{type(exc).__name__}: {exc}\nTraceback:\n```\n{frames}\n```"
    )


class _SlackBase(Extension):
    """Message formatting and the start/trigger/end/error events; subclasses post."""

    trigger: TriggerLike = (1, "epoch")

    def __init__(
        self,
        msg: MessageLike | None,
        start_msg: MessageLike | None,
        end_msg: MessageLike | None,
        error_msg: ErrorMessageLike | None,
        context: Any,
        filenames: FilenamesLike | None = None,
        upload_trigger: TriggerLike = None,
    ) -> None:
        self._msg = msg
        self._start_msg = start_msg
        self._end_msg = end_msg
        self._error_msg = error_msg
        self._context = context
        # A Path in the list names the file its str form does (templates included).
        self._filenames: Sequence[str] | Callable[[ManagerView, Any], Sequence[str]] | None = (
            [os.fspath(name) for name in filenames]
            if isinstance(filenames, Sequence) and not isinstance(filenames, str)
            else filenames
        )
        self._upload_trigger: Trigger | None = (
            None if upload_trigger is None else get_trigger(upload_trigger)
        )

    def _post_message(self, text: str) -> None:
        raise NotImplementedError

    def _upload_files(self, filenames: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def _format(
        self,
        msg: str | Callable[..., str],
        default: Callable[..., str] | None,
        manager: ManagerView,
        *args: Any,
        fields: Mapping[str, Any] | None = None,
    ) -> str:
        """A template sees ``manager``, ``context``, ``default`` and ``fields`` (the reported
        values when None); a callable message (and ``default``) gets ``(manager, *args,
        context)``."""
        if not isinstance(msg, str):
            return msg(manager, *args, self._context)
        default_text = "" if default is None else default(manager, *args, self._context)
        fields = manager.observation if fields is None else fields
        return msg.format(manager=manager, context=self._context, default=default_text, **fields)

    def __call__(self, manager: ManagerView) -> None:
        """Posts ``msg`` (and uploads ``filenames`` when their trigger fires)."""
        names: Sequence[str] = ()
        if callable(self._filenames):
            names = self._filenames(manager, self._context)
        elif isinstance(self._filenames, Sequence) and not isinstance(self._filenames, str):
            names = [self._format(name, None, manager) for name in self._filenames]
        upload = bool(names) and (self._upload_trigger is None or self._upload_trigger(manager))
        if self._msg is None and not upload:
            return
        text = "" if self._msg is None else self._format(self._msg, _default_msg, manager)
        if upload:
            text += "".join(f"<{link}| >" for link in self._upload_files(names))
        self._post_message(text)

    def initialize(self, manager: ManagerView) -> None:
        """Posts ``start_msg``."""
        if self._start_msg is not None:
            self._post_message(self._format(self._start_msg, _default_start_msg, manager))

    def finalize(self, manager: ManagerView) -> None:
        """Posts ``end_msg``."""
        if self._end_msg is not None:
            self._post_message(self._format(self._end_msg, _default_end_msg, manager))

    def on_error(
        self, manager: ManagerView, exc: BaseException, tb: types.TracebackType | None
    ) -> None:
        """Posts ``error_msg``; its template also sees ``{error}``."""
        if self._error_msg is not None:
            text = self._format(
                self._error_msg, _default_error_msg, manager, exc, fields={"error": exc}
            )
            self._post_message(text)


def _warn_failed(what: str, exc: Exception, detail: object) -> None:
    """Warns that a post or upload failed (training goes on), attributed to the code that
    called the extension's method that posted."""
    warnings.warn(
        f"{what} failed: {type(exc).__name__}: {exc} [{detail}]", SlackPostWarning, stacklevel=3
    )


def _post_json(url: str, payload: dict[str, Any], headers: dict[str, str]) -> Any:
    import urllib.request  # imported on first post: it pulls in http.client and ssl

    request = urllib.request.Request(
        url=url,
        data=json.dumps(payload).encode("utf-8"),
        method="POST",
        headers={"Content-Type": "application/json; charset=utf-8", **headers},
    )
    # Looked up at call time, so tests (and PPE's) can patch urllib.request.urlopen.
    return urllib.request.urlopen(request)


class _WebApiClient:
    """The calls :class:`Slack` makes of ``slack_sdk.WebClient``, through urllib, for when
    slack_sdk is not installed: messages are posted to Slack's Web API; files cannot be
    uploaded."""

    def __init__(self, token: str) -> None:
        self._token = token

    def chat_postMessage(self, channel: str, text: str, thread_ts: str | None) -> Any:
        payload: dict[str, Any] = {"channel": channel, "text": text}
        if thread_ts is not None:
            payload["thread_ts"] = thread_ts
        headers = {"Authorization": f"Bearer {self._token}"}
        with _post_json(_WEB_API + "chat.postMessage", payload, headers) as reply:
            return json.loads(reply.read().decode("utf-8"))

    def files_upload(self, file: str) -> Any:
        raise OptionalDependencyError("Slack file upload needs slack_sdk (`pip install slack_sdk`)")


class Slack(_SlackBase):
    """Posts messages (and uploads files) to a Slack channel as a bot.

    Messages are ``str.format`` templates that see ``manager``, ``context``, ``default``
    (the built-in message) and every reported value, or callables ``(manager, context)``
    (``(manager, exc, context)`` for ``error_msg``); None disables that message.

    Args:
        channel: Channel name or ID to post to.
        msg: Posted each time the trigger fires (once per epoch by default).
        start_msg: Posted when training starts.
        end_msg: Posted when training ends.
        error_msg: Posted when training raises; the template also sees ``{error}``.
        thread: Post every message after the first in the first message's thread.
        filenames: Files to upload with ``msg`` (templates like ``msg``, or a callable).
        upload_trigger: When to upload ``filenames``; at every call when None.
        context: Any object the messages need.
        token: Bot token; the ``SLACK_BOT_TOKEN`` environment variable when None.

    Raises:
        SlackTokenError: No token was given or found (a ``RuntimeError``, as in PPE).
    """

    def __init__(
        self,
        channel: str,
        msg: MessageLike | None = None,
        *,
        start_msg: MessageLike | None = "{default}",
        end_msg: MessageLike | None = "{default}",
        error_msg: ErrorMessageLike | None = "{default}",
        thread: bool = True,
        filenames: FilenamesLike | None = None,
        upload_trigger: TriggerLike = None,
        context: Any = None,
        token: str | None = None,
    ) -> None:
        super().__init__(msg, start_msg, end_msg, error_msg, context, filenames, upload_trigger)
        token = token if token is not None else os.environ.get("SLACK_BOT_TOKEN")
        if not token:
            raise SlackTokenError(
                "A bot `token` is needed for communicating with Slack; pass token=... or set "
                "the SLACK_BOT_TOKEN environment variable"
            )
        self._channel = channel
        self._thread = thread
        self._thread_ts: str | None = None
        self._token = token
        self._client: Any = (
            importlib.import_module("slack_sdk").WebClient(token=token)
            if _slack_sdk_available
            else _WebApiClient(token)
        )

    def _post_message(self, text: str) -> None:
        try:
            response = self._client.chat_postMessage(
                channel=self._channel, text=text, thread_ts=self._thread_ts
            )
            if not response.get("ok"):
                raise RuntimeError(f"Slack answered {response.get('error', response)!r}")
            if self._thread and self._thread_ts is None:
                self._thread_ts = response.get("ts")
        except Exception as exc:
            _warn_failed("Slack post", exc, text)

    def _upload_files(self, filenames: Sequence[str]) -> list[str]:
        links: list[str] = []
        try:
            for filename in filenames:
                response = self._client.files_upload(file=filename)
                links.append(response["file"]["permalink"])
        except Exception as exc:
            _warn_failed("Slack upload", exc, list(filenames))
        return links


class SlackWebhook(_SlackBase):
    """Posts messages to Slack through an incoming-webhook URL (standard library only).

    The messages follow the same rules as :class:`Slack`'s.

    Args:
        url: The incoming webhook URL.
        msg: Posted each time the trigger fires (once per epoch by default).
        start_msg: Posted when training starts.
        end_msg: Posted when training ends.
        error_msg: Posted when training raises.
        context: Any object the messages need.
    """

    def __init__(
        self,
        url: str,
        msg: MessageLike | None = None,
        *,
        start_msg: MessageLike | None = "{default}",
        end_msg: MessageLike | None = "{default}",
        error_msg: ErrorMessageLike | None = "{default}",
        context: Any = None,
    ) -> None:
        super().__init__(msg, start_msg, end_msg, error_msg, context)
        self._url = url

    def _post_message(self, text: str) -> None:
        try:
            with _post_json(self._url, {"text": text}, {}) as response:
                status = response.status
            if not 200 <= status < 300:
                raise RuntimeError(f"HTTP status {status}")
        except Exception as exc:
            _warn_failed("Slack webhook request", exc, text)
