"""Wiring of the keys service."""

from services.runtime.component import Component, Runtime


def build(runtime: Runtime) -> Component:
    return Component(name="keys")
