"""One exception type for everything a user can get wrong; the CLI and the app show its message."""


class UserError(ValueError):
    """Bad input or a missing resource, with a message meant for the user (no traceback)."""

    def about(self, what: str) -> "UserError":
        """The same error said of `what`: "Cannot read trace x.json: its JSON ..." (a reader that
        does not know where its input came from speaks of it as "it"; its caller names it)."""
        msg = str(self)
        return UserError(f"{what}: {msg[:1].lower()}{msg[1:]}")


def check(cond: bool, message: str) -> None:
    if not cond:
        raise UserError(message)
