"""``echo`` builds exactly the echo fields of the result that answers a request, for every member."""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract import MESSAGES, Lease, Member, decode_value, echo
from checkfu.contract import examples as ex
from checkfu.contract.members import Call

ECHO_FIELDS = ("target", "lease", "allocation_key", "instance_id")
ALLOCATING: set[Member] = {"provision", "clone", "resume"}
MEMBERS_WITH_A_CALL = [m for m, (request, _) in MESSAGES.items() if issubclass(request, Call)]


def example(name: str) -> dict[str, Any]:
    return ex.messages()[name][0]


def test_every_member_but_describe_takes_a_call() -> None:
    assert set(MESSAGES) - set(MEMBERS_WITH_A_CALL) == {"describe"}


@pytest.mark.parametrize("member", MEMBERS_WITH_A_CALL)
def test_echo_fills_the_echoes_of_the_example_result(member: Member) -> None:
    request_type, result_type = MESSAGES[member]
    request = decode_value(request_type, example(request_type.__name__))
    assert isinstance(request, Call)
    expected = decode_value(result_type, example(result_type.__name__))
    echoed = echo(request)
    rest = {name: getattr(expected, name) for name in result_type.model_fields if name not in echoed}
    assert result_type(**echo(request, **rest)) == expected


@pytest.mark.parametrize("member", MEMBERS_WITH_A_CALL)
def test_echo_leaves_out_only_what_the_request_cannot_know(member: Member) -> None:
    request_type, result_type = MESSAGES[member]
    request = decode_value(request_type, example(request_type.__name__))
    assert isinstance(request, Call)
    echoed = set(echo(request))
    wanted = {name for name in ECHO_FIELDS if name in result_type.model_fields}
    # A new instance's id is the provider's to choose: the caller passes it.
    missing = {"instance_id"} if member in ALLOCATING else set()
    assert echoed == wanted - missing


def test_fields_are_merged_last() -> None:
    request = decode_value(MESSAGES["inspect"][0], example("InspectRequest"))
    assert isinstance(request, Call)
    other = Lease(lease_id="lease-other", lease_epoch=9)
    out = echo(request, lease=other, state="active")
    assert out["lease"] == other and out["state"] == "active"
    assert out["instance_id"] == "i-42"
