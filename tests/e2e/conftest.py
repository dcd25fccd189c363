"""Fixtures shared by the e2e suites that start the real stack (each module defines ``stack``)."""

from __future__ import annotations

import pytest

import stack_harness as sh


@pytest.fixture(scope="module")
def router(stack):
    """A Router client on the module's stack."""
    with sh.router_stub(stack) as stub:
        yield stub
