"""Password hashes at argon2's cheapest parameters (argon2.profiles.CHEAPEST, meant for tests) in
the platforms the tests run: the same argon2id, made and checked the same way, in ~0.2 ms instead
of ~0.4 s on this machine's two cores. A platform hashes once at its start and at every sign-up,
and verifies at every login: minutes of the suite. A hash names its own parameters, so any
platform verifies any other's."""

from argon2 import PasswordHasher, profiles

from services.keys import service as keys_service


def cheapest() -> PasswordHasher:
    return PasswordHasher.from_parameters(profiles.CHEAPEST)


def use_cheapest_argon2() -> None:
    """From now on, in this process, the keys service hashes with `cheapest()`."""
    keys_service.PasswordHasher = cheapest  # type: ignore[assignment,misc]
