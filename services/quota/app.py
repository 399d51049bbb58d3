"""Wiring of the quota service."""

from services.runtime.component import Component, Runtime


def build(runtime: Runtime) -> Component:
    return Component(name="quota")
