"""One exception type for everything a user can get wrong; the CLI and the app show its message."""


class UserError(ValueError):
    """Bad input or a missing resource, with a message meant for the user (no traceback)."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise UserError(message)
