"""Exceptions the CLI turns into one-line errors. Kept free of heavy imports (no torch)."""


class DivergenceError(RuntimeError):
    """Training produced a NaN/inf loss or weight; the message names the round and the client."""
