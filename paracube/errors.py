"""The one exception type for mistakes a user can make: the CLI prints it on one line, exit status 2."""


class ParacubeError(ValueError):
    """A bad value supplied by the user (name, file, size, layout). The message names the value and
    what would be valid."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ParacubeError(message)
