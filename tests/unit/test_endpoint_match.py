"""An endpoint given as the address of a second interface names this host (torch alone says no)."""

from __future__ import annotations

from trainguard.torch_api.endpoint import names_this_host


def test_an_address_of_any_interface_names_this_host() -> None:
    local = {"10.0.0.5", "192.168.7.2", "127.0.0.1", "fe80::1"}
    assert names_this_host("192.168.7.2", local)
    assert names_this_host("10.0.0.5", local)
    assert not names_this_host("10.0.0.6", local)


def test_loopback_and_unresolvable_names_are_left_to_torch() -> None:
    local = {"127.0.0.1"}
    assert not names_this_host("127.0.0.1", local)  # torch already answers yes for loopback, with its fallback
    assert not names_this_host("no-such-host.invalid", local)
