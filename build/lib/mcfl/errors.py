"""Exceptions the CLI turns into one-line errors. Kept free of heavy imports (no torch)."""


#: what a divergence message advises
REMEDY = "lower the learning rate or clip gradients (train.max_grad_norm)"


class DivergenceError(RuntimeError):
    """Training produced a NaN/inf loss or weight; the message names the round and the client."""

    @classmethod
    def local(cls, rnd: int, client: int, mean_loss: float) -> "DivergenceError":
        return cls(f"round {rnd}, client {client}: local training diverged (mean loss {mean_loss}); "
                   f"{REMEDY}")
