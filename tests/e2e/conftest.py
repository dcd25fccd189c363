"""Fixtures shared by the e2e suites: ``router`` (a Router client on the module's own ``stack``) and,
for the openai-client suites, ``s``: the frontend in front of the scripted router double and then in
front of the real stack (one of each per module), reset before each test."""

from __future__ import annotations

import pytest

import frontend_harness as fh
import stack_harness as sh


@pytest.fixture(scope="module")
def router(stack):
    """A Router client on the module's stack."""
    with sh.router_stub(stack) as stub:
        yield stub


@pytest.fixture(scope="module", params=["scripted", "stack"])
def client_stack(request, tmp_path_factory):
    with fh.client_stack(request.param, tmp_path_factory, request.getfixturevalue("make_ckpt")) as st:
        yield st


@pytest.fixture
def s(client_stack):
    client_stack.router.reset()
    return client_stack
