"""The one exception tree of vigil.

Every error a user can cause or meet is a ``VigilError``: tasks catch it, print its
message (which names the file, key, host and value, and the fix) and exit with its
``exit_code``. Anything else escaping is a bug in vigil, and a traceback is right then.
"""

from __future__ import annotations

from vigil.exitcodes import ExitCode


class VigilError(Exception):
    """Base of every error vigil reports to a user."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ConfigError(VigilError):
    """Bad input: inventory, profile, stack, template or flag. Nothing was touched."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        fix: str | None = None,
    ) -> None:
        where = ": ".join(part for part in (file, key) if part)
        super().__init__(f"{where}: {message}" if where else message, fix=fix)
        self.file = file
        self.key = key


class TemplateError(ConfigError):
    """A template could not be rendered (undefined variable, syntax error)."""


class RefusedError(VigilError):
    """A host's facts make the desired state impossible; nothing was changed there."""

    exit_code = ExitCode.BAD_INPUT


class HostError(VigilError):
    """Something went wrong on or on the way to one host."""

    def __init__(self, host: str, message: str, *, fix: str | None = None) -> None:
        super().__init__(f"{host}: {message}", fix=fix)
        self.host = host


class UnreachableError(HostError):
    """The host could not be reached or authenticated over SSH."""

    exit_code = ExitCode.UNREACHABLE


class PermissionDeniedError(HostError):
    """The connection works but the user may not do what the deploy needs."""


class CommandError(HostError):
    """A command on the host exited non-zero."""

    def __init__(
        self, host: str, command: str, exit_status: int, stderr: str, *, fix: str | None = None
    ) -> None:
        tail = stderr.strip().splitlines()[-5:]
        detail = ("\n    " + "\n    ".join(tail)) if tail else ""
        super().__init__(
            host, f"command failed (exit {exit_status}): {command[:200]}{detail}", fix=fix
        )
        self.command = command
        self.exit_status = exit_status
        self.stderr = stderr


class LockTimeoutError(HostError):
    """Another deploy holds the host's lock and did not release it in time."""


class InternalError(HostError):
    """A bug in vigil met while working on one host: that host fails, the others go on."""

    @classmethod
    def of(cls, host: str, exc: BaseException) -> InternalError:
        import traceback
        from pathlib import Path

        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return cls(host, f"internal error{where}: {type(exc).__name__}: {exc}",
                   fix="this is a bug in vigil; please report it with this message")


class LockLostError(HostError):
    """The deploy lock went with its connection while the deploy still needed it."""


class ServeError(HostError):
    """The service did not come up serving after the change."""
