"""One exception type for bad input: the CLI turns it into one line and exit code 2."""

import math


class CocosError(ValueError):
    """Bad input from the user (missing or corrupt files, wrong shapes, NaN, unknown names).

    The message must be a single line that names the problem (and the file or
    batch where that helps). Library code raises it; ``cli`` prints it and exits 2.
    """


def check_params(**params) -> None:
    """Validate the hyper-parameters shared by losses and counters (``None`` = default).

    ``margin`` finite; ``tau`` finite and > 0; ``eps`` finite and >= 0; ``lr`` finite and > 0.
    """
    for name, value in params.items():
        if value is None:
            continue
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise CocosError(f"{name} must be a number, got {value!r}") from None
        if not math.isfinite(value):
            raise CocosError(f"{name} must be finite, got {value}")
        if name in ("tau", "lr") and value <= 0:
            raise CocosError(f"{name} must be positive, got {value}")
        if name == "eps" and value < 0:
            raise CocosError(f"eps must be >= 0, got {value}")
