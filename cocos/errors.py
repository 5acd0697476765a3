"""One exception type for bad input: the CLI turns it into one line and exit code 2."""


class CocosError(ValueError):
    """Bad input from the user (missing or corrupt files, wrong shapes, NaN, unknown names).

    The message must be a single line that names the problem (and the file or
    batch where that helps). Library code raises it; ``cli`` prints it and exits 2.
    """
