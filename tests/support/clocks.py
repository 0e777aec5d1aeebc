"""A clock the test moves by hand (``t``), for the seams that take a ``clock``."""


class Stepped:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t
